#!/usr/bin/env python3
"""Steady-state overhead of transparent mode (every CUDA/NCCL call through the device proxy) against
the same program run directly: examples/cuda_mlp on the CPU device emulator, at several kernel sizes.

    make -C benchmarks/transparent            # proxy, remote library, emulator, cuda_mlp, kernel_time
    python3 benchmarks/transparent/overhead.py [--quick] [--batches 32 256 1024] [--ranks 1 2] [--reps 5]

What it runs, per configuration (batch B samples per rank per step, R ranks):

- "direct": R processes of examples/cuda_mlp/build/mlp against emulator/build's libcudart/libnccl;
- "remote": the same, each started by its own proxy (jitckpt-proxy --socket S -- mlp ...: the proxy
  preloads interpose/build/libjitckpt_remote.so into mlp and executes every CUDA runtime and NCCL call
  it forwards through the shared-memory ring).

Both variants load the kernels' host twins from examples/cuda_mlp/build/libmlp_twins.so
(JITCKPT_SIMDEV_KERNELS), so the kernel code is the same object in both; the ranks meet through a
rendezvous file.  The two variants alternate (direct, remote, direct, remote, ...: the repetitions are
the outer loop, so each configuration's runs are spread over the whole invocation), and every run must
end with the same final parameter checksum as the configuration's direct runs.

Timing: rank 0 prints "[rank 0] step N loss ..." (line-buffered) at step 1, every K steps and at the
last step; each of those steps waits for its loss, i.e. for the device.  The script stamps each line as
it arrives and takes the per-step time of a run as (t(last step) - t(first stamped step >= warm-up)) /
(steps between): process start-up, registration, NCCL set-up and the warm-up steps are excluded.  A
table gives per configuration the median per-step time of each variant, the median of the per-pair
ratios remote/direct (and its min, max) and the ratio of the medians.

Kernel sizes: build/kernel_time BATCH launches each of the six kernels alone (the same wrappers, grid
and twins as mlp) and reports the median of cudaEventElapsedTime between events recorded just before
and after it (on the emulator: the stream's worker thread running the twin) and the host's wall time
for launch + cudaStreamSynchronize, directly and through a proxy.  The forward_hidden and
backward_hidden kernels scale with B (B x 64 x 32 multiply-adds each); Adam (2177 parameters) does not.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
KERNEL_TIME = HERE / "build" / "kernel_time"


def use_tree(root: Path) -> None:
    """The builds measured: this checkout's, or another tree's (--root), e.g. a `git archive` of a commit."""
    global ROOT, MLP, TWINS, PROXY, REMOTE_LIB, EMULATOR
    ROOT = root.resolve()
    MLP = ROOT / "examples" / "cuda_mlp" / "build" / "mlp"
    TWINS = ROOT / "examples" / "cuda_mlp" / "build" / "libmlp_twins.so"
    PROXY = ROOT / "proxy_server" / "build" / "jitckpt-proxy"
    REMOTE_LIB = ROOT / "interpose" / "build" / "libjitckpt_remote.so"
    EMULATOR = ROOT / "emulator" / "build"


use_tree(HERE.parents[1])
VARIANTS = ("direct", "remote")

# Steps per run at batch 32, scaled by 32/B (at least MIN_STEPS): about 1-2 s of steady state per run
# on the 2-core VM, direct.
STEPS_AT_32 = 5000
MIN_STEPS = 300

STEP_LINE = re.compile(r"^\[rank 0\] step (\d+) loss ")
CHECKSUM = re.compile(r"\[rank (\d+)\] final parameters checksum ([0-9a-f]+)")
REPORTED = re.compile(r"^mlp: (\d+) steps in ([0-9.]+) s")


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JITCKPT_", "LD_")) and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["LD_LIBRARY_PATH"] = str(EMULATOR)
    env["JITCKPT_SIMDEV_KERNELS"] = str(TWINS)
    return env


def steps_for(batch: int, scale: float) -> int:
    return max(MIN_STEPS, int(STEPS_AT_32 * 32 / batch * scale) // 10 * 10)


def run_job(variant: str, batch: int, ranks: int, steps: int, tmp: Path) -> dict:
    """One run of `ranks` ranks; returns the per-step seconds of rank 0's stamped window and the checksums."""
    log_every = max(1, steps // 10)
    warmup = log_every               # the first stamped step: steps 1..K are warm-up
    run_dir = Path(tempfile.mkdtemp(prefix=f"{variant}-b{batch}-r{ranks}-", dir=tmp))
    (run_dir / "rv").mkdir()
    procs, errs = [], []
    usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    for rank in range(ranks):
        env = dict(base_env(), RANK=str(rank), WORLD_SIZE=str(ranks), LOCAL_RANK=str(rank))
        cmd = [str(MLP), "--steps", str(steps), "--batch", str(batch), "--log-every", str(log_every),
               "--rendezvous-dir", str(run_dir / "rv")]
        if variant == "remote":
            cmd = [str(PROXY), "--socket", str(run_dir / f"rank{rank}.sock"), "--", *cmd]
        err = open(run_dir / f"rank{rank}.err", "w+")
        errs.append(err)
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=err, text=True, bufsize=1))
    stamps: list[tuple[int, float]] = []
    outs = [""] * ranks

    def drain(i: int) -> None:
        outs[i] = procs[i].stdout.read()

    readers = [threading.Thread(target=drain, args=(i,), daemon=True) for i in range(1, ranks)]
    for t in readers:
        t.start()
    lines = []
    for line in procs[0].stdout:             # rank 0: stamp each line as it arrives
        now = time.perf_counter()
        lines.append(line)
        m = STEP_LINE.match(line)
        if m:
            stamps.append((int(m.group(1)), now))
    outs[0] = "".join(lines)
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=600))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    for t in readers:
        t.join()
    usage1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    stderr = []
    for err in errs:
        err.seek(0)
        stderr.append(err.read())
        err.close()
    if any(codes):
        sys.exit(f"{variant} run (batch {batch}, {ranks} ranks) failed: exit codes {codes}\n"
                 + "\n".join(f"--- rank {i} stdout\n{o}\n--- rank {i} stderr\n{e}"
                             for i, (o, e) in enumerate(zip(outs, stderr))))
    window = [(s, t) for s, t in stamps if s >= warmup]
    if len(window) < 2 or window[-1][0] != steps:
        sys.exit(f"{variant} run (batch {batch}, {ranks} ranks): rank 0 did not print its step lines:\n{outs[0]}")
    (s0, t0), (s1, t1) = window[0], window[-1]
    checksums = {int(r): c for o in outs for r, c in CHECKSUM.findall(o)}
    reported = REPORTED.search(outs[0], re.M)
    return {"variant": variant, "batch": batch, "ranks": ranks, "steps": steps, "timed_steps": s1 - s0,
            "step_s": (t1 - t0) / (s1 - s0), "checksums": checksums,
            "reported_total_s": float(reported.group(2)) if reported else None,
            # every process of the run (ranks, proxies, supervisors), start-up included
            "cpu_s": (usage1.ru_utime - usage0.ru_utime) + (usage1.ru_stime - usage0.ru_stime),
            "context_switches": (usage1.ru_nvcsw - usage0.ru_nvcsw) + (usage1.ru_nivcsw - usage0.ru_nivcsw)}


