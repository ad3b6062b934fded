"""What does one lost rank cost a sharded job: jitckpt's memory tier against periodic DCP checkpoints?

The FSDP2 job of ``memory_tier.py`` (``sharded_job.py``), its last rank
SIGKILLed by the script itself after its backward of minibatch ``--die``,
interleaved rep by rep:

- ``torchrun, no failure``: the reference (wall time and final parameters);
- ``jit-run, no failure``: the job under jit-run with nothing failing (what
  jit-run costs by itself: its snapshots, its standbys);
- ``jit-run (memory tier)``: the job under jit-run as a user runs it; the
  lost rank's shard comes back from host memory, one minibatch redone;
- ``torchrun + DCP every K``: what a user does without jitckpt: a
  ``torch.distributed.checkpoint`` save of the sharded state every K
  minibatches on disk, torchrun ``--max-restarts 1``, and the restart loads
  the newest complete one.

Each job's wall time includes everything its way of working costs: the
snapshots or the periodic saves while nothing fails, the detection, the
restart, the load, and the minibatches redone.  "Lost to the failure" is a
job's wall time minus the fault-free torchrun run's of the same rep; "of
which the failure itself" subtracts instead the same launcher's fault-free
run (jit-run's for jit-run, torchrun's for DCP, whose periodic saves then
count as the failure's price).  Every job must
end with the fault-free run's parameters (checked: the benchmark fails
otherwise).  Machines are noisy: compare the ratios of one invocation.

    python benchmarks/sharded_recovery.py               # ~8 min on 2 cores
    python benchmarks/sharded_recovery.py --steps 200 --die 160 --dcp-every 50 100
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

JOB = harness.BENCH_DIR / "sharded_job.py"


def variants(args: argparse.Namespace) -> list[str]:
    return ["torchrun, no failure", "jit-run, no failure", "jit-run (memory tier)",
            *(f"torchrun + DCP every {k}" for k in args.dcp_every)]


def command(variant: str, args: argparse.Namespace, work: Path) -> list[str]:
    job = [str(JOB), "--steps", str(args.steps), "--hidden", str(args.hidden), "--layers", str(args.layers),
           "--batch", str(args.batch)]
    launch = ["--standalone", "--nproc_per_node", str(args.nproc), "--max-restarts", "1"]
    if variant == "torchrun, no failure":
        return [*harness.torchrun(), *launch, *job]
    if variant != "jit-run, no failure":
        job += ["--die", str(args.die)]
    if variant.startswith("jit-run"):
        return [*harness.jit_run(), "--checkpoint-dir", str(work / "ckpt"), "torchrun", *launch, *job]
    every = variant.rsplit(" ", 1)[1]
    # torch 2.13's torchrun restarts a gloo job only with the workers' own store (as jit-run sets it too)
    return ["env", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1", *harness.torchrun(), *launch, *job, "--dcp-every", every,
            "--dcp-dir", str(work / "dcp")]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--die", type=int, default=48, help="the minibatch in whose backward the last rank dies")
    p.add_argument("--dcp-every", type=int, nargs="+", default=[10, 25])
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--log-dir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    args = p.parse_args()
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-sharded-recovery-"))
    harness.log(f"logs in {log_dir}")
    names = variants(args)
    wall: dict[str, list[float]] = {v: [] for v in names}
    lost: dict[str, list[float]] = {v: [] for v in names}
    resumed: dict[str, list[int]] = {v: [] for v in names}
    for rep in range(args.reps):
        reference_sha, reference_wall = None, None
        for variant in names:
            name = f"{variant.replace(', ', '-').replace(' + ', '-').replace(' ', '-')}-{rep}"
            work = log_dir / f"work-{name}"
            run = harness.require_ok(harness.run_job(name, command(variant, args, work), log_dir))
            sha = run.one("final")["sha256"]
            if reference_sha is None:
                reference_sha, reference_wall = sha, run.wall_seconds
            elif sha != reference_sha:
                raise SystemExit(f"{name} ended with other parameters than the fault-free run ({log_dir})")
            wall[variant].append(run.wall_seconds)
            lost[variant].append(run.wall_seconds - reference_wall)
            resumed[variant] += [e["step"] for e in run.of("resumed")]
            harness.log(f"{name}: {run.wall_seconds:.1f} s")
    base = statistics.median(lost["jit-run (memory tier)"])
    rows = []
    for v in names:
        failing = "no failure" not in v
        redone = "-" if not resumed[v] else f"{statistics.median(args.die + 1 - s for s in resumed[v]):.0f}"
        ratio = f"{statistics.median(lost[v]) / base:.2f}x" if failing and base > 0 else "-"
        own = "jit-run, no failure" if v.startswith("jit-run") else "torchrun, no failure"
        itself = [w - o for w, o in zip(wall[v], wall[own])]
        rows.append([v, harness.spread(wall[v], "{:.1f}"),
                     harness.spread(lost[v], "{:.1f}") if v != "torchrun, no failure" else "-",
                     harness.spread(itself, "{:.1f}") if failing else "-",
                     "-" if not resumed[v] else ", ".join(sorted({str(s) for s in resumed[v]})), redone, ratio])
    print(f"\n{harness.machine_summary()}")
    print(f"FSDP2 MLP {args.layers}x{args.hidden}, batch {args.batch}, {args.nproc} ranks, gloo, {args.steps} "
          f"minibatches, last rank killed after its backward of minibatch {args.die} ({args.reps} reps, "
          f"interleaved); every run ended with the fault-free parameters\n")
    print(harness.table(["variant", "wall s, median [min, max]", "lost to the failure, s",
                         "of which the failure itself, s", "resumed at", "minibatches redone", "lost vs jit-run"], rows))
    if args.json:
        args.json.write_text(json.dumps({"wall": wall, "lost": lost, "resumed": resumed, "args": vars(args) | {
            "log_dir": str(log_dir), "json": str(args.json)}}, indent=1, default=str))


if __name__ == "__main__":
    main()
