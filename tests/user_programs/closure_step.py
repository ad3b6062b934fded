"""DDP with LBFGS: ``optimizer.step(closure)`` runs forward, backward and DDP's all-reduce inside the step.

LBFGS evaluates the closure once before it changes any parameter, then again
after each update of its line search.  ``--die RANK:STEP:EVAL`` (first
attempt only): that rank SIGKILLs itself in the closure's EVAL-th evaluation
of minibatch STEP, after the forward pass and before backward, so its peers
wait in that evaluation's gradient all-reduce.  Evaluation 1: nothing is
applied yet, the peers may save the start of STEP.  Evaluation 2 or later:
the parameters have moved, a save must be refused.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from jobkit import attempt, batch, die, finish, job_parser, make_model, trace, use_jitckpt


def main() -> None:
    p = job_parser(__doc__)
    p.add_argument("--max-iter", type=int, default=3)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    model = make_model(args)
    torch.manual_seed(args.seed + 1 + rank)
    ddp = DDP(model)
    optimizer = torch.optim.LBFGS(ddp.parameters(), lr=0.2, max_iter=args.max_iter, history_size=4)
    progress = {"step": 0}
    start = use_jitckpt(progress, {"model": model}, {"optimizer": optimizer})
    die_rank, die_step, die_eval = (int(v) for v in args.die.split(":")) if args.die else (-1, -1, -1)
    loss_fn = nn.MSELoss()
    for step in range(start, args.steps):
        progress["step"] = step
        trace(args, rank, step, {"model": model})
        x, y = batch(args, step, 0, rank)
        evaluations = 0

        def closure() -> torch.Tensor:
            nonlocal evaluations
            evaluations += 1
            optimizer.zero_grad()
            loss = loss_fn(ddp(x), y)
            if attempt() == 0 and (rank, step, evaluations) == (die_rank, die_step, die_eval):
                die(rank, step, f"in the closure's evaluation {evaluations}, before its backward")
            loss.backward()
            return loss

        optimizer.step(closure)
    finish(rank, {"model": model})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
