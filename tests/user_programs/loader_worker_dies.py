"""A DataLoader worker process dies in the middle of a minibatch.

Every rank reads its batches through a ``DataLoader`` with two worker
processes (each batch is a pure function of minibatch and rank, and says
which worker made it).  The script logs the norm of every update through a
step post-hook on its optimizer that all-reduces it, as some scripts do:
a collective inside ``optimizer.step()``, after the update.

``--die RANK:STEP:before-step`` (first attempt only): that rank SIGKILLs the
worker that made the current batch right before ``optimizer.step()``, while
its peers are still busy (they sleep 0.3 s there).  torch raises
"DataLoader worker ... is killed by signal" from its SIGCHLD handler in the
rank's main thread, in whatever frame runs when the signal arrives: here
usually inside the post-hook's all-reduce, after the update.
"""

from __future__ import annotations

import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

from jobkit import batch, fault_at, finish, job_parser, make_model, trace, use_jitckpt


class Minibatches(Dataset):
    """Item k: (x, y, pid of the worker that made it) of minibatch ``first + k`` on this rank."""

    def __init__(self, args: object, rank: int, first: int, last: int) -> None:
        self.args, self.rank, self.first, self.last = args, rank, first, last

    def __len__(self) -> int:
        return self.last - self.first

    def __getitem__(self, k: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        x, y = batch(self.args, self.first + k, 0, self.rank)
        return x, y, os.getpid()


def main() -> None:
    args = job_parser(__doc__).parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model = make_model(args)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(args.seed + 1 + rank)
    ddp = DDP(model)
    progress = {"step": 0}
    previous = [p.detach().clone() for p in model.parameters()]

    def log_update_norm(opt, args_, kwargs_) -> None:  # type: ignore[no-untyped-def]
        norm = torch.stack([(p.detach() - q).norm() for p, q in zip(model.parameters(), previous)]).norm()
        dist.all_reduce(norm)
        for p, q in zip(model.parameters(), previous):
            q.copy_(p.detach())

    optimizer.register_step_post_hook(log_update_norm)
    start = use_jitckpt(progress, {"model": model}, {"optimizer": optimizer})
    for p, q in zip(model.parameters(), previous):
        q.copy_(p.detach())
    loader = DataLoader(Minibatches(args, rank, start, args.steps), batch_size=None, num_workers=2)
    loss_fn = nn.MSELoss()
    for step, (x, y, worker) in enumerate(loader, start):
        progress["step"] = step
        trace(args, rank, step, {"model": model})
        loss = loss_fn(ddp(x), y)
        loss.backward()
        if args.die and int(args.die.split(":")[1]) == step and rank != int(args.die.split(":")[0]):
            time.sleep(0.3)
        if fault_at(args.die, rank, step, "before-step"):
            print(f"rank {rank}: SIGKILL to DataLoader worker {worker} at minibatch {step}", flush=True)
            os.kill(worker, signal.SIGKILL)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    finish(rank, {"model": model})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
