"""What examples/tiny_gpt.py and examples/conv_bn.py share: their common options, deterministic settings, the
loss, and the data-parallel training loop with jitckpt's two calls, its timing and its output.

Output (rank 0), as ``train_mlp.py``'s: ``step k/N loss L`` every ``--log-every`` steps, ``final parameters
sha256 HEX`` (the state dict in name order, ``mlp_job.parameters_sha256``) and the training loop's time,
start-up and the first warm-up steps excluded: ``NAME: N steps in S s (M ms/step, after W warm-up steps)``.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from mlp_job import init_process_group, job_device, parameters_sha256, wrap_ddp
from train_mlp import use_jitckpt

Built = tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]


def add_common_args(p: argparse.ArgumentParser) -> None:
    """The options every workload has (besides its own model's)."""
    p.add_argument("--steps", type=int, default=60, help="optimizer steps (minibatches)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--backend", default="gloo", help="process-group backend: gloo or nccl")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="cuda: GPU LOCAL_RANK modulo the GPUs visible (ranks may share one)")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--warmup-steps", type=int, default=5, help="steps left out of the timing line")


def deterministic() -> None:
    """Bit-for-bit repeatable kernels (with CUBLAS_WORKSPACE_CONFIG, which the scripts set before torch)."""
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood through gather (deterministic on CUDA, unlike nll_loss)."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return -logp.gather(-1, targets.unsqueeze(-1)).mean()


def run(args: argparse.Namespace, name: str, build: Callable[[argparse.Namespace], Built],
        batch: Callable[[argparse.Namespace, int, int], tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Train ``build(args)`` on ``batch(args, step, rank)`` with DDP, resuming from a JIT checkpoint if any."""
    deterministic()
    init_process_group(args)
    rank = dist.get_rank()
    device = job_device(args)
    model, optimizer, scheduler = build(args)
    progress = {"step": 0}
    start, path = use_jitckpt(model, optimizer, scheduler, progress)
    if path and rank == 0:
        print(f"resumed at step {start} from {path}", flush=True)
    ddp = wrap_ddp(args, model)

    warm = min(args.warmup_steps, max(0, args.steps - start - 1))
    t0 = time.perf_counter()
    for step in range(start, args.steps):
        if step == start + warm:
            if device.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
        progress["step"] = step
        x, y = batch(args, step, rank)
        loss = cross_entropy(ddp(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        if rank == 0 and ((step + 1) % args.log_every == 0 or step + 1 == args.steps):
            print(f"step {step + 1}/{args.steps} loss {loss.item():.5f}", flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    timed = max(0, args.steps - start - warm)

    if rank == 0:
        print(f"final parameters sha256 {parameters_sha256(model)}", flush=True)
        per_step = 1000 * seconds / timed if timed else math.nan
        print(f"{name}: {timed} steps in {seconds:.4f} s ({per_step:.3f} ms/step, after {warm} warm-up steps)",
              flush=True)
    # Let gloo's worker threads take the GIL and drop their finished works first: destroying the process group
    # joins them while holding the GIL (torch 2.13 deadlocked here now and then; jitckpt/worker/shutdown.py).
    time.sleep(0.1)
    dist.destroy_process_group()
