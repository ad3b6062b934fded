"""Benchmark training job: examples/train_mlp.py's job and jitckpt calls, in workload.py's timed loop.

Under ``jit-run`` it is protected by just-in-time checkpointing; under plain
``torchrun`` both jitckpt calls are no-ops (one warning), so the same file is
the "without jitckpt" variant of ``overhead.py``.  With ``--fail-step`` it only
*marks* the failure point (``BENCH fail_now``): the failure itself is injected
by jit-run's ``--fault`` option, phase ``forward`` of the same minibatch.

    jit-run torchrun --standalone --nproc_per_node 4 --max-restarts 3 benchmarks/train_jit.py --steps 300
"""

from __future__ import annotations

import time

_SCRIPT_START = time.time()  # before importing torch: start-up cost of a (re)started worker

import argparse  # noqa: E402

import workload  # noqa: E402  (first: it puts examples/ on sys.path)
import train_mlp  # noqa: E402  the example, for its jitckpt calls (use_jitckpt)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload.add_workload_args(p)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    workload.emit("script_start", script_start=_SCRIPT_START, process_start=workload.process_start_time())
    model, optimizer, scheduler = workload.build(args)
    progress = {"step": 0}
    start, path = train_mlp.use_jitckpt(model, optimizer, scheduler, progress)
    if path:
        workload.emit("resumed", step=start, path=path)
    workload.emit("state_ready", start_step=start)
    workload.run_loop(args, model, optimizer, scheduler, start, progress)


if __name__ == "__main__":
    main()
