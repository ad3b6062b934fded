"""A user's sharded training job with jitckpt's two calls (tests/test_sharded.py).

--mode fsdp   FSDP2 (``fully_shard``) over all ranks: every rank holds a
              different shard of parameters and optimizer state.
--mode hsdp   FSDP2 over a 2 x (world/2) mesh (replicate, shard): ranks at the
              same shard position in the two replicate groups are replicas.
--mode zero   DDP with ZeroRedundancyOptimizer: parameters replicated,
              optimizer state sharded.

--die RANK:STEP:WHERE:HOW[:ATTEMPT] (repeatable): rank RANK kills (HOW=kill,
SIGKILL) or freezes (HOW=hang, SIGSTOP) itself inside minibatch STEP, from
the script's own code: WHERE=forward (a forward pre-hook on the second
layer), backward (a hook on the output's gradient), collective (FSDP2's
gradient reduce-scatter, ``dist.reduce_scatter_single``; ZeRO's parameter
broadcast after its local step), step (a post-hook of the local optimizer:
inside ``optimizer.step()``, its own shard updated).  With
--corrupt-own-snapshot it first flips a byte of its own newest snapshot in
jitckpt's memory tier (``$JITCKPT_SHM_DIR/memory``).

--backend, --device: gloo on CPU by default; ``--device cuda --backend nccl``
(one GPU per rank) is what scripts/gpu-check.sh runs on two or more GPUs.

--fault RANK:STEP:SIGNAL[:ATTEMPT] (repeatable): in torchrun restart ATTEMPT
(default 0), rank RANK sends itself SIGNAL (KILL or TERM) at the start of
minibatch STEP.  TERM is a preemption notice: jitckpt saves every rank.

Every batch is a pure function of (step, rank) and there is no dropout, so a
run is deterministic.  Each step ends with an all-reduce of the loss (for
logging), as most training loops have.  The save function writes this rank's
local shards only (no collective); every rank prints a SHA-256 of its own
local parameters (``rank R local parameters sha256 X``: its shards), and rank 0
a SHA-256 of the full final parameters, except on a backend that cannot gather
a DTensor (``ncclorder``: a Python ProcessGroup has no per-device backend, so
``full_tensor()`` fails), where rank 0 says that it skips it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import jitckpt


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=["fsdp", "hsdp", "zero"], required=True)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--fault", action="append", default=[], help="RANK:STEP:SIGNAL[:ATTEMPT]")
    p.add_argument("--die", action="append", default=[], help="RANK:STEP:WHERE:HOW[:ATTEMPT]")
    p.add_argument("--corrupt-own-snapshot", action="store_true")
    p.add_argument("--backend", default="gloo", help="torch.distributed backend (gloo, nccl, ncclorder)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cuda: this rank's GPU (LOCAL_RANK)")
    return p.parse_args()


def build(mode: str, world: int, device: torch.device = torch.device("cpu")) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(1234)  # the same initial model on every rank; FSDP shards it
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 4)).to(device)
    if mode == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-2)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if mode == "hsdp":
        mesh = init_device_mesh(device.type, (2, world // 2), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("shard",))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _local(value):
    """A DTensor's local shard; anything else as it is."""
    from torch.distributed.tensor import DTensor

    return value.to_local() if isinstance(value, DTensor) else value


def use_jitckpt(mode: str, model: nn.Module, optimizer: torch.optim.Optimizer, progress: dict[str, int]) -> int:
    """jitckpt's two calls; returns the minibatch to start at."""
    # ZeroRedundancyOptimizer's own state_dict() gathers every shard (a collective):
    # a JIT save must not, so save and load this rank's local optimizer instead.
    local_opt = optimizer.optim if mode == "zero" else optimizer

    def save(path: str) -> None:
        opt_state = local_opt.state_dict()
        opt_state["state"] = {i: {k: _local(v) for k, v in s.items()} for i, s in opt_state["state"].items()}
        torch.save(
            {"model": {k: _local(v) for k, v in model.state_dict().items()}, "optimizer": opt_state,
             "step": progress["step"]},
            os.path.join(path, "state.pt"),
        )

    jitckpt.register_save_checkpoint(save)
    path = jitckpt.jit_get_checkpoint_path()
    if not path:
        return 0
    state = torch.load(os.path.join(path, "state.pt"), map_location=next(model.parameters()).device)
    with torch.no_grad():
        for name, value in model.state_dict().items():
            _local(value).copy_(state["model"][name])
    if mode != "zero":
        # Adam's moments are DTensors shaped like their parameters: rebuild them from the local shards.
        from torch.distributed.tensor import DTensor

        params = [p for group in local_opt.param_groups for p in group["params"]]
        for index, entry in state["optimizer"]["state"].items():
            p = params[index]
            for key, value in entry.items():
                if key != "step":
                    entry[key] = DTensor.from_local(value, p.device_mesh, p.placements, run_check=False,
                                                    shape=p.shape, stride=p.stride())
    local_opt.load_state_dict(state["optimizer"])
    return state["step"]


