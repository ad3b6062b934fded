"""A small convolutional net with BatchNorm, trained data-parallel with jitckpt's two calls (a PyTorch workload
for transparent mode's GPU check).

    torchrun --standalone --nproc_per_node 1 examples/conv_bn.py --device cuda --steps 300
    jit-run torchrun --standalone --nproc_per_node 2 --max-restarts 2 examples/conv_bn.py --steps 20
    jit-run --transparent torchrun --standalone --nproc_per_node 1 examples/conv_bn.py --device cuda

Three blocks of Conv2d (3x3, no bias) + BatchNorm2d + ReLU, 2x2 max pooling after the first two, a mean over
the image and a linear head; SGD with momentum and weight decay, a step schedule.  The data are synthetic:
``--classes`` fixed random images (drawn from ``--seed``) plus noise, each batch a pure function of (seed, step,
rank), so the loss falls and a run is deterministic.  BatchNorm's running statistics are buffers: they are in
the checkpoint (``train_mlp.use_jitckpt``) and in the checksum.  Deterministic settings:
``torch.use_deterministic_algorithms(True)``, cuDNN benchmarking off and cuDNN deterministic,
``CUBLAS_WORKSPACE_CONFIG`` ``:4096:8`` unless set; no adaptive pooling (no deterministic CUDA backward) and
the loss through ``gather`` (NLLLoss has no deterministic CUDA kernel).

Output, as ``train_mlp.py``'s (rank 0): ``step k/N loss L`` every ``--log-every`` steps, ``final parameters
sha256 HEX`` (the state dict in name order, ``mlp_job.parameters_sha256``) and the training loop's time,
start-up and the first warm-up steps excluded: ``conv_bn: N steps in S s (M ms/step, after W warm-up steps)``.
"""

from __future__ import annotations

import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before anything creates a cuBLAS handle

import argparse

import torch
import torch.nn as nn

from mlp_job import job_device
from train_loop import add_common_args, run

NAME = "conv_bn"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common_args(p)
    p.add_argument("--batch", type=int, default=32, help="images per minibatch per rank")
    p.add_argument("--size", type=int, default=16, help="image height and width")
    p.add_argument("--width", type=int, default=16, help="channels of the first block (doubled in each next one)")
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    return p.parse_args()


class MeanOverImage(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def make_model(args: argparse.Namespace) -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    w = args.width
    return nn.Sequential(*block(3, w), nn.MaxPool2d(2), *block(w, 2 * w), nn.MaxPool2d(2), *block(2 * w, 4 * w),
                         MeanOverImage(), nn.Linear(4 * w, args.classes))


def build(args: argparse.Namespace) -> tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    torch.manual_seed(args.seed)  # the same initial model on every rank
    model = make_model(args).to(job_device(args))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=100, gamma=0.5)
    return model, optimizer, scheduler


def batch(args: argparse.Namespace, step: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Images and labels for (step, rank): the label's template image plus noise."""
    templates = torch.randn(args.classes, 3, args.size, args.size, generator=torch.Generator().manual_seed(args.seed))
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)
    labels = torch.randint(0, args.classes, (args.batch,), generator=g)
    images = templates[labels] + torch.randn(args.batch, 3, args.size, args.size, generator=g)
    device = job_device(args)
    return images.to(device), labels.to(device)


def main() -> None:
    run(parse_args(), NAME, build, batch)


if __name__ == "__main__":
    main()
