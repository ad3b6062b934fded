"""A PyTorch Lightning job with no jitckpt code in it (tests/test_frameworks.py runs it).

A tiny MLP with dropout, an in-memory dataset shuffled by the DistributedSampler
Lightning puts in, Adam with a per-step LR schedule, gradient accumulation 2,
DDP on CPU (gloo) under torchrun.  Rank 0 prints the sha256 of the final
parameters.  ``python lightning_job.py pytorch_lightning`` uses the
``pytorch_lightning`` package name instead of ``lightning.pytorch``.

JOB_FAULT="kill|hang,rank=R,step=S,micro=M" makes rank R SIGKILL or SIGSTOP
itself in ``on_train_batch_start`` of micro-batch M (0 or 1) of global step S,
in the first attempt only (TORCHELASTIC_RESTART_COUNT 0).  Lightning runs the
last micro-batch's forward and backward inside ``optimizer.step(closure)``, so
with M=1 the other rank waits for the frozen one in that step's gradient
all-reduce.  ``,at=before_optimizer_step``: in ``on_before_optimizer_step``
of global step S instead (its gradients all-reduced, its step not taken);
``,at=validation_step``: in ``on_validation_batch_start`` of the validation
after global step S.  JOB_VAL=1: validate at each epoch's end, on inputs with noise drawn from the
global generator (and a validation loader whose iterator draws its seed there).
"""

from __future__ import annotations

import importlib
import os
import sys

import torch
from job_common import end_cleanly, first_attempt, inject, parse_fault, print_result
from torch import nn

pl = importlib.import_module(sys.argv[1] if len(sys.argv) > 1 else "lightning.pytorch")
ACCUMULATE = 2


class TinyRegressor(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x + 0.05 * torch.randn(x.shape)), y)
        self.log("val_loss", loss, sync_dist=True)
        return loss

    def configure_optimizers(self):
        optimizer = torch.optim.Adam(self.parameters(), lr=1e-2)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.7)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


class FaultInjector(pl.Callback):
    """Kill or freeze this rank as global step S starts, in the first attempt only."""

    def __init__(self, spec: str) -> None:
        self.signal, where = parse_fault(spec)
        self.rank, self.step, self.micro = where["rank"], where["step"], where.get("micro", 0)
        self.at = where.get("at", "train_batch_start")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if (self.at == "train_batch_start" and first_attempt() and trainer.global_rank == self.rank
                and trainer.global_step == self.step and batch_idx % ACCUMULATE == self.micro):
            inject(self.signal, f"rank {self.rank}, global step {self.step}, micro-batch {self.micro}")

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if (self.at == "validation_step" and first_attempt() and trainer.global_rank == self.rank
                and trainer.global_step == self.step):
            inject(self.signal, f"rank {self.rank}, in the validation after global step {self.step}")

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if (self.at == "before_optimizer_step" and first_attempt() and trainer.global_rank == self.rank
                and trainer.global_step == self.step):
            inject(self.signal, f"rank {self.rank}, before the optimizer step of global step {self.step}")


def main() -> None:
    pl.seed_everything(7)
    model = TinyRegressor()
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(96, 8, generator=g)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(96, 1, generator=g)
    # 96 samples over 2 ranks, batches of 6, accumulation 2: 4 optimizer steps per epoch, 12 in all
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=6, shuffle=True)
    callbacks = [FaultInjector(os.environ["JOB_FAULT"])] if os.environ.get("JOB_FAULT") else []
    trainer = pl.Trainer(
        accelerator="cpu", devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")), num_nodes=1, strategy="ddp",
        max_epochs=3, accumulate_grad_batches=ACCUMULATE, callbacks=callbacks, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
    )
    validate = os.environ.get("JOB_VAL") == "1"
    xv = torch.randn(24, 8, generator=g)
    val_loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(xv, xv.sum(dim=1, keepdim=True)),
                                             batch_size=6)
    trainer.fit(model, loader, val_loader if validate else None)
    if trainer.global_rank == 0:
        print_result(model.state_dict(), trainer.global_step)
    end_cleanly()


if __name__ == "__main__":
    main()
