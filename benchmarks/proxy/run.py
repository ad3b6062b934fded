#!/usr/bin/env python3
"""Asynchronous calls per second through the device proxy (transparent mode) vs directly.

    make -C benchmarks/proxy && python3 benchmarks/proxy/run.py [--calls N] [--repeats R]

Runs build/bench_async on the CPU device emulator directly and through
proxy_server/build/jitckpt-proxy (the request ring; and, with --sync, also with
JITCKPT_REMOTE_SYNC=1: every call a round trip, as in milestone 1), alternating
R times, and prints per operation the best calls/s of each.  On a GPU host,
--runtime DIR runs against the libraries in DIR instead (e.g. the directory of
the real libcudart.so.13 and libnccl.so.2; the proxy is then given --cudart).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BENCH = HERE / "build" / "bench_async"
TWINS = HERE / "build" / "libbench_twins.so"
PROXY = ROOT / "proxy_server" / "build" / "jitckpt-proxy"
EMULATOR = ROOT / "emulator" / "build"


def run(variant: str, calls: int, lib_dir: Path, real: bool) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JITCKPT_", "LD_"))}
    env["LD_LIBRARY_PATH"] = str(lib_dir)
    cmd = [str(BENCH), str(calls)]
    with tempfile.TemporaryDirectory() as tmp:
        if variant != "direct":
            if not real:
                env["JITCKPT_SIMDEV_KERNELS"] = str(TWINS)
            if variant == "proxy, every call a round trip":
                env["JITCKPT_REMOTE_SYNC"] = "1"
            extra = ["--cudart", str(lib_dir / "libcudart.so.13")] if real else []
            cmd = [str(PROXY), "--socket", str(Path(tmp) / "bench.sock"), *extra, "--", *cmd]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        sys.exit(f"bench_async failed ({variant}):\n{proc.stdout}\n{proc.stderr}")
    out = {}
    for line in proc.stdout.splitlines():
        op, rate = line.rsplit(" ", 1)
        out[op] = float(rate)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300000, help="calls per operation and run")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sync", action="store_true", help="also run with JITCKPT_REMOTE_SYNC=1")
    parser.add_argument("--runtime", type=Path, help="run against the libraries in this directory")
    args = parser.parse_args()
    if not BENCH.exists() or not PROXY.exists():
        sys.exit("build first: make -C benchmarks/proxy")
    lib_dir = args.runtime or EMULATOR
    variants = ["direct", "proxy (request ring)"] + (["proxy, every call a round trip"] if args.sync else [])
    best: dict[str, dict[str, float]] = {v: {} for v in variants}
    for _ in range(args.repeats):
        for v in variants:
            calls = args.calls if v != "proxy, every call a round trip" else max(args.calls // 10, 1000)
            for op, rate in run(v, calls, lib_dir, args.runtime is not None).items():
                best[v][op] = max(rate, best[v].get(op, 0.0))
    print(f"{lib_dir} ({args.calls} calls per operation, best of {args.repeats}; calls/s)")
    head = "".join(f" | {v:>30}" for v in variants)
    print(f"| {'operation':<36}{head} | proxy / direct |")
    print(f"|{'-' * 38}" + "".join(f"|{'-' * 32}" for _ in variants) + f"|{'-' * 16}|")
    for op, direct in best["direct"].items():
        cells = "".join(f" | {best[v][op]:>30,.0f}" for v in variants)
        print(f"| {op:<36}{cells} | {best['proxy (request ring)'][op] / direct:>14.2f} |")


if __name__ == "__main__":
    main()
