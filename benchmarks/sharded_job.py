"""The memory tier benchmark's job (``memory_tier.py``): an FSDP2 MLP with jitckpt's two calls, timed.

Every Linear is ``fully_shard``-ed over all ranks (and the root), Adam, gloo
on CPU; batches are a pure function of (step, rank).  The save writes this
rank's local shards (no collective), as ``tests/sharded_programs/
train_sharded.py`` does; under plain torchrun jitckpt's calls do nothing.
Reports through ``BENCH {json}`` lines (``harness.parse_events``):

- ``steps``: rank 0's per-step seconds after the warm-up;
- ``memory``: under jit-run, the bytes of this rank's newest snapshot in the
  memory tier and of all its snapshots there, and the host's whole tier
  (copies kept for another host's ranks included) per local rank (each rank).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn

import jitckpt


def emit(event: str, **fields) -> None:
    print("BENCH " + json.dumps({"event": event, "time": time.time(), **fields}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.hidden, args.hidden), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(args.hidden, 8))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    progress = {"step": 0}

    def local(value):
        return value.to_local() if isinstance(value, DTensor) else value

    def save(path: str) -> None:
        opt = optimizer.state_dict()
        opt["state"] = {i: {k: local(v) for k, v in s.items()} for i, s in opt["state"].items()}
        torch.save({"model": {k: local(v) for k, v in model.state_dict().items()}, "optimizer": opt,
                    "step": progress["step"]}, os.path.join(path, "state.pt"))

    jitckpt.register_save_checkpoint(save)
    if jitckpt.jit_get_checkpoint_path():
        raise SystemExit("the benchmark job runs without failures; use a fresh --checkpoint-dir")
    loss_fn = nn.MSELoss()
    times = []
    for step in range(args.steps):
        progress["step"] = step
        started = time.perf_counter()
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(args.batch, args.hidden, generator=g), torch.randn(args.batch, 8, generator=g)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - started)
    if rank == 0:
        emit("steps", seconds=times)
    shm = os.environ.get("JITCKPT_SHM_DIR")
    if shm:
        mine = sorted(Path(shm, "memory").glob(f"step-*/rank-{rank:05d}"))
        sizes = [sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) for d in mine]
        # (in a multi-node job the host's tier also holds copies of another host's snapshots)
        host = sum(f.stat().st_size for f in Path(shm, "memory").rglob("*") if f.is_file())
        emit("memory", rank=rank, newest=sizes[-1] if sizes else 0, total=sum(sizes), snapshots=len(sizes),
             host_per_rank=host / int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
