"""Restart time and job CPU with and without warm start: failure until the first redone minibatch is done, side by side.

The demo job (``examples/train_mlp.py``, 4 gloo ranks) under jit-run loses
rank 2 (SIGKILL in the backward pass of minibatch ``--fail-step``), and
torchrun restarts the workers:

- ``warm``: ``jit-run --warm-restart on``: every worker is forked from the
  agent's template interpreter, which imported torch once
  (``jitckpt.launch.warm_start``);
- ``cold``: ``jit-run --warm-restart off``: torchrun spawns fresh interpreters.

Measured per run, from jit-run's own recovery report: ``restart`` (the last
JIT save until the restarted workers' jitckpt runtimes exist) plus
``resume`` (until the first redone minibatch is done), the figure warm
restart is meant to cut; also detect + save, and how many restarted workers
were warm, and the CPU seconds of the whole job (every process of it).  The
job sleeps ``--step-sleep`` per step (in the earlier design the standbys
started warming after the first minibatch).  The variants alternate (warm, cold,
cold, warm, ...) ``--pairs`` times, and the ratio cold/warm is taken per pair.
Every run's final parameters must be the same (bit-exact recovery either way).

    python benchmarks/restart_time.py              # 5 pairs, ~7-8 minutes on 2 busy cores
    python benchmarks/restart_time.py --pairs 1    # smoke run
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
from harness import REPO, RunFailed, log, spread, table

VARIANTS = ("warm", "cold")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=5, help="warm/cold pairs, interleaved (default %(default)s)")
    p.add_argument("--steps", type=int, default=210, help="minibatches per job (default %(default)s)")
    p.add_argument("--fail-step", type=int, default=200,
                   help="minibatch in whose backward pass rank 2 is killed (default %(default)s)")
    p.add_argument("--step-sleep", type=float, default=0.1,
                   help="extra seconds per step (default %(default)s)")
    p.add_argument("--nproc", type=int, default=4)
    p.add_argument("--log-dir", type=Path, help="keep job logs here (default: a new temporary directory)")
    p.add_argument("--json", type=Path, help="also write the raw per-run figures here")
    p.add_argument("--from-json", type=Path, nargs="+", metavar="FILE",
                   help="run nothing: print the tables of earlier --json outputs (several are pooled)")
    args = p.parse_args(argv)
    if not 0 < args.fail_step < args.steps or args.pairs < 1:
        p.error("need 0 < --fail-step < --steps and --pairs >= 1")
    return args


def command(variant: str, args: argparse.Namespace, work: Path) -> list[str]:
    fault = f"rank=2,step={args.fail_step},phase=backward,kind=kill"
    return [*harness.jit_run(), "--checkpoint-dir", str(work / "ckpt"), "--report", str(work / "report.json"),
            "--hang-timeout", "10", "--warm-restart", "on" if variant == "warm" else "off", "--fault", fault,
            *harness.torchrun(), "--standalone", "--nproc_per_node", str(args.nproc), "--max-restarts", "3",
            str(REPO / "examples" / "train_mlp.py"), "--steps", str(args.steps), "--step-sleep", str(args.step_sleep),
            "--log-every", "1000"]


def measure(variant: str, pair: int, args: argparse.Namespace, log_dir: Path) -> dict[str, Any]:
    name = f"{variant}-{pair}"
    work = log_dir / name
    work.mkdir(parents=True, exist_ok=True)
    run = harness.require_ok(harness.run_job(name, command(variant, args, work), log_dir))
    report = json.loads((work / "report.json").read_text())
    if len(report["failures"]) != 1:
        raise RunFailed(f"{name}: expected one failure in the report, got {len(report['failures'])} (logs: {log_dir})")
    f = report["failures"][0]
    if f["restart_seconds"] is None or f["resume_seconds"] is None:
        raise RunFailed(f"{name}: the report has no restart/resume times (logs: {log_dir})")
    output = (log_dir / f"{name}.out").read_text(errors="replace") + (log_dir / f"{name}.err").read_text(errors="replace")
    sha = re.findall(r"final parameters sha256 ([0-9a-f]{64})", output)
    shutil.rmtree(work / "ckpt" / f"step-{args.fail_step:08d}", ignore_errors=True)
    return {
        "variant": variant, "pair": pair, "wall_seconds": run.wall_seconds,
        "restart_seconds": f["restart_seconds"], "resume_seconds": f["resume_seconds"],
        "restart_resume_seconds": f["restart_seconds"] + f["resume_seconds"],
        "detect_save_seconds": (f["detect_seconds"] or 0.0) + (f["save_wall_seconds"] or 0.0),
        "warm_workers": len(f.get("warm_ranks", [])), "restarted_workers": f.get("restarted_ranks"),
        "redone": f["minibatches_redone"], "sha256": sha[-1] if sha else None, "cpu_seconds": run.cpu_seconds,
    }


def tables(results: list[dict[str, Any]]) -> str:
    rows = []
    for variant in VARIANTS:
        rs = [r for r in results if r["variant"] == variant]
        if not rs:
            continue
        warm = sorted({f"{r['warm_workers']}/{r['restarted_workers']}" for r in rs})
        rows.append([variant, len(rs), spread([r["restart_resume_seconds"] for r in rs]),
                     spread([r["restart_seconds"] for r in rs]), spread([r["resume_seconds"] for r in rs]),
                     spread([r["detect_save_seconds"] for r in rs]), ", ".join(warm),
                     spread([r["wall_seconds"] for r in rs], "{:.1f}"),
                     spread([r.get("cpu_seconds", 0.0) for r in rs], "{:.1f}")])
    out = [table(["variant", "runs", "restart + resume s (median [min, max])", "restart s", "resume s",
                  "detect + save s", "warm workers", "job wall s", "job CPU s"], rows)]
    by_pair: dict[int, dict[str, float]] = {}
    for r in results:
        by_pair.setdefault(r["pair"], {})[r["variant"]] = r["restart_resume_seconds"]
    ratios = [p["cold"] / p["warm"] for p in by_pair.values() if "cold" in p and "warm" in p]
    cpu_by_pair: dict[int, dict[str, float]] = {}
    for r in results:
        cpu_by_pair.setdefault(r["pair"], {})[r["variant"]] = r.get("cpu_seconds", 0.0)
    cpu_ratios = [p["cold"] / p["warm"] for p in cpu_by_pair.values() if p.get("warm") and "cold" in p]
    if ratios:
        out.append("")
        out.append(table(["per-pair ratio cold / warm", "of", "pairs", "median [min, max]"],
                         [[", ".join(f"{x:.2f}" for x in ratios), "restart + resume", len(ratios), spread(ratios)],
                          [", ".join(f"{x:.2f}" for x in cpu_ratios), "job CPU", len(cpu_ratios), spread(cpu_ratios)]]))
    shas = {r["sha256"] for r in results}
    out.append("")
    out.append(f"final parameters: {'all ' + str(len(results)) + ' runs identical' if len(shas) == 1 and None not in shas else 'DIFFER: ' + str(sorted(map(str, shas)))}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.from_json:
        results = [r for path in args.from_json for r in json.loads(path.read_text())["results"]]
        print(tables(results))
        return 0
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="restart-time-"))
    log(f"machine: {harness.machine_summary()}; logs in {log_dir}")
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    results = []
    try:
        for pair in range(args.pairs):
            order = VARIANTS if pair % 2 == 0 else VARIANTS[::-1]
            for variant in order:
                result = measure(variant, pair, args, log_dir)
                results.append(result)
                log(f"pair {pair} {variant}: restart {result['restart_seconds']:.2f}s + resume {result['resume_seconds']:.2f}s, "
                    f"{result['warm_workers']}/{result['restarted_workers']} warm, job {result['wall_seconds']:.1f}s")
    except RunFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.json and results:
            args.json.write_text(json.dumps({"started": started, "machine": harness.machine_summary(),
                                             "args": {k: str(v) for k, v in vars(args).items()}, "results": results}, indent=1))
    print(f"Measured {started} to {time.strftime('%H:%M:%S %Z')}; {harness.machine_summary()}\n")
    print(tables(results))
    return 0 if len({r["sha256"] for r in results}) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
