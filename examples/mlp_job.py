"""The training job of ``train_mlp.py``, without jitckpt: model, data, one optimizer step, checksum.

``train_mlp.py`` adds jitckpt's two calls, the loop and its logging; the
benchmarks (``benchmarks/workload.py``) add their timing around the same
functions, and the periodic-checkpoint baseline uses them without jitckpt,
which is why nothing here imports it.

Determinism: every batch is a pure function of (seed, step, micro-batch,
rank), the initial model is drawn from ``--seed`` on every rank, and each
rank then seeds the global generator it draws its dropout masks from.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

INPUT_DIM = 32


def add_job_args(p: argparse.ArgumentParser) -> None:
    """The flags of the job itself (size, data, seeds), with ``train_mlp.py``'s defaults."""
    p.add_argument("--steps", type=int, default=60, help="optimizer steps (minibatches)")
    p.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step (gradient accumulation)")
    p.add_argument("--batch", type=int, default=16, help="samples per micro-batch per rank")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--batchnorm", action="store_true", help="BatchNorm after each hidden layer (running statistics are buffers)")
    p.add_argument("--backend", default="gloo",
                   help="process-group backend: gloo, nccl, or ncclorder (the test backend with NCCL's ordering, tests/nccl_order)")
    p.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                   help="where the model and data live; cuda: GPU LOCAL_RANK modulo the GPUs visible (ranks may share one)")


def job_device(args: argparse.Namespace) -> torch.device:
    """This rank's device: the CPU, or a GPU chosen by local rank (several ranks may share one GPU)."""
    if getattr(args, "device", "cpu") != "cuda":
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def wrap_ddp(args: argparse.Namespace, model: nn.Module) -> DDP:
    """DDP over the model, with the device ids DDP wants for a GPU model."""
    device = job_device(args)
    return DDP(model, device_ids=[device.index]) if device.type == "cuda" else DDP(model)


def init_process_group(args: argparse.Namespace) -> None:
    """``dist.init_process_group(args.backend)``; registers the ``ncclorder`` test backend only when it is asked for."""
    if args.backend == "ncclorder":
        tests = str(Path(__file__).resolve().parents[1] / "tests")
        if tests not in sys.path:
            sys.path.insert(0, tests)
        import nccl_order

        nccl_order.register()
    dist.init_process_group(args.backend)


def make_model(args: argparse.Namespace) -> nn.Module:
    def norm() -> list[nn.Module]:
        return [nn.BatchNorm1d(args.hidden)] if args.batchnorm else []

    layers: list[nn.Module] = [nn.Linear(INPUT_DIM, args.hidden), *norm(), nn.GELU(), nn.Dropout(args.dropout)]
    for _ in range(args.layers - 1):
        layers += [nn.Linear(args.hidden, args.hidden), *norm(), nn.GELU(), nn.Dropout(args.dropout)]
    layers.append(nn.Linear(args.hidden, 1))
    return nn.Sequential(*layers)


def build(args: argparse.Namespace, rank: int) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """Model, Adam and StepLR; call after ``init_process_group``, before wrapping the model in DDP."""
    torch.manual_seed(args.seed)  # same initial model on every rank
    model = make_model(args).to(job_device(args))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.7)
    torch.manual_seed(args.seed + 1 + rank)  # each rank draws its own dropout masks
    return model, optimizer, scheduler


def batch(args: argparse.Namespace, step: int, micro: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data for (step, micro-batch, rank): independent of every global RNG."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + micro * 101 + rank)
    x = torch.randn(args.batch, INPUT_DIM, generator=g)
    y = (x[:, :4].sum(dim=1, keepdim=True).sin() + 0.1 * torch.randn(args.batch, 1, generator=g))
    device = job_device(args)
    return (x, y) if device.type == "cpu" else (x.to(device), y.to(device))


def train_step(
    args: argparse.Namespace,
    ddp: DDP,
    optimizer: torch.optim.Optimizer,
    loss_fn: nn.Module,
    step: int,
    rank: int,
) -> torch.Tensor:
    """Minibatch ``step``: ``args.accum`` micro-batches (all-reduce on the last), then the optimizer step.

    Returns the last micro-batch's loss (divided by ``args.accum``).  The
    scheduler is the caller's to step.
    """
    for micro in range(args.accum):
        x, y = batch(args, step, micro, rank)
        if micro < args.accum - 1:
            with ddp.no_sync():
                (loss_fn(ddp(x), y) / args.accum).backward()
        else:
            loss = loss_fn(ddp(x), y) / args.accum
            loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def parameters_sha256(model: nn.Module) -> str:
    """SHA-256 of the state dict (parameters and buffers), in name order."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()