def kernel_times(batch: int, tmp: Path, reps: int) -> dict:
    """build/kernel_time BATCH directly and through a proxy: {kernel: (event_us, sync_us, proxy_sync_us)}."""
    out = {}
    for variant in VARIANTS:
        cmd = [str(KERNEL_TIME), str(batch), str(reps)]
        if variant == "remote":
            cmd = [str(PROXY), "--socket", str(tmp / f"kt-{batch}-{time.monotonic_ns()}.sock"), "--", *cmd]
        proc = subprocess.run(cmd, env=base_env(), capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            sys.exit(f"kernel_time {batch} ({variant}) failed:\n{proc.stdout}\n{proc.stderr}")
        for line in proc.stdout.splitlines():
            name, event_us, sync_us = line.split()
            out.setdefault(name, {})[variant] = (float(event_us), float(sync_us))
    return {name: {"event_us": v["direct"][0], "sync_us": v["direct"][1], "proxy_event_us": v["remote"][0],
                   "proxy_sync_us": v["remote"][1]} for name, v in out.items()}


def calls_per_step(batch: int, steps: int, tmp: Path) -> dict | None:
    """cudaEventQuery polls per step (1 rank): a separate, untimed run with the proxy's --verbose (one stderr
    line "NAME -> RESULT" per call it executes, kernel launches excepted), divided by the steps."""
    env = dict(base_env(), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    cmd = [str(PROXY), "--verbose", "--socket", str(tmp / f"calls-{batch}-{time.monotonic_ns()}.sock"), "--",
           str(MLP), "--steps", str(steps), "--batch", str(batch), "--log-every", "0"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        return None
    calls = re.findall(r"\]: (\w+) -> ", proc.stderr)
    return {"calls": round(len(calls) / steps, 1), "polls": round(calls.count("cudaEventQuery") / steps, 1)}


def describe_tree(root: Path) -> str:
    """The commit of the measured tree, and whether its native sources differ from it (read-only git)."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--", "proxy_server", "interpose",
                                "emulator", "examples/cuda_mlp"], capture_output=True, text=True).stdout.strip()
        return f"{root} at {head}" + (" with uncommitted changes in proxy_server/interpose/emulator" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        commit = root / ".commit"
        return f"{root} ({commit.read_text().strip() if commit.exists() else 'not a git checkout'})"


def machine() -> dict:
    model = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"nproc": os.cpu_count(), "cpu": model, "kernel": platform.release(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}


def pool(files: list[dict]) -> dict:
    """Several invocations' --json as one: each configuration's runs (direct, remote pairs) concatenated."""
    out = dict(files[0], configs=[], reps=sum(f["reps"] for f in files))
    out["machine"] = dict(files[0]["machine"], date=" / ".join(f["machine"]["date"] for f in files))
    out["load_before"] = " / ".join(f["load_before"] for f in files)
    out["load_after"] = " / ".join(f["load_after"] for f in files)
    out["tree"] = " / ".join(sorted({f["tree"] for f in files}))
    by_key: dict[tuple[int, int], dict] = {}
    for f in files:
        for cfg in f["configs"]:
            key = (cfg["batch"], cfg["ranks"])
            if key not in by_key:
                by_key[key] = dict(cfg, runs=[])
                out["configs"].append(by_key[key])
            if cfg["checksums"] != by_key[key]["checksums"] or cfg["steps"] != by_key[key]["steps"]:
                sys.exit(f"batch {key[0]}, {key[1]} ranks: the files ran different steps or got different checksums")
            by_key[key]["runs"].extend(cfg["runs"])
    return out


def print_tables(data: dict) -> None:
    m = data["machine"]
    print(f"\n{m['date']}, nproc {m['nproc']}, {m['cpu']}; load average {data['load_before']} before, "
          f"{data['load_after']} after; {data['reps']} interleaved pairs per configuration")
    print(f"builds measured: {data['tree']}")
    if data.get("kernels"):
        print("\nKernel time on the emulator (median of kernel_time's launches; µs)\n")
        print("| batch | kernel | stream time (events) | launch + sync, direct | launch + sync, through the proxy |")
        print("|------:|--------|---------------------:|----------------------:|---------------------------------:|")
        for batch, kernels in data["kernels"].items():
            for name, k in kernels.items():
                print(f"| {batch} | `{name}` | {k['event_us']:.1f} | {k['sync_us']:.1f} | {k['proxy_sync_us']:.1f} |")
            total = sum(k["event_us"] for k in kernels.values())
            print(f"| {batch} | **all six, one step** | **{total:.0f}** (mean {total / len(kernels):.0f} per kernel) "
                  "| | |")
    if data.get("calls_per_step"):
        print("\ncudaEventQuery polls per step through the proxy (1 rank, an untimed run with --verbose): "
              + ", ".join(f"batch {b}: {c['polls']}" if isinstance(c, dict)
                          else f"batch {b}: {(c or 0) - 19:.0f} (from the call log's count, older --json)"
                          for b, c in data["calls_per_step"].items())
              + ".  Besides them mlp makes 19 calls per step (the copy, 6 launches and their cudaGetLastError "
              "checks, 3 event records, 2 stream waits, the all-reduce); it polls while it waits for the device, "
              "and through the proxy each poll is a synchronous round trip.")
    print("\nPer-step time of examples/cuda_mlp (ms; median over runs [min, max]) and overhead of remote\n")
    print("| batch | ranks | pairs | timed steps | direct ms/step | remote ms/step | remote/direct, median of pairs [min, max] "
          "| ratio of medians | ratio of best runs | CPU ms/step direct, remote (whole run, all processes) | checksums |")
    print("|------:|------:|------:|------------:|---------------:|---------------:|------------------------------------------|"
          "-----------------:|-------------------:|------------------------------------------------------:|-----------|")
    for cfg in data["configs"]:
        d = [r["step_s"] * 1e3 for r in cfg["runs"] if r["variant"] == "direct"]
        x = [r["step_s"] * 1e3 for r in cfg["runs"] if r["variant"] == "remote"]
        ratios = [b / a for a, b in zip(d, x)]
        cpu = {v: statistics.median(1e3 * r["cpu_s"] / r["steps"] for r in cfg["runs"] if r["variant"] == v)
               for v in VARIANTS}
        print(f"| {cfg['batch']} | {cfg['ranks']} | {len(ratios)} | {cfg['runs'][0]['timed_steps']} "
              f"| {statistics.median(d):.3f} [{min(d):.3f}, {max(d):.3f}] "
              f"| {statistics.median(x):.3f} [{min(x):.3f}, {max(x):.3f}] "
              f"| **{statistics.median(ratios):.3f}** [{min(ratios):.3f}, {max(ratios):.3f}] "
              f"| {statistics.median(x) / statistics.median(d):.3f} | {min(x) / min(d):.3f} "
              f"| {cpu['direct']:.3f}, {cpu['remote']:.3f} "
              f"| {cfg['checksums']} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[32, 256, 1024],
                        help="samples per rank per step (kernel work scales with it); default 32 256 1024")
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="rank counts; default 1 2")
    parser.add_argument("--reps", type=int, default=5, help="interleaved direct/remote pairs per configuration")
    parser.add_argument("--steps-scale", type=float, default=1.0,
                        help=f"multiplies the steps per run ({STEPS_AT_32} at batch 32, scaled by 32/batch)")
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 pairs, a third of the steps (~20 s)")
    parser.add_argument("--no-kernels", action="store_true", help="skip the kernel-time table")
    parser.add_argument("--json", type=Path, help="write the raw figures here")
    parser.add_argument("--root", type=Path,
                        help="measure the builds of this source tree instead of this checkout's (e.g. git archive "
                        "HEAD | tar -x -C DIR; make -C DIR/proxy_server; make -C DIR/examples/cuda_mlp)")
    parser.add_argument("--from-json", type=Path, nargs="+", metavar="FILE",
                        help="print the tables of earlier --json files, pooled (runs of the same batch and ranks "
                        "together, kernel times of the first file), without running anything")
    args = parser.parse_args()
    if args.from_json:
        print_tables(pool([json.loads(f.read_text()) for f in args.from_json]))
        return 0
    if args.root:
        use_tree(args.root)
    if args.quick:
        args.reps, args.steps_scale = 2, args.steps_scale / 3
    for needed in (MLP, TWINS, PROXY, REMOTE_LIB, EMULATOR / "libcudart.so.13", KERNEL_TIME):
        if not needed.exists():
            sys.exit(f"missing {needed}: build first with make -C benchmarks/transparent"
                     + (f" (and in {ROOT}: make -C proxy_server; make -C examples/cuda_mlp)" if args.root else ""))

    started = time.perf_counter()
    data = {"machine": machine(), "tree": describe_tree(ROOT),
            "load_before": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "reps": args.reps, "kernels": {}, "configs": []}
    with tempfile.TemporaryDirectory(prefix="jitckpt-transparent-bench-") as tmp_name:
        tmp = Path(tmp_name)
        if not args.no_kernels:
            for batch in args.batches:
                data["kernels"][batch] = kernel_times(batch, tmp, 50 if not args.quick else 20)
        data["calls_per_step"] = {b: calls_per_step(b, min(300, steps_for(b, 1.0)), tmp) for b in args.batches}
        configs = [{"batch": b, "ranks": r, "steps": steps_for(b, args.steps_scale), "runs": [], "checksums": ""}
                   for b in args.batches for r in args.ranks]
        data["configs"] = configs
        for rep in range(args.reps):
            for cfg in configs:
                for variant in VARIANTS:
                    run = run_job(variant, cfg["batch"], cfg["ranks"], cfg["steps"], tmp)
                    cfg["runs"].append(run)
                    print(f"rep {rep + 1}/{args.reps} batch {cfg['batch']:>5} ranks {cfg['ranks']} {variant:>6}: "
                          f"{run['step_s'] * 1e3:8.3f} ms/step ({run['timed_steps']} steps)", flush=True)
        for cfg in configs:
            sums = {tuple(sorted(r["checksums"].items())) for r in cfg["runs"]}
            first = cfg["runs"][0]["checksums"]
            if len(sums) != 1 or len(first) != cfg["ranks"] or len(set(first.values())) != 1:
                sys.exit(f"batch {cfg['batch']}, {cfg['ranks']} ranks: final checksums differ between runs or ranks: "
                         f"{[r['checksums'] for r in cfg['runs']]}")
            cfg["checksums"] = "same, " + next(iter(cfg["runs"][0]["checksums"].values()))
    data["load_after"] = " ".join(f"{x:.1f}" for x in os.getloadavg())
    data["wall_s"] = round(time.perf_counter() - started, 1)
    print_tables(data)
    print(f"\n({data['wall_s']} s)")
    if args.json:
        args.json.write_text(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