def batch(step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def maybe_fault(faults: list[str], rank: int, step: int) -> None:
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    for spec in faults:
        fields = spec.split(":")
        r, s, sig = int(fields[0]), int(fields[1]), fields[2]
        a = int(fields[3]) if len(fields) > 3 else 0
        if (r, s, a) == (rank, step, attempt):
            print(f"rank {rank}: SIG{sig} to myself at minibatch {step} (attempt {attempt})", flush=True)
            os.kill(os.getpid(), getattr(signal, f"SIG{sig}"))
            time.sleep(2)  # a preemption notice (TERM) takes effect by the next collective


class Dying:
    """The --die faults of this rank and attempt, fired from the script's own hooks (see the module docstring)."""

    def __init__(self, specs: list[str], rank: int, corrupt: bool) -> None:
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.rank, self.corrupt, self.step = rank, corrupt, -1
        self.armed: dict[tuple[int, str], str] = {}
        for spec in specs:
            fields = spec.split(":")
            if int(fields[0]) == rank and (int(fields[4]) if len(fields) > 4 else 0) == attempt:
                self.armed[(int(fields[1]), fields[2])] = fields[3]

    def at(self, where: str) -> None:
        how = self.armed.pop((self.step, where), None)
        if how is None:
            return
        if self.corrupt:
            self._corrupt_newest_snapshot()
        if how == "hang":
            self._let_the_copy_end()
        print(f"rank {self.rank}: {how} myself in the {where} of minibatch {self.step}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        time.sleep(1)

    @staticmethod
    def _let_the_copy_end() -> None:
        """A frozen host in the multi-host tests is one whose copy of this minibatch's snapshot went out first:
        the copy runs beside the training and, on two busy cores, may not have ended by the backward; a freeze
        before it ends is another scenario (that minibatch then has no redundancy, and the job goes back one)."""
        import jitckpt.worker

        rt = jitckpt.worker.current()
        peers = getattr(getattr(rt, "memory_tier", None), "peers", None)
        if peers is not None:
            peers.wait_sent(60.0)

    def _corrupt_newest_snapshot(self) -> None:
        from pathlib import Path

        memory = Path(os.environ["JITCKPT_SHM_DIR"]) / "memory"
        newest = sorted(memory.glob(f"step-*/rank-{self.rank:05d}/state.pt"))[-1]
        data = bytearray(newest.read_bytes())
        data[len(data) // 2] ^= 0xFF
        newest.write_bytes(bytes(data))
        print(f"rank {self.rank}: flipped a byte of {newest}", flush=True)

    def install(self, mode: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        model[2].register_forward_pre_hook(lambda module, args: self.at("forward"))
        local = optimizer.optim if mode == "zero" else optimizer
        local.register_step_post_hook(lambda opt, args, kwargs: self.at("step"))
        name = "broadcast" if mode == "zero" else "reduce_scatter_single"
        original = getattr(dist, name)

        def collective(*args, **kwargs):
            self.at("collective")
            return original(*args, **kwargs)

        setattr(dist, name, collective)

    def output(self, out: torch.Tensor) -> torch.Tensor:
        if out.requires_grad:
            out.register_hook(lambda grad: self.at("backward"))
        return out


def parameters_sha256(model: nn.Module) -> str:
    """SHA-256 of the full parameters (gathers shards: call on every rank)."""
    digest = hashlib.sha256()
    for name, value in model.state_dict().items():
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        digest.update(name.encode())
        digest.update(full.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def local_parameters_sha256(model: nn.Module) -> str:
    """SHA-256 of this rank's own shards (no collective): equal shard by shard means equal parameters."""
    digest = hashlib.sha256()
    for name, value in model.state_dict().items():
        digest.update(name.encode())
        digest.update(_local(value).detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


# Backends whose process group has no per-device backend, so DTensor cannot gather over it.
CANNOT_GATHER = ("ncclorder",)


def main() -> None:
    args = parse_args()
    device = torch.device("cpu")
    if args.device == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if args.backend == "ncclorder":  # the strict test backend (tests/nccl_order), registered when asked for
        import sys

        tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        if tests not in sys.path:
            sys.path.insert(0, tests)
        import nccl_order

        nccl_order.register()
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer = build(args.mode, world, device)
    progress = {"step": 0}
    start = use_jitckpt(args.mode, model, optimizer, progress)
    dying = Dying(args.die, rank, args.corrupt_own_snapshot)
    dying.install(args.mode, model.module if args.mode == "zero" else model, optimizer)
    loss_fn = nn.MSELoss()
    for step in range(start, args.steps):
        progress["step"] = dying.step = step
        maybe_fault(args.fault, rank, step)
        x, y = (t.to(device) for t in batch(step, rank))
        optimizer.zero_grad()
        loss = loss_fn(dying.output(model(x)), y)
        loss.backward()
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        optimizer.step()
    print(f"rank {rank} local parameters sha256 {local_parameters_sha256(model)}", flush=True)
    if args.backend in CANNOT_GATHER and args.mode != "zero":
        if rank == 0:
            print(f"full parameters sha256 skipped: backend {args.backend} cannot gather DTensor shards "
                  "(compare every rank's local parameters sha256)", flush=True)
    else:
        sha = parameters_sha256(model)
        if rank == 0:
            print(f"final parameters sha256 {sha}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
