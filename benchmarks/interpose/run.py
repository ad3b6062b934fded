#!/usr/bin/env python3
"""Per-call overhead of libjitckpt_interpose.so: bench_overhead with and without LD_PRELOAD.

    make -C benchmarks/interpose && python3 benchmarks/interpose/run.py [--calls N] [--repeats R]

Runs build/bench_overhead against the do-nothing stubs (the difference
is the interposer's own cost) and, if it is built, against the CPU device
emulator (the difference drowns in the emulator's own cost, as it would in a
real runtime's), alternating plain and preloaded runs R times, and prints, per
operation, the best ns/call of each and their difference.  On a GPU host,
--runtime DIR adds a run against the libraries in DIR (e.g. the directory of
the real libcudart.so.13 and libnccl.so.2).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BUILD = HERE / "build"
BENCH = BUILD / "bench_overhead"
STUBS = BUILD / "stub"
LIBRARY = ROOT / "interpose" / "build" / "libjitckpt_interpose.so"
EMULATOR = ROOT / "emulator" / "build"


def run(lib_dir: Path, preload: bool, calls: int) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JITCKPT_", "LD_"))}
    env["LD_LIBRARY_PATH"] = str(lib_dir)
    if preload:
        env["LD_PRELOAD"] = str(LIBRARY)
    proc = subprocess.run([str(BENCH), str(calls)], env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"bench_overhead failed against {lib_dir}:\n{proc.stderr}")
    return {line.split()[0]: float(line.split()[1]) for line in proc.stdout.splitlines()}


def table(name: str, lib_dir: Path, calls: int, repeats: int) -> None:
    best: dict[bool, dict[str, float]] = {False: {}, True: {}}
    for _ in range(repeats):
        for preload in (False, True):
            for op, ns in run(lib_dir, preload, calls).items():
                best[preload][op] = min(ns, best[preload].get(op, float("inf")))
    print(f"\n{name}: {lib_dir} ({calls} calls x 11 runs x {repeats} repeats, best ns/call)")
    print(f"  {'operation':<52} {'plain':>9} {'preload':>9} {'added':>8}")
    for op, plain in best[False].items():
        pre = best[True][op]
        print(f"  {op:<52} {plain:9.1f} {pre:9.1f} {pre - plain:8.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=200000, help="calls per timed run against the stubs")
    parser.add_argument("--emulator-calls", type=int, default=20000, help="calls per timed run on the emulator")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--runtime", type=Path, help="also run against the libraries in this directory")
    args = parser.parse_args()
    if not BENCH.exists() or not LIBRARY.exists():
        sys.exit("build first: make -C benchmarks/interpose")
    table("stubs (the interposer's own cost)", STUBS, args.calls, args.repeats)
    if (EMULATOR / "libcudart.so.13").exists():
        table("CPU device emulator", EMULATOR, args.emulator_calls, args.repeats)
    if args.runtime:
        table("runtime", args.runtime, args.calls, args.repeats)


if __name__ == "__main__":
    main()
