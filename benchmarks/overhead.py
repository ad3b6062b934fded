"""Steady-state overhead of jitckpt's user-level mode: the same job with and without jit-run.

Both variants run ``benchmarks/train_jit.py`` (a 4-rank DDP MLP with Adam
that uses ``register_save_checkpoint`` / ``jit_get_checkpoint_path`` like
``examples/train_mlp.py``) with the same torchrun arguments:

- ``plain``:   ``torchrun ... train_jit.py``  (jitckpt is a no-op there)
- ``jit-run``: ``jit-run --checkpoint-dir D torchrun ... train_jit.py``

Only the training loop is timed, by the job itself (rank 0, the steps after
``--warmup``), so process start-up is left out.  The variants run interleaved
(the order alternates each repetition: plain, jit, jit, plain, ...) so that
drift in the machine's load hits both; the overhead is the median of the
per-repetition ratios jit/plain, minus one, with the smallest and largest
ratio as its spread.

    python benchmarks/overhead.py            # 5 repetitions, ~6-8 minutes on 2 cores
    python benchmarks/overhead.py --quick    # smoke run, ~2 minutes
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from harness import Run, RunFailed, log, spread, table

VARIANTS = ("plain", "jit-run")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=5, help="repetitions of each variant (default %(default)s)")
    p.add_argument("--steps", type=int, default=300, help="optimizer steps per run (default %(default)s)")
    p.add_argument("--warmup", type=int, default=20, help="steps left out of the timed loop (default %(default)s)")
    p.add_argument("--nproc", type=int, default=4, help="ranks (default %(default)s)")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="smoke run: 2 repetitions of 60 steps")
    p.add_argument("--log-dir", type=Path, help="keep job logs here (default: a new temporary directory)")
    p.add_argument("--json", type=Path, help="also write the raw per-run figures here")
    p.add_argument("--from-json", type=Path, nargs="+", metavar="FILE",
                   help="run nothing: print the table of earlier --json outputs (several are pooled); "
                        "pass the workload flags those runs used")
    args = p.parse_args(argv)
    if args.quick:
        args.reps, args.steps, args.warmup = 2, 60, 10
    if args.reps < 1 or args.steps <= args.warmup + 1:
        p.error("need --reps >= 1 and --steps > --warmup + 1")
    return args


def workload_args(args: argparse.Namespace) -> list[str]:
    return ["--steps", str(args.steps), "--warmup", str(args.warmup), "--hidden", str(args.hidden),
            "--layers", str(args.layers), "--batch", str(args.batch), "--accum", str(args.accum)]


def command(variant: str, args: argparse.Namespace, work: Path) -> list[str]:
    """The command line of one run of ``variant``; ``work`` is this run's scratch directory."""
    job = [*harness.torchrun(), "--standalone", "--nproc_per_node", str(args.nproc), "--max-restarts", "3",
           str(harness.BENCH_DIR / "train_jit.py"), *workload_args(args)]
    if variant == "plain":
        return job
    return [*harness.jit_run(), "--checkpoint-dir", str(work / "ckpt"),
            "--report", str(work / "report.json"), *job]


