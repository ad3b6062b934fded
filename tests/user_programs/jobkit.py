"""What the user programs of tests/test_optimizer_phase.py share: jitckpt's two calls, faults, checksums.

Each program is a small data-parallel training script the way a user writes
it (examples/mlp_job.py's model and data), with a fault the script places
itself in its own code, in the first torchrun attempt only.  Every program
accepts ``--trace``: rank 0 then prints the checksum of the parameters at
the start of every minibatch, which the test compares with what every JIT
checkpoint holds (a checkpoint labelled minibatch *i* must hold exactly the
start of *i*, never a step half applied).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import torch  # noqa: E402

import jitckpt  # noqa: E402
from mlp_job import INPUT_DIM, add_job_args, batch, make_model  # noqa: E402,F401

STATE_FILE = "state.pt"
# BatchNorm statistics differ between ranks (each rank's own forward passes): left out of the trace.
_RANK_LOCAL = ("running_mean", "running_var", "num_batches_tracked")


def job_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    add_job_args(p)
    p.add_argument("--trace", action="store_true", help="rank 0 prints the parameters' checksum at every minibatch start")
    p.add_argument("--die", default="", help="RANK:STEP:WHERE: that rank fails there (first attempt only)")
    return p


def attempt() -> int:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def fault_at(spec: str, rank: int, step: int, where: str) -> bool:
    """True if ``spec`` (RANK:STEP:WHERE) names this rank, minibatch and place, in the first attempt."""
    if not spec or attempt() != 0:
        return False
    r, s, w = spec.split(":", 2)
    return (int(r), int(s), w) == (rank, step, where)


def die(rank: int, step: int, what: str, sig: int = signal.SIGKILL) -> None:
    print(f"rank {rank}: {signal.Signals(sig).name} to myself at minibatch {step}: {what}", flush=True)
    os.kill(os.getpid(), sig)
    if sig == signal.SIGTERM:
        time.sleep(0.5)  # a preemption notice: jitckpt's watchdog has raised its JIT event by now


def lagging_hook(spec: str, progress: dict[str, int]):  # noqa: ANN201
    """DDP's all-reduce as a comm hook (divide, then all-reduce, as DDP's default does) whose completion, on rank
    RANK in minibatch STEP of the first attempt (``spec``: RANK:STEP:SECONDS), is seen SECONDS late: a busy host,
    whose rank still waits for a collective that its peers have already left behind.  ``progress["step"]``: the
    script's minibatch."""
    import torch.distributed as dist

    lag_rank, lag_step, seconds = int(spec.split(":")[0]), int(spec.split(":")[1]), float(spec.split(":")[2])

    def hook(_state, bucket):  # type: ignore[no-untyped-def]  # (torch checks the annotations: none under __future__)
        tensor = bucket.buffer().div_(dist.get_world_size())
        step = progress["step"]

        def done(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            if attempt() == 0 and dist.get_rank() == lag_rank and step == lag_step:
                print(f"rank {lag_rank}: the all-reduce of minibatch {step} has completed; seen {seconds}s late",
                      flush=True)
                time.sleep(seconds)
            return fut.value()[0]

        return dist.all_reduce(tensor, async_op=True).get_future().then(done)

    return hook


def parameters_sha256(models: dict[str, dict[str, torch.Tensor]]) -> str:
    """SHA-256 of the models' state dicts (name order), BatchNorm statistics left out."""
    digest = hashlib.sha256()
    for model_name in sorted(models):
        for name, tensor in sorted(models[model_name].items()):
            if name.endswith(_RANK_LOCAL):
                continue
            digest.update(f"{model_name}.{name}".encode())
            digest.update(tensor.detach().contiguous().float().numpy().tobytes())
    return digest.hexdigest()


def final_sha256(models: dict[str, torch.nn.Module]) -> str:
    """SHA-256 of everything the models hold (parameters and buffers), for the bit-exactness check."""
    digest = hashlib.sha256()
    for model_name in sorted(models):
        for name, tensor in sorted(models[model_name].state_dict().items()):
            digest.update(f"{model_name}.{name}".encode())
            digest.update(tensor.detach().contiguous().float().numpy().tobytes())
    return digest.hexdigest()


def trace(args: argparse.Namespace, rank: int, step: int, models: dict[str, torch.nn.Module]) -> None:
    if args.trace and rank == 0:
        sha = parameters_sha256({name: m.state_dict() for name, m in models.items()})
        print(f"trace minibatch {step} sha256 {sha}", flush=True)


def use_jitckpt(progress: dict[str, int], models: dict[str, torch.nn.Module], stateful: dict[str, Any],
                slow_save: float = 0.0, in_save: Any = None) -> int:
    """jitckpt's two calls; returns the minibatch to start at.

    ``stateful``: optimizers, schedulers, scalers (anything with state_dict /
    load_state_dict), saved as they are, without collectives.  ``slow_save``
    seconds pass between writing them and writing the models (a large
    checkpoint on slow storage); ``in_save`` is called first thing in the save (a fault placed there).
    """

    def save(path: str) -> None:
        if in_save is not None:
            in_save()
        others = {name: obj.state_dict() for name, obj in stateful.items()}
        if slow_save:
            time.sleep(slow_save)
        state = {"models": {name: m.state_dict() for name, m in models.items()}, "stateful": others,
                 "step": progress["step"]}
        torch.save(state, os.path.join(path, STATE_FILE))

    jitckpt.register_save_checkpoint(save)
    path = jitckpt.jit_get_checkpoint_path()
    if not path:
        return 0
    state = torch.load(os.path.join(path, STATE_FILE))
    for name, model in models.items():
        model.load_state_dict(state["models"][name])
    for name, obj in stateful.items():
        obj.load_state_dict(state["stateful"][name])
    return state["step"]


def finish(rank: int, models: dict[str, torch.nn.Module]) -> None:
    sha = final_sha256(models)
    if rank == 0:
        print(f"final parameters sha256 {sha}", flush=True)
