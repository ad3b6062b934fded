#!/usr/bin/env python3
"""Per-step overhead of transparent mode for unmodified CUDA PyTorch jobs, and the device proxy's restart time.

    python3 benchmarks/transparent/pytorch_overhead.py [--pairs 3] [--steps 300] [--json FILE]

Needs a CUDA GPU and a CUDA build of torch (and the native parts: ``make -C proxy_server -j2``); elsewhere it
prints "skipped: needs a CUDA GPU" and exits 0.  Goals (the issue "Transparent mode runs an unmodified CUDA
PyTorch job on a real GPU"): per-step time under 1.03x the direct run's; a proxy restart under 1 s per GB of
device memory on an H100.

For each of examples/train_mlp.py, examples/tiny_gpt.py and examples/conv_bn.py (deterministic settings, 1
rank, ``--device cuda --backend nccl``):

- "direct": ``torchrun --standalone --nproc_per_node 1 SCRIPT ...``;
- "transparent": the user's command line, ``jit-run --transparent torchrun --standalone --nproc_per_node 1
  SCRIPT ...``: every CUDA runtime, cuBLAS and NCCL call through the device proxy.

The variants alternate (direct, transparent, ... for each model, the pairs as the outer loop).  Per-step time:
each script's own timing line (``NAME: N steps in S s``: the training loop after its warm-up steps, ended by a
device synchronisation; start-up excluded).  Every run must end with the model's direct checksum.  The table
gives per model the median per-step time of each variant, the median of the per-pair ratios
transparent/direct [min, max] and the ratio of the medians.

Restart: one more transparent run per model with ``JITCKPT_PROXY_GPU_VMM=1 JITCKPT_REMOTE_RESTART_AT=N`` (a
driver-suspect restart before the worker's Nth CUDA call), N placed at the middle step from the first
transparent run's call log (``JITCKPT_REMOTE_LOG_TRACE=1``: "call log: minibatch K ended: C calls").  The
remote library's line ``device proxy restarted (driver suspect): ... N allocations (B bytes), ... (T ms)``
gives the bytes copied out and back and the time; the run must still end with the direct checksum.

A transparent run that transparent mode stops (status 77 and a line naming the library or function, e.g. a
cuFFT call, a driver entry point) is reported with that line, and the script exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import harness  # noqa: E402

REPO = harness.REPO
SCRIPTS = ("train_mlp", "tiny_gpt", "conv_bn")
SHA = re.compile(r"final parameters sha256 ([0-9a-f]{64})")
RESTART = re.compile(r"device proxy restarted \(driver suspect\).*?(\d+) allocations \((\d+) bytes\).*\(([0-9.]+) ms\)")
TRACE = re.compile(r"call log: minibatch (\d+) ended: (\d+) calls")
STOPPED = re.compile(r".*(stopping the job|is not supported in transparent mode|^\[jit-run\] .*refus).*", re.M)


def cuda_available() -> tuple[bool, str]:
    try:
        import torch
    except ImportError:
        return False, "torch is not installed"
    if not torch.cuda.is_available():
        return False, f"torch {torch.__version__} sees no CUDA device"
    return True, f"torch {torch.__version__}, {torch.cuda.get_device_name(0)}"


def script_args(name: str, args: argparse.Namespace, log_every: int = 10**6) -> list[str]:
    extra = ["--deterministic"] if name == "train_mlp" else []
    return [str(REPO / "examples" / f"{name}.py"), "--device", "cuda", "--backend", args.backend,
            "--steps", str(args.steps), "--log-every", str(log_every), *extra]


def run(tag: str, cmd: list[str], log_dir: Path, timeout: float, env_extra: dict[str, str] | None = None) -> dict:
    """One job; returns its log text, exit status and wall time (the log is kept in log_dir)."""
    env = harness.job_env()
    for key in ("LD_PRELOAD", "JITCKPT_PROXY_GPU_VMM", "JITCKPT_REMOTE_RESTART_AT", "JITCKPT_REMOTE_LOG_TRACE"):
        env.pop(key, None)
    env["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    env.update(env_extra or {})
    log = log_dir / f"{tag}.log"
    (log_dir / f"{tag}.cmd").write_text(" ".join(f"{k}={v}" for k, v in (env_extra or {}).items()) + " " + " ".join(cmd) + "\n")
    started = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the job's own process group, nothing else
            proc.wait()
            code = -9
    text = log.read_text(errors="replace")
    return {"tag": tag, "code": code, "wall": time.perf_counter() - started, "text": text, "log": str(log)}


def ms_per_step(name: str, text: str) -> float | None:
    found = re.findall(rf"^{name}: (\d+) steps in ([0-9.]+) s", text, re.M)
    if not found or int(found[-1][0]) == 0:
        return None
    steps, seconds = found[-1]
    return 1000 * float(seconds) / int(steps)


def sha(text: str) -> str | None:
    found = SHA.findall(text)
    return found[-1] if found else None


def why_stopped(result: dict) -> str:
    found = STOPPED.search(result["text"])
    if found:
        return found.group(0).strip()[:300]
    lines = [line for line in result["text"].splitlines() if line.strip()]
    return f"exit {result['code']}: " + (lines[-1][:300] if lines else "no output")


def restart_call(text: str, steps: int) -> int | None:
    """The call number at the middle step, from a JITCKPT_REMOTE_LOG_TRACE=1 run (minibatch 0 holds the set-up)."""
    counts = {int(k): int(c) for k, c in TRACE.findall(text)}
    mid = steps // 2
    if mid not in counts or not all(k in counts for k in range(mid)):
        return None
    return sum(counts[k] for k in range(mid)) + counts[mid] // 2


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=3, help="interleaved direct/transparent pairs per model")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--models", nargs="+", default=list(SCRIPTS), choices=SCRIPTS)
    p.add_argument("--backend", default="nccl")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per run")
    p.add_argument("--restart-at", type=int, help="the restart's call number, instead of the middle-step estimate")
    p.add_argument("--log-dir", type=Path)
    p.add_argument("--json", type=Path, help="write the raw per-run figures here")
    args = p.parse_args()

    ok, what = cuda_available()
    if not ok:
        print(f"skipped: needs a CUDA GPU ({what})")
        return 0
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="jitckpt-pytorch-overhead-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    harness.log(f"{what}; logs in {log_dir}")
    torchrun = harness.torchrun()
    jit = harness.jit_run()
    one_rank = ["--standalone", "--nproc_per_node", "1"]

    figures: dict[str, dict] = {m: {"direct": [], "transparent": [], "sha": None, "stopped": None, "trace": None}
                                for m in args.models}
    for pair in range(1, args.pairs + 1):
        for model in args.models:
            f = figures[model]
            if f["stopped"]:
                continue
            direct = run(f"{model}-direct-{pair}", [*torchrun, *one_rank, *script_args(model, args)], log_dir, args.timeout)
            t, s = ms_per_step(model, direct["text"]), sha(direct["text"])
            if direct["code"] != 0 or t is None or s is None:
                f["stopped"] = f"direct run: {why_stopped(direct)}"
                continue
            if f["sha"] and s != f["sha"]:
                f["stopped"] = f"two direct runs differ ({f['sha'][:16]}, {s[:16]})"
                continue
            f["sha"] = s
            f["direct"].append(t)
            trace = {"JITCKPT_REMOTE_LOG_TRACE": "1"} if pair == 1 else None
            tr = run(f"{model}-transparent-{pair}",
                     [*jit, "--transparent", "torchrun", *one_rank, *script_args(model, args)], log_dir, args.timeout, trace)
            t, s = ms_per_step(model, tr["text"]), sha(tr["text"])
            if tr["code"] != 0 or t is None or s is None:
                f["stopped"] = why_stopped(tr)
            elif s != f["sha"]:
                f["stopped"] = f"transparent checksum {s[:16]}, direct {f['sha'][:16]}"
            else:
                f["transparent"].append(t)
                if pair == 1:
                    f["trace"] = tr["text"]
            harness.log(f"{model} pair {pair}: direct {f['direct'][-1]:.3f} ms/step, "
                        + (f"transparent {f['transparent'][-1]:.3f}" if not f["stopped"] else f"STOPPED: {f['stopped']}"))

    for model in args.models:
        f = figures[model]
        f["restart"] = None
        if f["stopped"] or not f["trace"]:
            continue
        at = args.restart_at or restart_call(f["trace"], args.steps)
        if at is None:
            f["restart"] = {"error": "no per-minibatch call counts in the call log trace (use --restart-at)"}
            continue
        r = run(f"{model}-restart", [*jit, "--transparent", "torchrun", *one_rank,
                                     *script_args(model, args, log_every=max(1, args.steps // 10))],
                log_dir, args.timeout, {"JITCKPT_PROXY_GPU_VMM": "1", "JITCKPT_REMOTE_RESTART_AT": str(at)})
        found = RESTART.search(r["text"])
        if not found:
            f["restart"] = {"at": at, "error": f"no restart ({why_stopped(r)})"}
        else:
            f["restart"] = {"at": at, "allocations": int(found.group(1)), "bytes": int(found.group(2)),
                            "ms": float(found.group(3)), "bit_exact": r["code"] == 0 and sha(r["text"]) == f["sha"]}

    print(f"\n{harness.machine_summary()}; {args.steps} steps, {args.pairs} pairs, 1 rank, backend {args.backend}\n")
    rows = []
    for model in args.models:
        f = figures[model]
        ratios = [b / a for a, b in zip(f["direct"], f["transparent"])]
        dm = statistics.median(f["direct"]) if f["direct"] else None
        tm = statistics.median(f["transparent"]) if f["transparent"] else None
        rows.append([model, harness.spread(f["direct"], "{:.3f}"), harness.spread(f["transparent"], "{:.3f}"),
                     harness.spread(ratios, "{:.3f}"), f"{tm / dm:.3f}" if dm and tm else None,
                     f"stopped: {f['stopped']}" if f["stopped"] else "ok"])
    print(harness.table(["model", "direct ms/step", "transparent ms/step", "ratio per pair", "ratio of medians",
                         "status"], rows))
    rows = []
    for model in args.models:
        r = figures[model]["restart"]
        if not r or "error" in r:
            rows.append([model, r.get("at") if r else None, None, None, None, None,
                         r["error"] if r else "not run (no transparent run)"])
            continue
        gb = r["bytes"] / 1e9
        rows.append([model, r["at"], f"{r['bytes'] / 2**20:.1f}", r["allocations"], f"{r['ms']:.0f}",
                     f"{r['ms'] / 1000 / gb:.2f}" if gb > 0 else None, "bit-exact" if r["bit_exact"] else "DIFFERS"])
    print()
    print(harness.table(["model", "restart before call", "device memory (MiB)", "allocations", "restart (ms)",
                         "s per GB", "result"], rows))
    if args.json:
        args.json.write_text(json.dumps({m: {k: v for k, v in f.items() if k != "trace"} for m, f in figures.items()},
                                        indent=1))
    failed = any(f["stopped"] or not f["restart"] or "error" in f["restart"] or not f["restart"]["bit_exact"]
                 for f in figures.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
