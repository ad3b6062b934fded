"""A user's script that draws random numbers between fetching a batch and the model's forward.

A plain ``torch.utils.data.DataLoader`` (``--workers``, default 0: the
dataset's random augmentation then runs in the training process) over a
shuffled ``DistributedSampler``; each step adds input noise with
``torch.randn_like`` before the forward (as GANs sample their noise, and
denoising models their corruption); dropout; per-rank seeds.  On resume the
script skips to its position by iterating the loader, as many scripts do.
``--die RANK:STEP`` SIGKILLs that rank right after it fetched the batch of
minibatch STEP, in attempt 0.  ``--no-skip``: on resume the script starts the
epoch's iterator afresh without skipping to its position (a common mistake:
it then trains on other batches than the fault-free run).  Prints ``final parameters sha256 <hex>`` on
rank 0.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

import jitckpt


class Augmented(Dataset):
    def __init__(self, n: int) -> None:
        g = torch.Generator().manual_seed(5)
        self.x = torch.randn(n, 16, generator=g)
        self.y = self.x[:, :3].sum(dim=1, keepdim=True).cos()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i] * (1 + 0.1 * torch.randn(1)), self.y[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--die", default="")
    p.add_argument("--no-skip", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    die_rank, die_step = (int(v) for v in args.die.split(":")) if args.die else (-1, -1)
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Dropout(0.2), nn.Linear(32, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    torch.manual_seed(4 + rank)

    dataset = Augmented(72)
    sampler = DistributedSampler(dataset, shuffle=True, seed=11)
    loader = DataLoader(dataset, batch_size=4, sampler=sampler, num_workers=args.workers)
    progress = {"step": 0}

    def save(path: str) -> None:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": progress["step"]},
                   os.path.join(path, "state.pt"))

    jitckpt.register_save_checkpoint(save)
    path = jitckpt.jit_get_checkpoint_path()
    if path:
        state = torch.load(os.path.join(path, "state.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        progress["step"] = state["step"]
    ddp = DDP(model)
    per_epoch = len(loader)
    for epoch in range(progress["step"] // per_epoch, args.epochs):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if epoch * per_epoch + i < progress["step"] and not args.no_skip:
                continue  # skip to where the checkpoint is
            if attempt == 0 and rank == die_rank and progress["step"] == die_step:
                os.kill(os.getpid(), signal.SIGKILL)
            x = x + 0.05 * torch.randn_like(x)
            loss = nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            progress["step"] += 1
    if rank == 0:
        digest = hashlib.sha256()
        for name, tensor in sorted(model.state_dict().items()):
            digest.update(name.encode() + tensor.detach().contiguous().numpy().tobytes())
        print(f"trained {progress['step']} steps; final parameters sha256 {digest.hexdigest()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
