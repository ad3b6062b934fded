"""A GAN: every minibatch steps the discriminator, then the generator, each its own DDP model and Adam.

The generator samples its noise in its own forward, from the global
generator (each rank its own seed): once for the discriminator's step and
again after it, for its own.  (A script that draws its first random numbers
of a minibatch before any module's forward is resumed with other numbers:
jitckpt puts a redone minibatch's RNG state back at its first forward.)
``--die RANK:STEP:WHERE`` (first attempt only), SIGKILL in the script's own
code:

- ``before-d-backward``: after the discriminator's forward pass, before its
  backward (the peers wait in the discriminator's all-reduce: start of STEP);
- ``between-steps``: after the discriminator's step, before the generator's
  forward (the peers hold D at STEP+1 and G at STEP: never saved);
- ``after-g-step``: after the generator's step, while logging (the peers
  finish STEP and save the start of STEP+1).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from jobkit import INPUT_DIM, batch, die, fault_at, finish, job_parser, trace, use_jitckpt

NOISE = 8


class Generator(nn.Module):
    """Maps noise it samples itself to fake samples."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(NOISE, 32), nn.GELU(), nn.Linear(32, INPUT_DIM))

    def forward(self, n: int) -> torch.Tensor:
        return self.net(torch.randn(n, NOISE))


def main() -> None:
    args = job_parser(__doc__).parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)
    generator = Generator()
    discriminator = nn.Sequential(nn.Linear(INPUT_DIM, 32), nn.GELU(), nn.Dropout(0.1), nn.Linear(32, 1))
    opt_g = torch.optim.Adam(generator.parameters(), lr=2e-3, betas=(0.5, 0.999))
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=2e-3, betas=(0.5, 0.999))
    torch.manual_seed(args.seed + 1 + rank)  # each rank's own noise and dropout
    g, d = DDP(generator), DDP(discriminator)
    models = {"generator": generator, "discriminator": discriminator}
    progress = {"step": 0}
    start = use_jitckpt(progress, models, {"opt_g": opt_g, "opt_d": opt_d})
    bce = nn.BCEWithLogitsLoss()
    n = args.batch
    labels = torch.cat([torch.ones(n, 1), torch.zeros(n, 1)])
    for step in range(start, args.steps):
        progress["step"] = step
        trace(args, rank, step, models)
        real, _ = batch(args, step, 0, rank)
        # the discriminator's step
        with torch.no_grad():
            fake = g(n)
        d_loss = bce(d(torch.cat([real, fake])), labels)
        if fault_at(args.die, rank, step, "before-d-backward"):
            die(rank, step, "before the discriminator's backward")
        opt_d.zero_grad(set_to_none=True)
        d_loss.backward()
        opt_d.step()
        if fault_at(args.die, rank, step, "between-steps"):
            die(rank, step, "between the discriminator's step and the generator's")
        # the generator's step, with fresh noise
        g_loss = bce(d(g(n)), torch.ones(n, 1))
        opt_g.zero_grad(set_to_none=True)
        g_loss.backward()
        opt_g.step()
        logged = (d_loss.item(), g_loss.item())
        if fault_at(args.die, rank, step, "after-g-step"):
            die(rank, step, f"after the generator's step, logging {logged}")
    finish(rank, models)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
