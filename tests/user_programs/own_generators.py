"""A user's script that draws from random-number generators of its own, not the global ones.

DDP over a plain ``DataLoader`` (per-rank data, no shuffle); after each
``next()`` the script adds input noise from a ``torch.Generator`` seeded per
rank, jitter from a ``random.Random`` and a mask from a
``numpy.random.default_rng``; a ``Noise`` layer draws from a generator of
its own inside the model's forward.  On resume the script skips to its
position by iterating the loader.  ``--save-generators``: its ``save()`` also
writes the generators' states and its resume loads them (what a careful user
does; the states it gets are those of the middle of the failed minibatch).
``--per-epoch``: two epochs; at each epoch's start the noise generator is
reseeded from the epoch and a second noise generator is made anew with a
constant seed (the previous epoch's, still alive when minibatch i-1 ends,
must not be what the new one gets).  ``--die RANK:STEP:HOW``: that rank is
SIGKILLed (``kill``) or SIGSTOPped (``stop``) between ``backward()`` and
``optimizer.step()`` of minibatch STEP (1-based), or SIGSTOPped after taking
its batch and drawing its noise, before the forward (``stop-before-forward``),
in the first attempt.  Prints ``final parameters sha256 <hex>``
on rank 0.
"""

from __future__ import annotations

import argparse
import os
import random
import signal

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

import jitckpt
from jobkit import attempt, finish


class Noise(nn.Module):
    """Adds noise drawn from the layer's own generator (seeded per rank)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.generator = torch.Generator().manual_seed(seed)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.05 * torch.randn(x.shape, generator=self.generator)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--die", default="")
    p.add_argument("--save-generators", action="store_true")
    p.add_argument("--per-epoch", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), Noise(100 + rank), nn.Tanh(), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    noise = torch.Generator().manual_seed(200 + rank)
    jitter = random.Random(300 + rank)
    masks = np.random.default_rng(400 + rank)
    generators = {"noise": noise, "layer": model.module[1].generator}
    progress = {"step": 0}

    def save(path: str) -> None:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": progress["step"]}
        if args.save_generators:
            state["generators"] = {name: g.get_state() for name, g in generators.items()}
            state["jitter"] = jitter.getstate()
            state["masks"] = masks.bit_generator.state
        torch.save(state, os.path.join(path, "state.pt"))

    jitckpt.register_save_checkpoint(save)
    path = jitckpt.jit_get_checkpoint_path()
    start = 0
    if path:
        state = torch.load(os.path.join(path, "state.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
        if args.save_generators:
            for name, g in generators.items():
                g.set_state(state["generators"][name])
            jitter.setstate(state["jitter"])
            masks.bit_generator.state = state["masks"]

    data = torch.arange(args.steps * 4 * 8, dtype=torch.float32).reshape(-1, 8).mul(0.01 * (rank + 1)).sin()
    loader = iter(DataLoader(TensorDataset(data), batch_size=4))
    for _ in range(start):
        next(loader)
    die_rank, die_step, how = args.die.split(":") if args.die else ("-1", "-1", "")
    per_epoch = args.steps // 2
    again = None
    for step in range(start, args.steps):
        progress["step"] = step
        if args.per_epoch and (step % per_epoch == 0 or again is None):
            noise.manual_seed(200 + rank + 1000 * (step // per_epoch))
            for _ in range(step % per_epoch):  # (resumed mid-epoch: where the epoch's noise had got to)
                torch.randn(4, 8, generator=noise)
            again = torch.Generator().manual_seed(600 + rank)
            for _ in range(step % per_epoch):
                torch.randn(4, 8, generator=again)
        (x,) = next(loader)
        x = x + 0.1 * torch.randn(x.shape, generator=noise)
        if again is not None:
            x = x + 0.1 * torch.randn(x.shape, generator=again)
        if attempt() == 0 and rank == int(die_rank) and step + 1 == int(die_step) and how == "stop-before-forward":
            print(f"rank {rank}: stop myself before the forward of minibatch {step + 1}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
        x = x * (1 + 0.01 * jitter.gauss(0, 1))
        x = x * torch.from_numpy((masks.random(x.shape) > 0.1).astype(np.float32))
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        if attempt() == 0 and rank == int(die_rank) and step + 1 == int(die_step):
            print(f"rank {rank}: {how} myself between backward and step of minibatch {step + 1}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        optimizer.step()
    finish(rank, {"model": model.module})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
