"""The memory tier benchmark's job (``memory_tier.py``): an FSDP2 MLP with jitckpt's two calls, timed.

Every Linear is ``fully_shard``-ed over all ranks (and the root), Adam, gloo
on CPU; batches are a pure function of (step, rank).  The save writes this
rank's local shards (no collective), as ``tests/sharded_programs/
train_sharded.py`` does; under plain torchrun jitckpt's calls do nothing.
Reports through ``BENCH {json}`` lines (``harness.parse_events``):

- ``steps``: rank 0's per-step seconds after the warm-up (of this attempt);
- ``resumed``: the minibatch a restarted attempt starts at (rank 0);
- ``final``: a SHA-256 of the full final parameters (rank 0), so that runs
  with a failure can be checked against a fault-free one.

For ``sharded_recovery.py``: ``--die STEP`` makes the last rank SIGKILL
itself after its backward of minibatch STEP in the first attempt (a fault of
the script's own); ``--dcp-every K --dcp-dir DIR`` is what a user does
without jitckpt: a ``torch.distributed.checkpoint`` save of the sharded
state every K minibatches, and a restart loads the newest complete one.
- ``memory``: under jit-run, the bytes of this rank's newest snapshot in the
  memory tier and of all its snapshots there, and the host's whole tier
  (copies kept for another host's ranks included) per local rank (each rank).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
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
    p.add_argument("--die", type=int, default=None, metavar="STEP")
    p.add_argument("--dcp-every", type=int, default=0, metavar="K")
    p.add_argument("--dcp-dir", type=Path, default=None)
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

    def load(path: str) -> int:
        state = torch.load(os.path.join(path, "state.pt"))
        with torch.no_grad():
            for name, value in model.state_dict().items():
                local(value).copy_(state["model"][name])
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for index, entry in state["optimizer"]["state"].items():
            p = params[index]
            for key, value in entry.items():
                if key != "step":  # Adam's moments: DTensors shaped like their parameters
                    entry[key] = DTensor.from_local(value, p.device_mesh, p.placements, run_check=False,
                                                    shape=p.shape, stride=p.stride())
        optimizer.load_state_dict(state["optimizer"])
        return state["step"]

    jitckpt.register_save_checkpoint(save)
    path = jitckpt.jit_get_checkpoint_path()
    start = load(path) if path else dcp_load(model, optimizer, args.dcp_dir) if args.dcp_every else 0
    if start and rank == 0:
        emit("resumed", step=start)
    loss_fn = nn.MSELoss()
    times = []
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    for step in range(start, args.steps):
        progress["step"] = step
        started = time.perf_counter()
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(args.batch, args.hidden, generator=g), torch.randn(args.batch, 8, generator=g)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        if step == args.die and rank == world - 1 and attempt == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.step()
        if args.dcp_every and (step + 1) % args.dcp_every == 0:
            dcp_save(model, optimizer, args.dcp_dir, step + 1)
        if step >= start + args.warmup:
            times.append(time.perf_counter() - started)
    if rank == 0:
        emit("steps", seconds=times)
    full = {name: value.full_tensor() if isinstance(value, DTensor) else value
            for name, value in model.state_dict().items()}
    if rank == 0:
        digest = hashlib.sha256()
        for name in sorted(full):
            digest.update(name.encode())
            digest.update(full[name].detach().contiguous().numpy().tobytes())
        emit("final", sha256=digest.hexdigest())
    shm = os.environ.get("JITCKPT_SHM_DIR")
    if shm:
        mine = sorted(Path(shm, "memory").glob(f"step-*/rank-{rank:05d}"))
        sizes = [sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) for d in mine]
        # (in a multi-node job the host's tier also holds copies of another host's snapshots)
        # (and, with xor or rs, the parities it keeps: memory/ and parity/)
        host = sum(f.stat().st_size for f in Path(shm).rglob("*") if f.is_file() and f.parent.name != "jitckpt-rng"
                   and f.relative_to(shm).parts[0] in ("memory", "parity"))
        emit("memory", rank=rank, newest=sizes[-1] if sizes else 0, total=sum(sizes), snapshots=len(sizes),
             host_per_rank=host / int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    dist.destroy_process_group()


def dcp_save(model: nn.Module, optimizer: torch.optim.Optimizer, root: Path, step: int) -> None:
    """A periodic DCP checkpoint of the sharded state, marked complete once every rank has written it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer)
    where = root / f"step-{step:06d}"
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(where))
    dist.barrier()
    if dist.get_rank() == 0:
        (where / "COMPLETE").write_text(str(step))


def dcp_load(model: nn.Module, optimizer: torch.optim.Optimizer, root: Path) -> int:
    """Load the newest complete DCP checkpoint; the minibatch to start at (0 without one)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    done = sorted(root.glob("step-*/COMPLETE")) if root.is_dir() else []
    if not done:
        return 0
    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(done[-1].parent))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(done[-1].read_text())


if __name__ == "__main__":
    main()
