"""A user's epoch loop over a plain DataLoader that draws random numbers as it goes, and a rank that fails near an epoch's end.

The most common loop there is: a map-style dataset that augments each sample
with ``torch.rand`` (in the training process with ``--workers 0``, else in
the loader's workers, seeded from the iterator's base seed), a shuffled
``DistributedSampler`` with ``set_epoch``, a new iterator every epoch (not
persistent), dropout with per-rank seeds, DDP, SGD with momentum.  On resume
the script skips to its position by iterating.  Making an iterator draws its
base seed from the global generator, between one epoch's last optimizer
step and the next epoch's first batch.

``--loader-generator``: the DataLoader shuffles itself (``shuffle=True``,
no ``DistributedSampler``) from a generator the script makes once, seeded
per rank: its ``RandomSampler`` draws the permutation and the iterator its
base seed from it, and one more permutation when an epoch's iterator runs out.

``--log-allreduce``: an all-reduce of the loss after every optimizer step
(logging), where the ranks meet between two minibatches.  The step counter
that ``save()`` stores is advanced before it (a save there resumes at the
next minibatch), or with ``--count-after-logging`` after it: one behind a
save made in that all-reduce (a script's defect that jitckpt must refuse).

``--eval-draws``: after every epoch, an evaluation whose input noise comes
from the global generator, and an all-reduce of its metric (the ranks meet
there, between the two minibatches); with ``--eval-every N`` after every
N-th epoch only (0, N, ...).  ``--die RANK:STEP:WHERE`` (first
attempt only) SIGKILLs (``kill-*``) or SIGSTOPs (``stop-*``) that rank:
``*-forward`` right before minibatch STEP's forward, ``*-step`` right
before its optimizer step (its gradients all-reduced), ``*-epoch-end`` after
the epoch whose last minibatch is STEP, before anything else.
``--eval-before-loop``: an evaluation (eval mode, ``no_grad``, no draws)
and an all-reduce of its metric right after ``jit_get_checkpoint_path()``,
before the loop, in every attempt (a script that evaluates where it starts,
resumed or not).  ``--barrier-before-loop``: a ``dist.barrier()`` there
instead (after loading a checkpoint).  ``--wrap-after-load``: DDP wraps
the model after ``jit_get_checkpoint_path()`` and the load (its
constructor's broadcast there), as PyTorch's DDP tutorial does.  ``--no-augment``: the samples as
they are, no noise drawn (only the dropout masks draw in a minibatch).
``--freeze-in-save RANK``: that rank SIGSTOPs itself a second into its JIT
save (first attempt only).  Prints
``final parameters sha256 <hex>`` on rank 0.
"""

from __future__ import annotations

import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from jobkit import INPUT_DIM, attempt, die, finish, job_parser, use_jitckpt


class Augmented(Dataset):
    """Fixed samples, each drawn anew with noise from whatever generator the process (or worker) has."""

    def __init__(self, size: int, noise: float = 0.1) -> None:
        self.noise = noise
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(size, INPUT_DIM, generator=g)
        self.y = self.x[:, :4].sum(1, keepdim=True).tanh()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.x[i] + self.noise * torch.rand(INPUT_DIM) if self.noise else self.x[i]), self.y[i]


def main() -> None:
    p = job_parser(__doc__)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--eval-draws", action="store_true")
    p.add_argument("--eval-every", type=int, default=1, help="with --eval-draws: after every N-th epoch only")
    p.add_argument("--loader-generator", action="store_true")
    p.add_argument("--log-allreduce", action="store_true")
    p.add_argument("--count-after-logging", action="store_true")
    p.add_argument("--freeze-in-save", type=int, default=-1)
    p.add_argument("--eval-before-loop", action="store_true")
    p.add_argument("--barrier-before-loop", action="store_true")
    p.add_argument("--wrap-after-load", action="store_true")
    p.add_argument("--no-augment", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(INPUT_DIM, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    torch.manual_seed(args.seed + 101 * rank)  # each rank's own dropout and augmentation
    ddp = None if args.wrap_after_load else DDP(model)
    dataset = Augmented(48, 0.0 if args.no_augment else 0.1)
    if args.loader_generator:
        sampler = None
        shuffle = torch.Generator().manual_seed(args.seed + rank)
        loader = DataLoader(dataset, batch_size=4, shuffle=True, generator=shuffle, num_workers=args.workers)
    else:
        sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
        loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=args.workers)
    per_epoch = len(loader)
    progress = {"step": 0}
    def freeze_in_save() -> None:
        if attempt() == 0 and rank == args.freeze_in_save:
            time.sleep(1.0)
            die(rank, progress["step"], "frozen in its save", signal.SIGSTOP)

    start = use_jitckpt(progress, {"model": model}, {"optimizer": optimizer}, in_save=freeze_in_save)
    die_rank, die_step, where = (args.die.split(":") + ["", "", ""])[:3] if args.die else ("-1", "-1", "")

    def maybe_die(step: int, here: str) -> None:
        if attempt() == 0 and rank == int(die_rank) and step == int(die_step) and where.endswith(here):
            die(rank, step, here, signal.SIGKILL if where.startswith("kill") else signal.SIGSTOP)

    if args.eval_before_loop:
        model.eval()
        with torch.no_grad():
            metric = nn.functional.mse_loss(model(dataset.x[:8]), dataset.y[:8])
        dist.all_reduce(metric.reshape(1))
        model.train()
    if ddp is None:
        ddp = DDP(model)
    if args.barrier_before_loop:
        dist.barrier()
    step = start
    for epoch in range(start // per_epoch, args.epochs):
        if sampler is not None:
            sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i < start - epoch * per_epoch:
                continue  # (skipping to the resumed position)
            progress["step"] = step
            maybe_die(step, "forward")
            loss = nn.functional.mse_loss(ddp(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            maybe_die(step, "step")
            optimizer.step()
            step += 1
            if not args.count_after_logging:
                progress["step"] = step  # (what a checkpoint taken before the next minibatch resumes at)
            if args.log_allreduce:
                dist.all_reduce(loss.detach().clone())
            progress["step"] = step
        maybe_die(step - 1, "epoch-end")
        if args.eval_draws and epoch % args.eval_every == 0:
            model.eval()
            with torch.no_grad():
                metric = nn.functional.mse_loss(model(dataset.x + 0.1 * torch.rand_like(dataset.x)), dataset.y)
            dist.all_reduce(metric.reshape(1))
            model.train()
    finish(rank, {"model": model})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
