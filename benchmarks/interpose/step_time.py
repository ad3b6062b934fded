#!/usr/bin/env python3
"""Step time of the CUDA C++ training program (examples/cuda_mlp) with and without the
interposition library preloaded, on the CPU device emulator.

Two ranks are started directly (no torchrun, so process start-up stays small),
the two variants are interleaved over several repetitions, and the table gives
the median time per step and the median of the per-pair ratios.

    make -C emulator && make -C interpose && make -C examples/cuda_mlp
    python3 benchmarks/interpose/step_time.py [--steps 3000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BINARY = ROOT / "examples" / "cuda_mlp" / "build" / "mlp"
EMULATOR = ROOT / "emulator" / "build"
LIBRARY = ROOT / "interpose" / "build" / "libjitckpt_interpose.so"


def run_job(steps: int, ranks: int, preload: bool) -> float:
    """Wall seconds of one `ranks`-rank run of `steps` steps."""
    with tempfile.TemporaryDirectory() as rendezvous:
        procs = []
        started = time.perf_counter()
        for rank in range(ranks):
            env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank),
                       LD_LIBRARY_PATH=str(EMULATOR), JITCKPT_HANG_TIMEOUT="60")
            env.pop("LD_PRELOAD", None)
            if preload:
                env["LD_PRELOAD"] = str(LIBRARY)
            procs.append(subprocess.Popen([str(BINARY), "--steps", str(steps), "--log-every", str(steps),
                                           "--rendezvous-dir", rendezvous], env=env, stdout=subprocess.DEVNULL))
        codes = [p.wait(timeout=600) for p in procs]
        elapsed = time.perf_counter() - started
    if any(codes):
        sys.exit(f"a run failed (exit codes {codes}, preload={preload})")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    for needed in (BINARY, EMULATOR / "libcudart.so.13", LIBRARY):
        if not needed.exists():
            sys.exit(f"missing {needed}: build with make -C emulator && make -C interpose && make -C examples/cuda_mlp")
    plain, preloaded = [], []
    for _ in range(args.repeats):
        plain.append(run_job(args.steps, args.ranks, preload=False))
        preloaded.append(run_job(args.steps, args.ranks, preload=True))
    ratios = [b / a for a, b in zip(plain, preloaded)]
    print(f"{args.ranks} ranks x {args.steps} steps on the CPU device emulator, {args.repeats} interleaved pairs")
    print(f"{'variant':<22}{'median s':>10}{'ms/step':>10}")
    for name, runs in (("without interposer", plain), ("with interposer", preloaded)):
        median = statistics.median(runs)
        print(f"{name:<22}{median:>10.3f}{1000 * median / args.steps:>10.4f}")
    print(f"ratio with/without: median {statistics.median(ratios):.4f} (min {min(ratios):.4f}, max {max(ratios):.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
