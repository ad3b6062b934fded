"""Baseline training job: periodic ``torch.save`` checkpoints, no jitckpt.

The usual way to survive failures without jitckpt: every ``--ckpt-every``
optimizer steps rank 0 saves model, optimizer, scheduler and step with
``torch.save`` (written to a temporary file, then renamed, so a torn file is
never picked up); on a (re)start every rank loads the newest checkpoint in
``--ckpt-dir``.  With ``--fail-step S`` rank ``--fail-rank`` SIGKILLs itself at
the start of minibatch S on its first attempt, and ``torchrun --max-restarts``
restarts the job.  ``--ckpt-every 0`` turns checkpointing off (the fault-free
reference).

Like most periodic-checkpoint scripts it does not save each rank's RNG state,
so the dropout masks of redone minibatches differ and the final parameters
are not bit-identical to a fault-free run's (jitckpt's are).

torch 2.13's torchrun cannot restart a gloo job as it stands: the agent keeps
one rendezvous store across restarts and the workers' process group reads the
dead attempt's peer addresses ("Gloo connectFullMesh failed ... Connection
refused").  This script therefore applies the same workaround jitckpt applies
in its worker runtime (``_give_each_attempt_its_own_store`` in
``jitckpt/worker/instrument.py``): one ``PrefixStore`` per restart.

    torchrun --standalone --nproc_per_node 4 --max-restarts 1 benchmarks/train_periodic.py \\
        --ckpt-dir /tmp/ckpt --ckpt-every 50 --steps 500 --fail-step 325
"""

from __future__ import annotations

import time

_SCRIPT_START = time.time()  # before importing torch: start-up cost of a (re)started worker

import argparse  # noqa: E402
import importlib  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import workload  # noqa: E402


# Kept here rather than imported from jitckpt: every plain-torchrun gloo job
# needs this fix to restart at all, and the baseline is what a user runs
# without jitckpt, so it must not import it.  jitckpt's version also belongs
# to its worker runtime (it reads the runtime's attempt and jit-run's
# rendezvous round, for multi-node jobs); this one is the single-node form.
def give_each_attempt_its_own_store() -> None:
    """Namespace the rendezvous store by torchrun restart count (see the module docstring)."""
    from torch.distributed import PrefixStore

    rendezvous = importlib.import_module("torch.distributed.rendezvous")
    original = rendezvous._create_c10d_store

    def create_store(*args: Any, **kwargs: Any) -> Any:
        store = original(*args, **kwargs)
        if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            return PrefixStore(f"attempt-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
        return store

    rendezvous._create_c10d_store = create_store


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload.add_workload_args(p)
    p.add_argument("--ckpt-dir", default="./periodic-checkpoints", help="where the periodic checkpoints go")
    p.add_argument("--ckpt-every", type=int, default=50, help="save every K optimizer steps (0: never)")
    p.add_argument("--no-store-fix", action="store_true",
                   help="leave torchrun's rendezvous store alone (shows the gloo restart failure)")
    return p.parse_args()


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete checkpoint file (``step-XXXXXXXX.pt``) or None."""
    found = sorted(directory.glob("step-*.pt")) if directory.is_dir() else []
    return found[-1] if found else None


def main() -> None:
    args = parse_args()
    workload.emit("script_start", script_start=_SCRIPT_START, process_start=workload.process_start_time())
    if not args.no_store_fix:
        give_each_attempt_its_own_store()
    model, optimizer, scheduler = workload.build(args)
    rank = dist.get_rank()
    ckpt_dir = Path(args.ckpt_dir)
    if rank == 0 and args.ckpt_every:
        ckpt_dir.mkdir(parents=True, exist_ok=True)

    start = 0
    latest = latest_checkpoint(ckpt_dir) if args.ckpt_every else None
    if latest is not None:
        state = torch.load(latest)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start = state["step"]
        if rank == 0:
            workload.emit("resumed", step=start, path=str(latest))
    workload.emit("state_ready", start_step=start)

    save_seconds: list[float] = []

    def after_step(step: int) -> None:
        done = step + 1  # optimizer steps completed == the minibatch a restart resumes at
        if rank != 0 or not args.ckpt_every or done % args.ckpt_every or done == args.steps:
            return
        t0 = time.perf_counter()
        final = ckpt_dir / f"step-{done:08d}.pt"
        tmp = final.with_suffix(".tmp")
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "step": done,
            },
            tmp,
        )
        tmp.replace(final)
        save_seconds.append(time.perf_counter() - t0)
        workload.emit("periodic_save", step=done, seconds=save_seconds[-1], bytes=final.stat().st_size)

    def fail() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    workload.run_loop(args, model, optimizer, scheduler, start, {"step": start}, after_step=after_step, fail=fail)


if __name__ == "__main__":
    main()
