"""What does the memory tier cost a sharded job when nothing fails?

The same FSDP2 job (``sharded_job.py``: an MLP, every Linear ``fully_shard``-ed,
Adam, gloo on CPU) three ways, interleaved rep by rep:

- ``torchrun``: plain torchrun, no jitckpt;
- ``jit-run, tier off``: jit-run with ``--memory-tier off`` (jitckpt's hooks, no snapshots);
- ``jit-run, tier auto``: jit-run as a user runs it (FSDP2: a snapshot of each rank's shard
  into host memory at every minibatch's start, by the job's own save).

Prints per-step time (rank 0, after the warm-up; median [min, max] over the
reps' medians), the ratio to plain torchrun, and the host memory the tier
holds per rank (its two snapshots).  Machines are noisy: compare the ratios
of one invocation only.

    python benchmarks/memory_tier.py                 # ~3 min on 2 cores
    python benchmarks/memory_tier.py --batch 512     # more compute per step
    python benchmarks/memory_tier.py --hosts 2       # two "hosts": every snapshot also copied to the other
    python benchmarks/memory_tier.py --hosts 4 --nproc 4 --schemes replicate,xor,rs   # each scheme across hosts
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

JOB = harness.BENCH_DIR / "sharded_job.py"
def variants(args: argparse.Namespace) -> list[str]:
    """torchrun, jit-run with the tier off, and jit-run with the tier on (one per redundancy scheme across hosts)."""
    tiers = ["jit-run, tier auto"] if args.hosts == 1 else [f"jit-run, tier auto, {s}" for s in args.schemes.split(",")]
    return ["torchrun", "jit-run, tier off", *tiers]


def command(variant: str, args: argparse.Namespace, ckpt: Path) -> list[str]:
    job = [str(JOB), "--steps", str(args.steps), "--hidden", str(args.hidden), "--layers", str(args.layers),
           "--batch", str(args.batch)]
    tier = "off" if variant.endswith("off") else "auto"
    wrap = [] if variant == "torchrun" else harness.jit_run() + ["--checkpoint-dir", str(ckpt), "--memory-tier", tier]
    if variant.startswith("jit-run, tier auto, "):
        wrap += ["--memory-redundancy", variant.rsplit(", ", 1)[1]]
    if args.hosts == 1:
        return [*wrap, *harness.torchrun(), "--standalone", "--nproc_per_node", str(args.nproc), *job]
    # Several "hosts" on this machine: one agent each (its own jit-run and shared memory), one c10d rendezvous.
    port = harness.free_port()
    agents = [shlex.join([*wrap, *harness.torchrun(), "--nnodes", str(args.hosts), "--nproc_per_node",
                          str(args.nproc // args.hosts), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                          f"127.0.0.1:{port}", "--rdzv-id", f"bench-{port}", *job]) for _ in range(args.hosts)]
    script = "".join(f"{agent} & p{i}=$!; " for i, agent in enumerate(agents))
    script += "r=0; " + "".join(f"wait $p{i} || r=$?; " for i in range(len(agents))) + "exit $r"
    return ["bash", "-c", script]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--hosts", type=int, default=1, help="run each job as this many torchrun agents (\"hosts\") "
                   "on this machine, --nproc ranks in all: the tier then copies every snapshot to another host")
    p.add_argument("--schemes", default="replicate", help="with --hosts > 1: the redundancy schemes to compare, "
                   "comma-separated (replicate, xor, rs; default replicate)")
    p.add_argument("--log-dir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None, help="write the raw figures here")
    args = p.parse_args()
    log_dir = args.log_dir or Path(tempfile.mkdtemp(prefix="bench-memtier-"))
    harness.log(f"logs in {log_dir}")
    steps: dict[str, list[float]] = {v: [] for v in variants(args)}
    memory: dict[str, list[dict]] = {v: [] for v in variants(args)}
    for rep in range(args.reps):
        for variant in variants(args):
            name = f"{variant.replace(', ', '-').replace(' ', '-')}-{rep}"
            run = harness.run_job(name, command(variant, args, log_dir / f"ckpt-{name}"), log_dir)
            if run.returncode != 0 and args.hosts > 1 and run.of("final"):
                # torchrun's agents of several nodes on one machine sometimes abort at teardown, when the agent
                # that hosts the rendezvous store has gone first: the training itself had completed
                harness.log(f"{name}: exited with status {run.returncode} after training completed (teardown)")
            else:
                harness.require_ok(run)
            steps[variant].append(statistics.median(run.one("steps")["seconds"]))
            memory[variant] += run.of("memory")
            harness.log(f"{name}: {1000 * steps[variant][-1]:.1f} ms per step")
    base = statistics.median(steps["torchrun"])
    rows = [[v, harness.spread([1000 * s for s in steps[v]], "{:.1f}"), f"{statistics.median(steps[v]) / base:.3f}x"]
            for v in variants(args)]
    print(f"\n{harness.machine_summary()}")
    print(f"FSDP2 MLP {args.layers}x{args.hidden}, batch {args.batch}, {args.nproc} ranks on {args.hosts} host(s), gloo, "
          f"{args.steps} steps ({args.reps} reps, interleaved)\n")
    print(harness.table(["variant", "ms per step, median [min, max]", "vs torchrun"], rows))
    for variant, found in memory.items():
        if not found or "auto" not in variant:
            continue
        newest = statistics.median(m["newest"] for m in found)
        held = statistics.median(m["total"] for m in found)
        host = statistics.median(m.get("host_per_rank", m["total"]) for m in found)
        print(f"\n{variant}: memory tier per rank: one snapshot {newest / 2**20:.1f} MiB, own snapshots held "
              f"{held / 2**20:.1f} MiB ({statistics.median(m['snapshots'] for m in found):.0f}); the host's tier per "
              f"rank, copies or parities kept for other hosts included: {host / 2**20:.1f} MiB "
              f"({host / max(held, 1):.2f}x its own)")
    if args.json:
        args.json.write_text(json.dumps({"steps": steps, "memory": memory, "args": vars(args) | {
            "log_dir": str(log_dir), "json": str(args.json)}}, indent=1))


if __name__ == "__main__":
    main()