def measure(variant: str, rep: int, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    """Run one job and return its loop timing."""
    name = f"{variant}-{rep}"
    work = log_dir / name
    work.mkdir(parents=True, exist_ok=True)
    run: Run = harness.require_ok(harness.run_job(name, command(variant, args, work), log_dir))
    done = run.one("loop_done")
    if done["loop_seconds"] is None:
        raise RunFailed(f"{name}: no timed steps (logs: {log_dir})")
    cpu = [e["cpu_seconds"] for e in run.of("loop_cpu")]
    if len(cpu) != args.nproc or None in cpu:
        raise RunFailed(f"{name}: expected loop_cpu from {args.nproc} ranks, got {cpu} (logs: {log_dir})")
    result = {
        "variant": variant,
        "cpu_ms_per_step": 1e3 * sum(cpu) / done["steps_timed"],
        "rep": rep,
        "wall_seconds": run.wall_seconds,
        "loop_seconds": done["loop_seconds"],
        "steps_timed": done["steps_timed"],
        "step_ms_median": done["step_ms_median"],
        "sha256": done["sha256"],
    }
    report = work / "report.json"
    if report.exists():
        summary = json.loads(report.read_text())["summary"]
        result["jitckpt_minibatch_seconds"] = summary["minibatch_seconds"]
        result["jitckpt_failures"] = summary["failures"]
    shutil.rmtree(work / "ckpt", ignore_errors=True)  # (a fault-free run leaves nothing of interest there)
    return result


def render(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The results table, the overhead line and the determinism check."""
    by = {v: [r for r in results if r["variant"] == v] for v in VARIANTS}
    rows = []
    for v in VARIANTS:
        loops = [r["loop_seconds"] for r in by[v]]
        steps = by[v][0]["steps_timed"]
        rows.append([
            v, len(loops), spread(loops), f"{harness.median(loops) / steps * 1e3:.1f}",
            spread([r["step_ms_median"] for r in by[v]], "{:.1f}"),
            spread([r["cpu_ms_per_step"] for r in by[v] if "cpu_ms_per_step" in r], "{:.1f}"),
            spread([r["wall_seconds"] for r in by[v]], "{:.1f}"),
        ])
    ratios = [j["loop_seconds"] / p["loop_seconds"] for p, j in zip(by["plain"], by["jit-run"])]
    lines = [
        f"steady-state overhead of jit-run, {args.nproc} ranks x {args.steps} steps "
        f"(timed: steps {args.warmup + 1}..{args.steps}), MLP hidden {args.hidden} x {args.layers} layers, "
        f"batch {args.batch} x accum {args.accum}",
        "",
        table(["variant", "runs", "loop s: median [min, max]", "ms/step (median loop)",
               "median step ms [min, max]",
               "CPU ms/step, all ranks [min, max]", "job wall s (incl. start-up)"], rows),
        "",
        "per-pair ratio of loop times jit-run/plain: " + ", ".join(f"{x:.4f}" for x in ratios),
        f"overhead = median ratio - 1 = {100 * (harness.median(ratios) - 1):+.2f}% "
        f"(min {100 * (min(ratios) - 1):+.2f}%, max {100 * (max(ratios) - 1):+.2f}%)",
    ]
    step_ratios = [j["step_ms_median"] / p["step_ms_median"] for p, j in zip(by["plain"], by["jit-run"])]
    lines.append(
        f"same from each run's median step time (less sensitive to load spikes): "
        f"{100 * (harness.median(step_ratios) - 1):+.2f}% "
        f"(min {100 * (min(step_ratios) - 1):+.2f}%, max {100 * (max(step_ratios) - 1):+.2f}%)"
    )
    cpu_ratios = [j["cpu_ms_per_step"] / p["cpu_ms_per_step"] for p, j in zip(by["plain"], by["jit-run"])
                  if "cpu_ms_per_step" in p and "cpu_ms_per_step" in j]
    if cpu_ratios:
        lines.append(
            f"same from CPU time per step, summed over ranks (least sensitive to other jobs): "
            f"{100 * (harness.median(cpu_ratios) - 1):+.2f}% "
            f"(min {100 * (min(cpu_ratios) - 1):+.2f}%, max {100 * (max(cpu_ratios) - 1):+.2f}%, {len(cpu_ratios)} pairs)"
        )
    if len({r["rep"] // 1000 for r in results}) > 1:
        lines.append(f"(pooled from {len({r['rep'] // 1000 for r in results})} invocations, {len(ratios)} pairs)")
    shas = {r["sha256"] for r in results}
    lines.append(
        "final parameters identical in all runs of both variants: "
        + ("yes" if len(shas) == 1 else f"NO ({len(shas)} distinct hashes: "
           + ", ".join(f"{r['variant']}-{r['rep']}={r['sha256'][:12]}" for r in results) + ")")
    )
    reported = [r["jitckpt_minibatch_seconds"] for r in by["jit-run"] if r.get("jitckpt_minibatch_seconds")]
    if reported:
        lines.append(f"jitckpt's own report, summary.minibatch_seconds (median): {1e3 * harness.median(reported):.1f} ms")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        results = [dict(r, rep=i * 1000 + r["rep"])
                   for i, path in enumerate(args.from_json) for r in json.loads(path.read_text())["runs"]]
        results.sort(key=lambda r: (r["variant"], r["rep"]))
        print(render(results, args))
        return 0
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="jitckpt-overhead-"))
    log(f"machine: {harness.machine_summary()}")
    log(f"logs in {log_dir}")
    started = time.time()
    results: list[dict[str, Any]] = []
    try:
        for rep in range(args.reps):
            order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                results.append(measure(variant, rep, args, log_dir))
                r = results[-1]
                log(f"rep {rep} {variant}: loop {r['loop_seconds']:.2f}s ({r['steps_timed']} steps), "
                    f"wall {r['wall_seconds']:.1f}s")
    except RunFailed as exc:
        log(f"FAILED: {exc}")
        return 1
    results.sort(key=lambda r: (r["variant"], r["rep"]))
    print(render(results, args))
    print(f"\ntotal benchmark time {time.time() - started:.0f}s; machine: {harness.machine_summary()}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
