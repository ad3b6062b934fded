"""DDP with ZeroRedundancyOptimizer: its step() updates this rank's shard, then broadcasts every shard.

A rank that fails between the two leaves its peers with a step half
applied: their own shard updated, others maybe.  ``--die RANK:STEP:WHERE``
(first attempt only):

- ``before-step``: SIGKILL between backward() and zero.step() (user code);
- ``in-step``: SIGKILL from a step post-hook the script registers on ZeRO's
  local optimizer (it logs the update), i.e. after the local update and
  before the parameter broadcast;
- ``stop-in-step``: SIGSTOP there (frozen, sockets open);
- ``preempt-in-step``: every rank gets SIGTERM there (a preemption notice
  during the step): no peer is lost, so the step completes and every rank
  saves the start of the next minibatch.
"""

from __future__ import annotations

import signal

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from jobkit import attempt, batch, die, fault_at, finish, job_parser, make_model, trace, use_jitckpt


def main() -> None:
    args = job_parser(__doc__).parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model = make_model(args)
    torch.manual_seed(args.seed + 1 + rank)  # each rank's own dropout masks
    ddp = DDP(model)
    zero = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=3e-3)
    progress = {"step": 0}

    def after_local_update(optimizer, args_, kwargs_) -> None:  # type: ignore[no-untyped-def]
        step = progress["step"]
        if fault_at(args.die, rank, step, "in-step"):
            die(rank, step, "after ZeRO's local update, before its broadcast")
        if fault_at(args.die, rank, step, "stop-in-step"):
            die(rank, step, "after ZeRO's local update, before its broadcast", signal.SIGSTOP)
        if args.die.endswith(":preempt-in-step") and attempt() == 0 and step == int(args.die.split(":")[1]):
            die(rank, step, "preemption notice during ZeRO's step", signal.SIGTERM)

    zero.optim.register_step_post_hook(after_local_update)
    # ZeRO's own state_dict() gathers every shard (a collective): save this rank's local optimizer.
    start = use_jitckpt(progress, {"model": model}, {"optimizer": zero.optim})
    loss_fn = nn.MSELoss()
    for step in range(start, args.steps):
        progress["step"] = step
        trace(args, rank, step, {"model": model})
        x, y = batch(args, step, 0, rank)
        loss = loss_fn(ddp(x), y)
        loss.backward()
        if fault_at(args.die, rank, step, "before-step"):
            die(rank, step, "between backward and step")
        zero.step()
        zero.zero_grad(set_to_none=True)
    finish(rank, {"model": model})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
