"""The benchmark workload shared by ``train_jit.py`` and ``train_periodic.py``.

The job is the example's (``examples/mlp_job.py``, which ``examples/train_mlp.py``
runs: a data-parallel MLP with dropout, Adam, a StepLR schedule and gradient
accumulation; every batch a pure function of (seed, step, micro-batch,
rank)), sized by default so that one optimizer step costs tens of
milliseconds on a small CPU box.  This module adds only the timing around it.

Both training scripts run the *same* loop (:func:`run_loop`) so that the only
difference between the variants is what they do around it (jitckpt's hooks,
or a periodic ``torch.save``).  Measurements leave the job as single stdout
lines ``BENCH {json}`` (see :func:`emit`), which the drivers
(``overhead.py``, ``failure_cost.py``) parse; every event carries a
``time.time()`` stamp, so the driver can line up events of different
processes and attempts (they all run on one host).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
if str(EXAMPLES_DIR) not in sys.path:
    sys.path.insert(0, str(EXAMPLES_DIR))
import mlp_job  # noqa: E402  (does not import jitckpt: the periodic baseline runs it too)

BENCH_PREFIX = "BENCH "


def attempt() -> int:
    """torchrun's restart count of this worker (0 on the first attempt)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def process_start_time() -> float | None:
    """When this process was created (epoch seconds, 10 ms resolution), from /proc; None elsewhere.

    Unlike a time stamp taken by the script, it does not depend on what ran
    before the script (jit-run's sitecustomize imports torch first).
    """
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
        # the start time counts clock ticks on the boot-time clock
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - start_ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def emit(event: str, **fields: Any) -> None:
    """Print one machine-readable ``BENCH {json}`` line on stdout."""
    record = {"event": event, "time": time.time(), "rank": int(os.environ.get("RANK", "0")), "attempt": attempt()}
    record.update(fields)
    sys.stdout.flush()
    # One write() per record: under `python -u` print() writes the text and the
    # newline separately, and four ranks sharing a pipe then interleave them.
    os.write(sys.stdout.fileno(), (BENCH_PREFIX + json.dumps(record) + "\n").encode())


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """The example's job flags, sized for benchmarking (~20-100 ms per step on 2 cores, 4 ranks), and the failure flags."""
    mlp_job.add_job_args(p)
    p.set_defaults(steps=300, batch=32, hidden=512, layers=4)
    p.add_argument("--warmup", type=int, default=10, help="steps of each attempt left out of the timed loop")
    p.add_argument("--fail-rank", type=int, default=2, help="rank that fails (with --fail-step)")
    p.add_argument("--fail-step", type=int, default=-1,
                   help="minibatch at whose start --fail-rank fails on the first attempt (-1: no failure)")


def build(args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """Process group, then the example's model, optimizer and scheduler (seeded like the example)."""
    dist.init_process_group("gloo")
    emit("pg_ready")
    return mlp_job.build(args, dist.get_rank())


def run_loop(
    args: argparse.Namespace,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    start: int,
    progress: dict[str, int],
    after_step: Callable[[int], None] | None = None,
    fail: Callable[[], None] | None = None,
) -> None:
    """Train minibatches ``start .. args.steps-1`` under DDP and report timings.

    Emits (rank 0 unless noted): ``loop_start``; ``first_step_done`` after the
    first optimizer step of this attempt (the "training is running again"
    mark of a recovery); ``caught_up`` when a restarted attempt completes
    ``--fail-step``; ``fail_now`` on ``--fail-rank`` at the start of
    ``--fail-step`` on the first attempt, right before ``fail()`` (if given)
    runs or jitckpt's own fault injection fires; and ``loop_done`` with ``loop_seconds``, the wall time of
    the steps after the first ``--warmup`` of this attempt, ``steps_timed``,
    per-step statistics and the final parameter hash; and on every rank
    ``loop_cpu``, the CPU time its process spent over the same steps.

    ``after_step(step)`` runs after every optimizer step (inside the timed
    region: a periodic checkpoint is part of the loop's cost).
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = dist.get_rank()
    ddp = DDP(model)
    loss_fn = nn.MSELoss()
    if rank == 0:
        emit("loop_start", start_step=start)
    step_ends: list[float] = []
    cpu_ends: list[float] = []  # this process's CPU time (all threads), less sensitive to other jobs than wall time
    loss = torch.zeros(())
    for step in range(start, args.steps):
        progress["step"] = step
        if step == args.fail_step and rank == args.fail_rank and attempt() == 0:
            emit("fail_now", step=step)
            if fail is not None:
                fail()
        loss = mlp_job.train_step(args, ddp, optimizer, loss_fn, step, rank)
        scheduler.step()
        if after_step is not None:
            after_step(step)
        step_ends.append(time.perf_counter())
        cpu_ends.append(time.process_time())
        if rank == 0 and len(step_ends) == 1:
            emit("first_step_done", step=step)
        if rank == 0 and step == args.fail_step and attempt() > 0:
            emit("caught_up", step=step)  # the minibatch that failed is done again
    timed = step_ends[args.warmup:] if len(step_ends) > args.warmup else []
    cpu = cpu_ends[args.warmup:] if len(cpu_ends) > args.warmup + 1 else []
    emit("loop_cpu", cpu_seconds=(cpu[-1] - cpu[0]) if cpu else None, steps_timed=max(0, len(cpu) - 1))
    if rank == 0:
        durations = [b - a for a, b in zip(timed, timed[1:])]
        emit(
            "loop_done",
            start_step=start,
            steps_run=len(step_ends),
            steps_timed=len(durations),
            loop_seconds=(timed[-1] - timed[0]) if len(timed) > 1 else None,
            step_ms_median=statistics.median(durations) * 1e3 if durations else None,
            step_ms_p90=statistics.quantiles(durations, n=10)[-1] * 1e3 if len(durations) >= 10 else None,
            final_loss=float(loss.item() * args.accum),
            sha256=mlp_job.parameters_sha256(model),
        )
    dist.destroy_process_group()
