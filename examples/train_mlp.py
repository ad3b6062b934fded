"""A small data-parallel training job using jitckpt's two-line API (the demo and test workload).

Run it with jit-run (4 CPU ranks, gloo):

    jit-run torchrun --nproc_per_node 4 --max-restarts 3 examples/train_mlp.py --steps 60

It trains an MLP with dropout, Adam, a learning-rate schedule and gradient
accumulation.  Every batch is a pure function of (seed, step, micro-batch,
rank), and dropout draws from each rank's own seeded generator, so a run is
deterministic: after any recovery the final parameters must be bit-for-bit
those of a fault-free run.  Rank 0 prints a SHA-256 of the final parameters
and, with --out, saves them.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import jitckpt


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=60, help="optimizer steps (minibatches)")
    p.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step (gradient accumulation)")
    p.add_argument("--batch", type=int, default=16, help="samples per micro-batch per rank")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--batchnorm", action="store_true", help="BatchNorm after each hidden layer (running statistics are buffers)")
    p.add_argument("--step-sleep", type=float, default=0.0, help="extra seconds per step (to mimic a slower model)")
    p.add_argument("--out", help="rank 0 saves the final parameters here")
    p.add_argument("--log-every", type=int, default=10)
    return p.parse_args()


def make_model(args: argparse.Namespace) -> nn.Module:
    def norm() -> list[nn.Module]:
        return [nn.BatchNorm1d(args.hidden)] if args.batchnorm else []

    layers: list[nn.Module] = [nn.Linear(32, args.hidden), *norm(), nn.GELU(), nn.Dropout(args.dropout)]
    for _ in range(args.layers - 1):
        layers += [nn.Linear(args.hidden, args.hidden), *norm(), nn.GELU(), nn.Dropout(args.dropout)]
    layers.append(nn.Linear(args.hidden, 1))
    return nn.Sequential(*layers)


def batch(args: argparse.Namespace, step: int, micro: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The data for (step, micro-batch, rank): independent of every global RNG."""
    g = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + micro * 101 + rank)
    x = torch.randn(args.batch, 32, generator=g)
    y = (x[:, :4].sum(dim=1, keepdim=True).sin() + 0.1 * torch.randn(args.batch, 1, generator=g))
    return x, y


def parameters_sha256(model: nn.Module) -> str:
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()


def main() -> None:
    args = parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(args.seed)  # same initial model on every rank
    model = make_model(args)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=10, gamma=0.7)
    torch.manual_seed(args.seed + 1 + rank)  # each rank draws its own dropout masks

    progress = {"step": 0}

    def save(path: str) -> None:
        torch.save(
            {
                "model": model.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(),
                "step": progress["step"],
            },
            os.path.join(path, "state.pt"),
        )

    jitckpt.register_save_checkpoint(save)
    start = 0
    path = jitckpt.jit_get_checkpoint_path()
    if path:
        state = torch.load(os.path.join(path, "state.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start = state["step"]
        if rank == 0:
            print(f"resumed at step {start} from {path}", flush=True)

    ddp = DDP(model)
    loss_fn = nn.MSELoss()
    t0 = time.time()
    for step in range(start, args.steps):
        progress["step"] = step
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
        scheduler.step()
        if args.step_sleep:
            time.sleep(args.step_sleep)
        if rank == 0 and (step + 1) % args.log_every == 0:
            print(f"step {step + 1}/{args.steps} loss {loss.item() * args.accum:.5f} lr {scheduler.get_last_lr()[0]:.5f} "
                  f"({time.time() - t0:.1f}s)", flush=True)

    if rank == 0:
        print(f"final parameters sha256 {parameters_sha256(model)}", flush=True)
        if args.out:
            torch.save(model.state_dict(), args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
