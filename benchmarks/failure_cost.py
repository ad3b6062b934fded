"""Cost of one failure: jitckpt vs periodic ``torch.save`` checkpoints, side by side.

The same 4-rank job (``workload.py``) loses rank 2 (SIGKILL) at the start of
minibatch ``--fail-step`` on its first attempt, and torchrun restarts it:

- ``jitckpt``:       ``jit-run --fault rank=2,step=S,phase=forward,kind=kill torchrun --max-restarts 3
                     train_jit.py`` (the healthy ranks save just in time, the job resumes at S);
- ``periodic-K``:    ``torchrun --max-restarts 1 train_periodic.py --ckpt-every K`` (rank 0 saves every
                     K steps, the job resumes from the newest save; the script itself kills rank 2);
- ``fault-free``:    ``torchrun train_periodic.py --ckpt-every 0`` with no failure (the reference
                     for "extra wall time", and for the bit-exactness check of jitckpt's result).

Measured per run, from the jobs' own time stamps (all processes share the
host clock): total wall time; the minibatch the job resumed at and the
minibatches redone (``S - resumed + 1``, the count jitckpt's report uses:
the minibatch in progress when the rank died counts as redone); recovery
time, failure -> first optimizer step of the restarted job, split into
"failure -> new workers start" and "worker start-up and checkpoint load";
time lost, failure -> minibatch S completed again; and for the periodic
baselines the time of each ``torch.save`` (amortized over K steps: their
steady-state cost when nothing fails).  Variants run interleaved, in a
rotating order, ``--reps`` times; ratios vs jitckpt are taken per repetition.

The baseline applies jitckpt's fix for torchrun's gloo restart bug itself
(see ``train_periodic.py``), otherwise its restart would fail.

    python benchmarks/failure_cost.py            # 3 repetitions of 4 jobs, ~12-15 minutes on 2 cores
    python benchmarks/failure_cost.py --quick    # smoke run, ~3 minutes
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

REFERENCE = "fault-free"
JIT = "jitckpt"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3, help="repetitions of each variant (default %(default)s)")
    p.add_argument("--steps", type=int, default=500, help="optimizer steps per job (default %(default)s)")
    p.add_argument("--fail-step", type=int, default=325,
                   help="minibatch at whose start rank --fail-rank dies (default %(default)s: 65%% of the run, "
                        "25 steps after a periodic-50 save and 125 after a periodic-200 save)")
    p.add_argument("--fail-rank", type=int, default=2)
    p.add_argument("--every", type=int, nargs="+", default=[50, 200],
                   help="checkpoint intervals of the periodic baselines (default %(default)s)")
    p.add_argument("--no-reference", action="store_true", help="skip the fault-free reference job")
    p.add_argument("--only", nargs="+", metavar="VARIANT",
                   help="run only these variants (fault-free, jitckpt, periodic-K); jitckpt is needed for ratios")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="smoke run: 1 repetition, 120 steps, failure at 75, K = 20, 50")
    p.add_argument("--log-dir", type=Path, help="keep job logs here (default: a new temporary directory)")
    p.add_argument("--json", type=Path, help="also write the raw per-run figures here")
    p.add_argument("--from-json", type=Path, nargs="+", metavar="FILE",
                   help="run nothing: print the tables of earlier --json outputs (several are pooled); "
                        "pass the workload flags those runs used")
    args = p.parse_args(argv)
    if args.quick:
        args.reps, args.steps, args.fail_step, args.every, args.warmup = 1, 120, 75, [20, 50], 5
    if not 0 < args.fail_step < args.steps or not 0 <= args.fail_rank < args.nproc or args.fail_rank == 0:
        p.error("need 0 < --fail-step < --steps and 0 < --fail-rank < --nproc (rank 0 reports the timings)")
    if any(k <= 0 for k in args.every):
        p.error("--every intervals must be positive")
    if args.only and not set(args.only) <= set(variants(args)):
        p.error(f"--only: unknown variant(s) {sorted(set(args.only) - set(variants(args)))}")
    return args


def variants(args: argparse.Namespace) -> list[str]:
    names = ([] if args.no_reference else [REFERENCE]) + [JIT] + [f"periodic-{k}" for k in args.every]
    return [n for n in names if not args.only or n in args.only]


def workload_args(args: argparse.Namespace, fail: bool = True) -> list[str]:
    out = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--hidden", str(args.hidden),
           "--layers", str(args.layers), "--batch", str(args.batch), "--accum", str(args.accum)]
    if fail:
        out += ["--fail-rank", str(args.fail_rank), "--fail-step", str(args.fail_step)]
    return out


def command(variant: str, args: argparse.Namespace, work: Path) -> list[str]:
    """The command line of one run of ``variant``; ``work`` is this run's scratch directory."""
    torchrun = [*harness.torchrun(), "--standalone", "--nproc_per_node", str(args.nproc)]
    if variant == JIT:
        fault = f"rank={args.fail_rank},step={args.fail_step},phase=forward,kind=kill"
        return [*harness.jit_run(), "--checkpoint-dir", str(work / "ckpt"),
                "--report", str(work / "report.json"), "--fault", fault,
                *torchrun, "--max-restarts", "3", str(harness.BENCH_DIR / "train_jit.py"), *workload_args(args)]
    periodic = str(harness.BENCH_DIR / "train_periodic.py")
    if variant == REFERENCE:
        return [*torchrun, "--max-restarts", "1", periodic, *workload_args(args, fail=False), "--ckpt-every", "0"]
    every = variant.split("-", 1)[1]
    return [*torchrun, "--max-restarts", "1", periodic, *workload_args(args),
            "--ckpt-dir", str(work / "ckpt"), "--ckpt-every", every]


