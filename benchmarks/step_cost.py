"""jitckpt's own cost per training step, measured in one process against plain DDP (in-process A/B).

``overhead.py`` compares whole jobs, and on a shared 2-core machine two jobs
differ by more than jitckpt costs.  Here each worker of one jit-run job trains
two identical models side by side and alternates between them in blocks of
steps, so both see the same machine load:

- ``jitckpt``: the DDP model jitckpt instruments (its Python gradient comm
  hook with watchdog tracking and error parking; the optimizer hooks with the
  per-minibatch RNG stash; phase tracking).  Its optimizer steps first, so it
  is the one whose steps count as minibatches.
- ``plain DDP``: the same model with DDP's built-in C++ all-reduce hook
  registered up front, so jitckpt leaves its gradients alone.  Its optimizer
  steps still pass through jitckpt's global optimizer hooks, which return at
  once for a non-primary optimizer (a few microseconds).

The difference is jitckpt's per-step cost.  CPU time is the whole process's
(``time.process_time``: the training thread plus gloo's threads).

    python benchmarks/step_cost.py                # 2 ranks, the overhead.py workload
    python benchmarks/step_cost.py --nproc 4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BENCH_DIR = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH_DIR))

import harness  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, default=2, help="ranks (default 2: one per core here)")
    p.add_argument("--blocks", type=int, default=60, help="timed blocks per variant")
    p.add_argument("--block-steps", type=int, default=5, help="steps per block")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--accum", type=int, default=2)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out-dir", help=argparse.SUPPRESS)
    return p.parse_args()


def worker(args: argparse.Namespace) -> None:
    """One rank: both models, alternating blocks, per-block CPU and wall time."""
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    import jitckpt
    from workload import mlp_job  # the example's job (workload.py puts examples/ on sys.path)

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    job_args = argparse.Namespace(hidden=args.hidden, layers=args.layers, dropout=0.1, batchnorm=False,
                                  batch=args.batch, accum=args.accum, seed=1)
    variants = {}
    for name in ("jitckpt", "plain DDP"):
        model, optimizer, scheduler = mlp_job.build(job_args, rank)  # the same initial model both times
        ddp = DDP(model)
        if name == "plain DDP":
            ddp._register_builtin_comm_hook(dist.BuiltinCommHookType.ALLREDUCE)
        variants[name] = (ddp, optimizer, scheduler)
    jitckpt.register_save_checkpoint(lambda path: None)
    assert jitckpt.current_step() is not None, "run this through jit-run (python benchmarks/step_cost.py does)"
    loss_fn = nn.MSELoss()

    def step(name: str, index: int) -> None:
        ddp, optimizer, scheduler = variants[name]
        mlp_job.train_step(job_args, ddp, optimizer, loss_fn, index, rank)
        scheduler.step()

    step("jitckpt", 0)  # its optimizer steps first: the primary one, whose steps are minibatches
    step("plain DDP", 0)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
    index = 1
    for block in range(args.blocks + 4):
        order = ("jitckpt", "plain DDP") if block % 2 == 0 else ("plain DDP", "jitckpt")
        for name in order:
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(args.block_steps):
                step(name, index)
                index += 1
            if block >= 4:  # warm-up blocks are not timed
                samples[name].append(((time.process_time() - cpu) / args.block_steps,
                                      (time.perf_counter() - wall) / args.block_steps))
    result = {"rank": rank, "samples": samples, "jitckpt_minibatches": jitckpt.current_step()}
    (Path(args.out_dir) / f"rank-{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def main() -> int:
    args = parse_args()
    if args.worker:
        worker(args)
        return 0
    harness.log(harness.machine_summary())
    with tempfile.TemporaryDirectory(prefix="jitckpt-stepcost-") as tmp:
        cmd = [*harness.jit_run(), "--checkpoint-dir", str(Path(tmp) / "ckpt"),
               "torchrun", "--standalone", "--nproc_per_node", str(args.nproc), str(Path(__file__).resolve()), "--worker",
               "--blocks", str(args.blocks), "--block-steps", str(args.block_steps), "--hidden", str(args.hidden),
               "--layers", str(args.layers), "--batch", str(args.batch), "--accum", str(args.accum), "--out-dir", tmp]
        env = harness.job_env()
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH_DIR), env.get("PYTHONPATH", "")) if p)
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=harness.REPO)
        records = [json.loads(f.read_text()) for f in Path(tmp).glob("rank-*.json")]
    if proc.returncode != 0 or len(records) != args.nproc:
        print(proc.stdout[-3000:] + proc.stderr[-3000:], file=sys.stderr)
        harness.log(f"FAILED: exit status {proc.returncode}, {len(records)} of {args.nproc} ranks reported")
        return 1

    rows, diffs_cpu, diffs_wall, base_cpu, base_wall = [], [], [], [], []
    for record in sorted(records, key=lambda r: r["rank"]):
        jit, plain = record["samples"]["jitckpt"], record["samples"]["plain DDP"]
        cpu_diff = [1e3 * (j[0] - p[0]) for j, p in zip(jit, plain)]
        wall_diff = [1e3 * (j[1] - p[1]) for j, p in zip(jit, plain)]
        plain_cpu = statistics.median(1e3 * p[0] for p in plain)
        plain_wall = statistics.median(1e3 * p[1] for p in plain)
        diffs_cpu += cpu_diff
        diffs_wall += wall_diff
        base_cpu.append(plain_cpu)
        base_wall.append(plain_wall)
        rows.append([record["rank"], f"{plain_wall:.2f}", f"{statistics.median(1e3 * j[1] for j in jit):.2f}",
                     f"{statistics.median(wall_diff):+.3f}", f"{plain_cpu:.2f}", f"{statistics.median(1e3 * j[0] for j in jit):.2f}",
                     f"{statistics.median(cpu_diff):+.3f}", record["jitckpt_minibatches"]])
    print(f"\njitckpt's cost per training step, in-process A/B: {args.nproc} ranks, MLP hidden {args.hidden} x {args.layers} "
          f"layers, batch {args.batch} x accum {args.accum}, {args.blocks} alternating blocks of {args.block_steps} steps per variant\n")
    print(harness.table(["rank", "plain wall ms/step", "jitckpt wall ms/step", "wall diff ms (median)",
                         "plain CPU ms/step", "jitckpt CPU ms/step", "CPU diff ms (median)", "minibatches counted"], rows))
    cpu_cost, wall_cost = statistics.median(diffs_cpu), statistics.median(diffs_wall)
    quartiles = statistics.quantiles(diffs_cpu, n=4)
    print(f"\njitckpt per step and rank: CPU {cpu_cost:+.3f} ms (interquartile {quartiles[0]:+.3f} .. {quartiles[2]:+.3f}), "
          f"wall {wall_cost:+.3f} ms")
    print(f"relative to plain DDP: CPU {100 * cpu_cost / statistics.median(base_cpu):+.2f}%, "
          f"wall {100 * wall_cost / statistics.median(base_wall):+.2f}%")
    harness.log(harness.machine_summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
