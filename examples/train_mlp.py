"""A small data-parallel training job using jitckpt's two-line API (the demo and test workload).

Run it with jit-run (4 CPU ranks, gloo):

    jit-run torchrun --nproc_per_node 4 --max-restarts 3 examples/train_mlp.py --steps 60

It trains an MLP with dropout, Adam, a learning-rate schedule and gradient
accumulation.  Every batch is a pure function of (seed, step, micro-batch,
rank), and dropout draws from each rank's own seeded generator, so a run is
deterministic: after any recovery the final parameters must be bit-for-bit
those of a fault-free run.  Rank 0 prints a SHA-256 of the final parameters
(``final parameters sha256 HEX``), the training loop's time without start-up
and the first ``--warmup-steps`` (``train_mlp: N steps in S s (...)``) and,
with --out, saves the parameters.

The job itself (model, data, one optimizer step, the checksum) lives in
mlp_job.py next to this file, shared with the benchmarks; this file adds
jitckpt's two calls, the loop and its logging.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn

import jitckpt
from mlp_job import add_job_args, build, init_process_group, parameters_sha256, train_step, wrap_ddp


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_job_args(p)
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step (to mimic a slower model)")
    p.add_argument("--out", help="rank 0 saves the final parameters here")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--warmup-steps", type=int, default=5, help="steps left out of the timing line")
    p.add_argument("--deterministic", action="store_true",
                   help="torch.use_deterministic_algorithms(True), cuDNN benchmarking off (and CUBLAS_WORKSPACE_CONFIG "
                        ":4096:8 unless set): for bit-for-bit comparisons on a GPU")
    return p.parse_args()


def use_jitckpt(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: torch.optim.lr_scheduler.LRScheduler,
                progress: dict[str, int] | None = None) -> tuple[int, str | None]:
    """jitckpt's two calls: how to save (run only when a failure happens), and where to resume from.

    The checkpoint records ``jitckpt.current_step()``: the minibatch it resumes
    at, which is one ahead of the loop's own counter when the failure strikes a
    collective issued after ``optimizer.step()`` (an all-reduce of the loss for
    logging).  ``progress``: record ``progress["step"]``, the loop's own counter,
    instead (what many scripts do; tests use it to show that jitckpt stops such
    a resume rather than redo a minibatch twice).  Returns the minibatch to
    start at and the checkpoint it was loaded from (None: a fresh start).
    """

    def save(path: str) -> None:
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "step": jitckpt.current_step() if progress is None else progress["step"],
            },
            os.path.join(path, "state.pt"),
        )

    jitckpt.register_save_checkpoint(save)
    path = jitckpt.jit_get_checkpoint_path()
    if not path:
        return 0, None
    state = torch.load(os.path.join(path, "state.pt"))
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    return state["step"], path


def main() -> None:
    args = parse_args()
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before the first cuBLAS handle
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    init_process_group(args)
    rank, world = dist.get_rank(), dist.get_world_size()
    model, optimizer, scheduler = build(args, rank)
    start, path = use_jitckpt(model, optimizer, scheduler)
    if path and rank == 0:
        print(f"resumed at step {start} from {path}", flush=True)

    ddp = wrap_ddp(args, model)
    loss_fn = nn.MSELoss()
    t0 = time.time()
    cuda = args.device == "cuda"
    warm = min(args.warmup_steps, max(0, args.steps - start - 1))
    timer = time.perf_counter()
    for step in range(start, args.steps):
        if step == start + warm:  # the timing line leaves out start-up and the first steps
            if cuda:
                torch.cuda.synchronize()
            timer = time.perf_counter()
        loss = train_step(args, ddp, optimizer, loss_fn, step, rank)
        scheduler.step()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if rank == 0 and (step + 1) % args.log_every == 0:
            print(f"step {step + 1}/{args.steps} loss {loss.item() * args.accum:.5f} lr {scheduler.get_last_lr()[0]:.5f} "
                  f"({time.time() - t0:.1f}s)", flush=True)

    if cuda:
        torch.cuda.synchronize()
    seconds, timed = time.perf_counter() - timer, max(0, args.steps - start - warm)

    if rank == 0:
        print(f"final parameters sha256 {parameters_sha256(model)}", flush=True)
        per_step = f"{1000 * seconds / timed:.3f}" if timed else "nan"
        print(f"train_mlp: {timed} steps in {seconds:.4f} s ({per_step} ms/step, after {warm} warm-up steps)",
              flush=True)
        if args.out:
            torch.save(model.state_dict(), args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
