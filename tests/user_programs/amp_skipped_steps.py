"""Mixed precision with ``torch.amp.GradScaler``: steps with inf gradients are skipped.

bfloat16 autocast on CPU, dropout with per-rank seeds, Adam.  ``--inf-steps
3,7`` makes every rank's loss infinite in those minibatches (deterministic),
so the scaler skips ``optimizer.step()`` there and halves its scale.
``--die RANK:STEP:between-backward-and-step`` (first attempt only): that
rank SIGKILLs itself after backward, before ``scaler.step`` (user code).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from jobkit import batch, die, fault_at, finish, job_parser, make_model, trace, use_jitckpt


def main() -> None:
    p = job_parser(__doc__)
    p.add_argument("--inf-steps", default="", help="comma-separated minibatches whose loss is made infinite")
    args = p.parse_args()
    inf_steps = {int(s) for s in args.inf_steps.split(",") if s}
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model = make_model(args)
    torch.manual_seed(args.seed + 1 + rank)
    ddp = DDP(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    progress = {"step": 0}
    start = use_jitckpt(progress, {"model": model}, {"optimizer": optimizer, "scaler": scaler})
    loss_fn = nn.MSELoss()
    for step in range(start, args.steps):
        progress["step"] = step
        trace(args, rank, step, {"model": model})
        x, y = batch(args, step, 0, rank)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_fn(ddp(x).float(), y)
        if step in inf_steps:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        if fault_at(args.die, rank, step, "between-backward-and-step"):
            die(rank, step, "between backward and scaler.step")
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
    finish(rank, {"model": model})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
