"""A user's DDP script with torchdata's StatefulDataLoader, written the way torchdata's documentation shows.

- 2 loader workers that augment every sample with random noise and random
  flips (torch's and Python's generators, in the worker);
- a shuffled DistributedSampler, and per-rank seeds: each rank seeds its
  global generator differently (dropout masks, the loader's base seed);
- save(): model, optimizer, ``loader.state_dict()`` and the loop counters;
  resume: the same, loaded back with ``loader.load_state_dict``;
- ``--die RANK:STEP:HOW`` makes that rank kill (SIGKILL) or freeze (SIGSTOP)
  itself right after fetching the batch of minibatch STEP, in attempt 0;
- ``--die-in-step RANK:STEP[:WHERE]`` makes that rank SIGKILL itself inside
  ``optimizer.step()`` of minibatch STEP, in attempt 0 (its replicas save
  STEP+1): WHERE ``hook`` (default) kills in the optimizer's own step
  pre-hook, after torch's global ones; ``wrapped`` in a wrapper the script
  put around ``optimizer.step``, before any of torch's hooks run;
- ``--aux``: two more StatefulDataLoaders mixed into the loss, saved and
  loaded the same way: ``aux`` (2 workers, augmented) gives a batch every
  4th minibatch from minibatch 3 on, ``late`` (no workers, augmented in this
  process) every 4th from minibatch 9 on, so a failure in between finds one
  that has not moved since its last batch and one that has not started;
- ``--prefetch-at K`` (with ``--aux``): the two extra loaders get 2 workers
  each, and their iterators are made at minibatch K (their workers start
  prefetching, each iterator draws its seeds from the rank's generator
  there), not before training; an attempt that resumes past K makes them
  before training, from the loaded states;
- ``--probe-at K``: after backward() of minibatch K, before
  ``optimizer.step()``, the script takes the loader's next batch to log a
  metric on it (no gradient, dropout off), so minibatch K+1 trains on the
  batch after it.

Prints ``final parameters sha256 <hex>`` on rank 0.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import signal

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import Dataset
from torch.utils.data.distributed import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

import jitckpt


class NoisySines(Dataset):
    """Fixed inputs; each access adds fresh noise and sometimes flips the sample (augmentation)."""

    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(99)
        self.x = torch.randn(n, 16, generator=g)
        self.y = self.x[:, :4].sum(dim=1, keepdim=True).sin()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x[i] + 0.1 * torch.randn(16)
        if random.random() < 0.5:
            x = x.flip(0)
        return x, self.y[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--die", default="")
    p.add_argument("--die-in-step", default="")
    p.add_argument("--aux", action="store_true")
    p.add_argument("--prefetch-at", type=int, default=-1)
    p.add_argument("--probe-at", type=int, default=-1)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    die_rank, die_step, how = (args.die.split(":") + ["", "", ""])[:3] if args.die else ("-1", "-1", "")

    torch.manual_seed(args.seed)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    progress = {"epoch": 0, "step": 0}
    if args.die_in_step and attempt == 0:
        step_rank, step_at, where = (args.die_in_step.split(":") + ["hook"])[:3]
        if where not in ("hook", "wrapped"):
            p.error(f"--die-in-step RANK:STEP[:hook|wrapped], got {args.die_in_step!r}")

        def die_if_due() -> None:
            if rank == int(step_rank) and progress["step"] == int(step_at):
                print(f"rank {rank}: dying (kill) inside optimizer.step() of minibatch {step_at}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)

        if where == "hook":  # the optimizer's own step pre-hook: after torch's global pre-step hooks
            optimizer.register_step_pre_hook(lambda opt, a, kw: die_if_due())
        else:  # "wrapped": the script wraps optimizer.step (timing, logging), before any of torch's hooks
            inner_step = optimizer.step

            def step(*a: object, **kw: object) -> object:
                die_if_due()
                return inner_step(*a, **kw)

            optimizer.step = step
    torch.manual_seed(args.seed + 1 + rank)  # per-rank: dropout masks and the loader's base seed
    random.seed(args.seed + 1 + rank)

    dataset = NoisySines(args.samples)
    sampler = DistributedSampler(dataset, shuffle=True, seed=args.seed)
    loader = StatefulDataLoader(dataset, batch_size=4, sampler=sampler, num_workers=args.workers)
    extra: dict[str, tuple[StatefulDataLoader, int]] = {}  # name -> (loader, first minibatch it is used in)
    if args.aux:
        for name, workers, first in (("aux", 2, 3), ("late", 0, 9)):
            workers = 2 if args.prefetch_at >= 0 else workers
            extra_set = NoisySines(args.samples)
            extra_sampler = DistributedSampler(extra_set, shuffle=True, seed=args.seed + first)
            extra[name] = (StatefulDataLoader(extra_set, batch_size=4, sampler=extra_sampler, num_workers=workers), first)
    extra_iters: dict[str, object] = {}

    def extra_batches(step: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        batches = []
        for name, (extra_loader, first) in extra.items():
            if step >= first and (step - first) % 4 == 0:
                try:
                    batches.append(next(extra_iters[name]))
                except StopIteration:
                    extra_iters[name] = iter(extra_loader)
                    batches.append(next(extra_iters[name]))
        return batches

    def save(path: str) -> None:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict(), **{name: l.state_dict() for name, (l, _) in extra.items()},
                    **progress}, os.path.join(path, "state.pt"))

    jitckpt.register_save_checkpoint(save)
    path = jitckpt.jit_get_checkpoint_path()
    if path:
        state = torch.load(os.path.join(path, "state.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
        for name, (extra_loader, _) in extra.items():
            extra_loader.load_state_dict(state[name])
        progress.update(epoch=state["epoch"], step=state["step"])
        if rank == 0:
            print(f"resumed at epoch {progress['epoch']} step {progress['step']}", flush=True)

    def make_extra_iters() -> None:
        for name, (extra_loader, _) in extra.items():
            extra_iters[name] = iter(extra_loader)  # each draws its seeds from the rank's generator

    if args.prefetch_at < 0 or progress["step"] > args.prefetch_at:
        make_extra_iters()  # before training, in every attempt
    ddp = DDP(model)
    loss_fn = nn.MSELoss()
    while progress["epoch"] < args.epochs:
        sampler.set_epoch(progress["epoch"])
        batches = iter(loader)
        for x, y in batches:
            if attempt == 0 and rank == int(die_rank) and progress["step"] == int(die_step):
                print(f"rank {rank}: dying ({how}) in minibatch {progress['step']}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            if progress["step"] == args.prefetch_at:
                make_extra_iters()  # the workers start prefetching ahead of the loaders' first batches
            loss = loss_fn(ddp(x), y)
            for xa, ya in extra_batches(progress["step"]):
                loss = loss + 0.5 * loss_fn(ddp(xa), ya)
            loss.backward()
            if progress["step"] == args.probe_at:
                xp, yp = next(batches)  # a probe batch: a metric logged on it, nothing learnt from it
                model.eval()
                with torch.no_grad():
                    probe = loss_fn(model(xp), yp).item()
                model.train()
                print(f"rank {rank}: probe loss {probe:.5f} at minibatch {progress['step']}", flush=True)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            progress["step"] += 1
        progress["epoch"] += 1

    if rank == 0:
        digest = hashlib.sha256()
        for name, tensor in sorted(model.state_dict().items()):
            digest.update(name.encode() + tensor.detach().contiguous().numpy().tobytes())
        print(f"trained {progress['step']} steps; final parameters sha256 {digest.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
