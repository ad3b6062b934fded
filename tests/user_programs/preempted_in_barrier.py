"""A preemption notice while the training thread waits in a collective that jitckpt does not track.

The script checks that every rank reaches each minibatch with
``dist.monitored_barrier()`` (gloo's debugging barrier, not one of the
collectives jitckpt wraps), and its model has BatchNorm under DDP with
``broadcast_buffers=False`` (each rank keeps its own statistics).
``--die 0:STEP:preempt`` (first attempt only): rank 0 gets SIGTERM at the
start of minibatch STEP and then waits in that barrier for its peers, which
are slow to load that minibatch (1.5 s).  The save (``--slow-save`` seconds,
a large checkpoint on slow storage) must not capture BatchNorm statistics
that the forward pass, run once the peers arrive and the barrier returns,
has already updated.
"""

from __future__ import annotations

import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from jobkit import attempt, batch, die, fault_at, finish, job_parser, make_model, trace, use_jitckpt


def main() -> None:
    p = job_parser(__doc__)
    p.add_argument("--slow-save", type=float, default=0.0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model = make_model(args)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    torch.manual_seed(args.seed + 1 + rank)
    ddp = DDP(model, broadcast_buffers=False)
    progress = {"step": 0}
    start = use_jitckpt(progress, {"model": model}, {"optimizer": optimizer}, slow_save=args.slow_save)
    loss_fn = nn.MSELoss()
    for step in range(start, args.steps):
        progress["step"] = step
        trace(args, rank, step, {"model": model})
        x, y = batch(args, step, 0, rank)
        if args.die and attempt() == 0 and int(args.die.split(":")[1]) == step and rank != 0:
            time.sleep(1.5)  # slow to load this minibatch
        if fault_at(args.die, rank, step, "preempt"):
            die(rank, step, "preemption notice before the forward", signal.SIGTERM)
        dist.monitored_barrier()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    finish(rank, {"model": model})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
