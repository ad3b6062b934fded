"""How long does a transparent recovery take, and where does the time go?  The paper's Table 7.

``examples/cuda_mlp``, 3 ranks under torchrun, each rank a worker with the remote library and its own
device proxy (spawn mode), on the CPU emulator.  Each case injects one failure in the middle of training
(as ``tests/test_proxy_recovery.py`` does), and every rank prints one line when it has recovered
(``interpose/remote/recover.c``)::

    rank 2: recovered in 5760 ms (stop 4, new proxy 19, rendezvous 5627, communicator 108, replica copy 1 ms
    for 55572 bytes, replay 2 ms of 13 calls): resumed at minibatch 8, root rank 0; the oldest collective had
    waited 2103 ms when the recovery began

This script runs each case ``--reps`` times, checks that the run ended with the fault-free checksum, and
prints the median seconds per step for the failed rank, in the form of Table 7 (rows: steps; columns:
cases), plus the whole job's wall time against a fault-free run.

    python benchmarks/transparent/recovery.py            # 5 cases x 2 reps, ~3-5 min on 2 cores
    python benchmarks/transparent/recovery.py --reps 1
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROXY = ROOT / "proxy_server" / "build" / "jitckpt-proxy"
MLP = ROOT / "examples" / "cuda_mlp" / "build" / "mlp"
TWINS = ROOT / "examples" / "cuda_mlp" / "build" / "libmlp_twins.so"
EMULATOR = ROOT / "emulator" / "build"

LINE = re.compile(r"rank (\d): recovered in (\d+) ms \(stop (\d+), (health check|new proxy) (\d+), rendezvous (\d+), "
                  r"communicator (\d+), replica copy (\d+) ms for (\d+) bytes, replay (\d+) ms of (\d+) calls\)"
                  r".*waited (\d+) ms")
CHECKSUM = re.compile(r"final parameters checksum ([0-9a-f]+)")

# name, failed rank, JITCKPT_SIMDEV_FAULT (or None: SIGKILL that rank's proxy), steps
CASES = [
    ("hang in all-reduce", 1, "rank=1,op=ncclAllReduce,call=9,kind=hang", 13),
    ("sticky error", 2, "rank=2,op=ncclAllReduce,call=9,kind=sticky", 13),
    ("lost device", 0, "rank=0,op=mlp_forward_hidden,call=9,kind=lost", 13),
    ("optimizer step", 2, "rank=2,op=mlp_adam,call=9,kind=sticky", 13),
    ("proxy SIGKILL", 1, None, 40),
]
ROWS = [  # label, group of LINE (milliseconds)
    ("detect: the oldest collective had waited", 12),
    ("stop: abort communicators, drop queued work", 3),
    ("health check, or a new proxy with every allocation re-created", 5),
    ("rendezvous through torchrun's store", 6),
    ("recreate NCCL communicator", 7),
    ("replica copy (reset GPU buffers)", 8),
    ("replay minibatch APIs", 10),
    ("total, from the start of the recovery", 2),
]


def run(workdir: Path, fault: str | None, steps: int, kill_rank: int | None, hang_timeout: float) -> tuple[float, str]:
    workdir.mkdir(parents=True)
    wrapper = workdir / "rank.sh"
    wrapper.write_text(f'#!/bin/sh\nexec {PROXY} --socket {workdir}/proxy-$RANK.sock -- "$@"\n')
    wrapper.chmod(0o755)
    env = dict(os.environ, LD_LIBRARY_PATH=str(EMULATOR), JITCKPT_SIMDEV_KERNELS=str(TWINS),
               JITCKPT_PYTHON=sys.executable, JITCKPT_HANG_TIMEOUT=str(hang_timeout),
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("JITCKPT_SIMDEV_FAULT", None)
    if fault:
        env["JITCKPT_SIMDEV_FAULT"] = fault
    if kill_rank is not None:
        env["JITCKPT_SIMDEV_FAULT"] = "op=ncclAllReduce,kind=slow,delay_ms=150"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3", "--max-restarts",
           "0", "--no-python", str(wrapper), str(MLP), "--steps", str(steps), "--rendezvous-dir", str(workdir)]
    started = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    if kill_rank is not None:
        for line in p.stdout:                       # mid-run: once rank 0 has logged step 10
            seen.append(line)
            if line.startswith("[rank 0] step 10 "):
                break
        kill_proxy(workdir / f"proxy-{kill_rank}.sock")
    out, _ = p.communicate(timeout=600)
    out = "".join(seen) + out
    elapsed = time.monotonic() - started
    if p.returncode != 0:
        raise SystemExit(f"the job failed (exit {p.returncode}):\n{out[-3000:]}")
    return elapsed, out


def kill_proxy(socket: Path) -> None:
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            ppid = int(next(x for x in (entry / "status").read_text().splitlines() if x.startswith("PPid:")).split()[1])
            parent = Path(f"/proc/{ppid}/cmdline").read_bytes().split(b"\0")
        except (OSError, StopIteration, ValueError):
            continue
        if args[0].endswith(b"jitckpt-proxy") and str(socket).encode() in args and parent[0].endswith(b"jitckpt-proxy"):
            os.kill(int(entry.name), signal.SIGKILL)
            return


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--hang-timeout", type=float, default=2.0, help="JITCKPT_HANG_TIMEOUT for the runs (seconds)")
    args = ap.parse_args()
    for need in (PROXY, MLP, TWINS):
        if not need.exists():
            raise SystemExit(f"{need} is missing: make -C proxy_server && make -C examples/cuda_mlp")
    work = Path(tempfile.mkdtemp(prefix="jitckpt-recovery-bench-"))
    reference: dict[int, str] = {}
    baseline: dict[int, list[float]] = {}
    figures: dict[str, list[dict[int, float]]] = {name: [] for name, *_ in CASES}
    walls: dict[str, list[float]] = {name: [] for name, *_ in CASES}
    for rep in range(args.reps):
        for steps in sorted({c[3] for c in CASES}):       # fault-free, interleaved with the faulty runs
            slow = "op=ncclAllReduce,kind=slow,delay_ms=150" if steps == 40 else None   # as the SIGKILL case
            wall, out = run(work / f"ref-{steps}-{rep}", slow, steps, None, args.hang_timeout)
            reference[steps] = CHECKSUM.findall(out)[0]
            baseline.setdefault(steps, []).append(wall)
        for name, rank, fault, steps in CASES:
            wall, out = run(work / f"{name.replace(' ', '-')}-{rep}", fault, steps,
                            rank if fault is None else None, args.hang_timeout)
            sums = set(CHECKSUM.findall(out))
            if sums != {reference[steps]}:
                raise SystemExit(f"{name}: checksums {sums} differ from the fault-free {reference[steps]}")
            lines = {int(m.group(1)): m for m in LINE.finditer(out)}
            if set(lines) != {0, 1, 2}:
                raise SystemExit(f"{name}: not every rank recovered:\n{out[-3000:]}")
            m = lines[rank]
            figures[name].append({group: float(m.group(group)) / 1e3 for _, group in ROWS})
            walls[name].append(wall)
            print(f"rep {rep + 1}: {name}: bit-exact, rank {rank} recovered in {int(m.group(2))} ms", flush=True)

    def med(name: str, group: int) -> float:
        return statistics.median(f[group] for f in figures[name])

    print()
    print(f"Transparent recovery, seconds, failed rank, median of {args.reps} "
          f"(examples/cuda_mlp, 3 ranks, CPU emulator, JITCKPT_HANG_TIMEOUT={args.hang_timeout:g})")
    print()
    print("| step | " + " | ".join(name for name, *_ in CASES) + " |")
    print("| --- | " + " | ".join("---:" for _ in CASES) + " |")
    for label, group in ROWS:
        cells = [f"{med(name, group):.3f}" for name, *_ in CASES]
        print(f"| {label} | " + " | ".join(cells) + " |")
    print("| job wall time / fault-free | " + " | ".join(
        f"{statistics.median(walls[n]):.1f} / {statistics.median(baseline[s]):.1f}" for n, _, _, s in CASES) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