def analyse(run: Run, variant: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The figures of one finished run (see the module docstring)."""
    last = max(e["attempt"] for e in run.of("loop_done"))
    done = run.one("loop_done", attempt=last)
    if done["start_step"] + done["steps_run"] != args.steps:
        raise RunFailed(f"{run.name}: ended at step {done['start_step'] + done['steps_run']}, not {args.steps}")
    result: dict[str, Any] = {
        "variant": variant,
        "wall_seconds": run.wall_seconds,
        "attempts": last + 1,
        "sha256": done["sha256"],
        "step_ms_median": done["step_ms_median"],
    }
    first_start = min(e.get("process_start") or e["script_start"] for e in run.of("script_start", attempt=0))
    result["launch_to_workers_seconds"] = first_start - run.started_at
    result["launch_to_first_step_seconds"] = run.one("first_step_done", attempt=0)["time"] - run.started_at
    result["last_step_to_exit_seconds"] = run.ended_at - done["time"]
    saves = run.of("periodic_save")
    result["saves"] = len(saves)
    result["save_ms_mean"] = 1e3 * sum(s["seconds"] for s in saves) / len(saves) if saves else None
    result["checkpoint_mb"] = saves[-1]["bytes"] / 1e6 if saves else None
    if variant == REFERENCE:
        return result
    if last != 1:
        raise RunFailed(f"{run.name}: expected exactly one restart, the job ran {last + 1} attempt(s) (logs: {run.log_dir})")
    failed_at = run.one("fail_now", attempt=0)["time"]
    # process creation (from /proc): jit-run's workers import torch before the script starts
    restarted = min(e.get("process_start") or e["script_start"] for e in run.of("script_start", attempt=1))
    loop_start = run.one("loop_start", attempt=1)
    first_step = run.one("first_step_done", attempt=1)["time"]
    caught_up = run.one("caught_up", attempt=1)["time"]
    pg_ready = max(e["time"] for e in run.of("pg_ready", attempt=1))
    state_ready = max(e["time"] for e in run.of("state_ready", attempt=1))
    result.update({
        "resumed_at": loop_start["start_step"],
        "restart_to_pg_seconds": pg_ready - restarted,
        "pg_to_state_seconds": state_ready - pg_ready,
        "state_to_first_step_seconds": first_step - state_ready,
        "redone": args.fail_step - loop_start["start_step"] + 1,
        "recovery_seconds": first_step - failed_at,
        "down_seconds": restarted - failed_at,
        "startup_seconds": first_step - restarted,
        "lost_seconds": caught_up - failed_at,
    })
    report_path = work / "report.json"
    if variant == JIT:
        if not report_path.exists():
            raise RunFailed(f"{run.name}: jit-run wrote no report (logs: {run.log_dir})")
        report = json.loads(report_path.read_text())
        f = report["failures"][0] if report["failures"] else {}
        result["report"] = {k: f.get(k) for k in ("detect_seconds", "save_seconds", "save_wall_seconds",
                                                   "restart_seconds", "resume_seconds", "minibatches_redone",
                                                   "resumed_from_minibatch")}
        result["report"]["outcome"] = report["outcome"]
        result["report"]["failures"] = report["summary"]["failures"]
    return result


def measure(variant: str, rep: int, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    name = f"{variant}-{rep}"
    work = log_dir / name
    work.mkdir(parents=True, exist_ok=True)
    run = harness.require_ok(harness.run_job(name, command(variant, args, work), log_dir))
    result = analyse(run, variant, args, work)
    result["rep"] = rep
    drop_checkpoints(work / "ckpt")
    return result


def drop_checkpoints(directory: Path) -> None:
    """Delete a run's checkpoints but keep jit-run's event logs (``.jitckpt/``) for inspection."""
    if directory.is_dir():
        for child in directory.iterdir():
            if child.name != ".jitckpt":
                shutil.rmtree(child) if child.is_dir() else child.unlink()


def _ratios(results: list[dict[str, Any]], variant: str, key: str) -> list[float]:
    """Per-repetition ratios variant/jitckpt of ``key``."""
    jit = {r["rep"]: r[key] for r in results if r["variant"] == JIT}
    return [r[key] / jit[r["rep"]] for r in results
            if r["variant"] == variant and r.get(key) is not None and jit.get(r["rep"])]


def _differences(results: list[dict[str, Any]], variant: str, key: str) -> list[float]:
    """Per-repetition differences variant - jitckpt of ``key``."""
    jit = {r["rep"]: r[key] for r in results if r["variant"] == JIT}
    return [r[key] - jit[r["rep"]] for r in results
            if r["variant"] == variant and r.get(key) is not None and jit.get(r["rep"]) is not None]


def render(results: list[dict[str, Any]], args: argparse.Namespace) -> str:
    """The result tables and the checks, as text."""
    names = variants(args)
    by = {v: [r for r in results if r["variant"] == v] for v in names}
    ref_wall = {r["rep"]: r["wall_seconds"] for r in by.get(REFERENCE, [])}
    for r in results:
        r["extra_wall_seconds"] = r["wall_seconds"] - ref_wall[r["rep"]] if r["rep"] in ref_wall else None
    ref_step_s = (harness.median(r["step_ms_median"] for r in by[REFERENCE]) / 1e3) if by.get(REFERENCE) else None

    def col(v: str, key: str, fmt: str = "{:.2f}") -> str:
        values = [r[key] for r in by[v] if r.get(key) is not None]
        return spread(values, fmt) if values else "-"

    rows = []
    for v in names:
        rows.append([v, len(by[v]), col(v, "wall_seconds", "{:.1f}"), col(v, "extra_wall_seconds", "{:.1f}"),
                     col(v, "resumed_at", "{:.0f}"), col(v, "redone", "{:.0f}"), col(v, "recovery_seconds"),
                     col(v, "down_seconds"), col(v, "startup_seconds"), col(v, "lost_seconds")])
    out = [
        f"one failure: rank {args.fail_rank} SIGKILLed at the start of minibatch {args.fail_step} of {args.steps}, "
        f"{args.nproc} ranks, MLP hidden {args.hidden} x {args.layers} layers, batch {args.batch} x accum {args.accum}; "
        f"{args.reps} repetition(s); cells are median [min, max]",
        "",
        table(["variant", "runs", "job wall s", "extra wall vs fault-free s", "resumed at", "minibatches redone",
               "recovery s (failure -> 1st step)", "failure -> workers restart s", "restart -> 1st step s",
               "failure -> minibatch S done again s"], rows),
        "",
    ]
    rows = []
    for v in names:
        saves = [r for r in by[v] if r.get("saves")]
        if v == REFERENCE or (v != JIT and not saves):
            continue
        if v == JIT:
            amortized, per_run, size, mean_ms = "- (no periodic saves)", "0", "-", "-"
        else:
            k = int(v.split("-", 1)[1])
            mean_ms = harness.median(r["save_ms_mean"] for r in saves)
            size = f"{harness.median(r['checkpoint_mb'] for r in saves):.1f}"
            per_run = f"{harness.median(r['saves'] for r in saves):.0f}"
            amortized = f"{100 * mean_ms / 1e3 / (k * ref_step_s):.2f}%" if ref_step_s else "-"
            mean_ms = f"{mean_ms:.1f}"
        rows.append([v, per_run, size, mean_ms, amortized, spread(_ratios(results, v, "wall_seconds")),
                     spread(_ratios(results, v, "recovery_seconds")), spread(_ratios(results, v, "lost_seconds")),
                     spread(_differences(results, v, "lost_seconds"), "{:+.1f}")])
    out += [
        table(["variant", "saves per run", "checkpoint MB", "mean torch.save ms", "amortized save cost per step",
               "wall ratio vs jitckpt", "recovery ratio vs jitckpt", "lost-time ratio vs jitckpt",
               "lost time minus jitckpt's s"], rows),
        "",
    ]
    rows = [[v, col(v, "startup_seconds"), col(v, "restart_to_pg_seconds"), col(v, "pg_to_state_seconds"),
             col(v, "state_to_first_step_seconds")] for v in names if v != REFERENCE]
    out += [
        "restarted workers, from process creation to the first optimizer step:",
        "",
        table(["variant", "restart -> 1st step s", "-> process group ready s", "-> state loaded s",
               "-> 1st step done s"], rows),
        "",
    ]
    rows = [[v, col(v, "launch_to_workers_seconds"), col(v, "launch_to_first_step_seconds"),
             col(v, "last_step_to_exit_seconds"), col(v, "step_ms_median", "{:.1f}")] for v in names]
    out += [
        "where the rest of the wall time goes (first attempt's start-up, and the end of the job):",
        "",
        table(["variant", "launch -> workers start s", "launch -> 1st step s", "last step -> job exit s",
               "median step ms (last attempt)"], rows),
        "",
    ]
    if ref_step_s:
        out.append(f"fault-free median step time {1e3 * ref_step_s:.1f} ms (amortized save cost = mean save / (K x step))")
    for r in by.get(JIT, []):
        rep = r.get("report", {})
        out.append(f"jit-run report, rep {r['rep']}: " + ", ".join(f"{k} {v}" for k, v in rep.items()))
    if by.get(REFERENCE):
        ref_shas = {r["sha256"] for r in by[REFERENCE]}
        jit_ok = all(r["sha256"] in ref_shas for r in by.get(JIT, []))
        out.append(f"jitckpt final parameters bit-identical to the fault-free run's: {'yes' if jit_ok else 'NO'}"
                   + ("" if len(ref_shas) == 1 else f" (the fault-free runs disagree among themselves: {len(ref_shas)} hashes)"))
        for v in names:
            if v.startswith("periodic-"):
                same = all(r["sha256"] in ref_shas for r in by[v])
                out.append(f"{v} final parameters bit-identical to the fault-free run's: {'yes' if same else 'no'}"
                           + ("" if same else " (expected: it does not restore each rank's dropout RNG)"))
    return "\n".join(out)


def load_results(paths: list[Path]) -> list[dict[str, Any]]:
    """Per-run figures from earlier --json outputs; repetitions of file i are renumbered i*1000+rep."""
    results = []
    for i, path in enumerate(paths):
        for r in json.loads(path.read_text())["runs"]:
            results.append(dict(r, rep=i * 1000 + r["rep"]))
    return results


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        results = load_results(args.from_json)
        args.reps = len({r["rep"] for r in results})
        names = variants(args)
        results = [r for r in results if r["variant"] in names]
        results.sort(key=lambda r: (names.index(r["variant"]), r["rep"]))
        print(render(results, args))
        return 0
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="jitckpt-failure-cost-"))
    log(f"machine: {harness.machine_summary()}")
    log(f"logs in {log_dir}")
    started = time.time()
    names = variants(args)
    results: list[dict[str, Any]] = []
    try:
        for rep in range(args.reps):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for variant in order:
                r = measure(variant, rep, args, log_dir)
                results.append(r)
                log(f"rep {rep} {variant}: wall {r['wall_seconds']:.1f}s"
                    + (f", resumed at {r['resumed_at']}, recovery {r['recovery_seconds']:.1f}s, "
                       f"lost {r['lost_seconds']:.1f}s" if "resumed_at" in r else ""))
    except RunFailed as exc:
        log(f"FAILED: {exc}")
        return 1
    results.sort(key=lambda r: (names.index(r["variant"]), r["rep"]))
    print(render(results, args))
    print(f"\ntotal benchmark time {time.time() - started:.0f}s; machine: {harness.machine_summary()}")
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
