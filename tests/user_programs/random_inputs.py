"""The loop of PyTorch's DDP tutorial: random inputs drawn from the global generator at the top of every
minibatch (no DataLoader), per-rank seeds, dropout, SGD; jitckpt's two calls with ``jitckpt.current_step()``.

``--die RANK:STEP`` (first attempt only): that rank SIGKILLs itself in minibatch STEP right after drawing its
inputs, before its forward.  ``--noise-after-step``: after every optimizer step the loop draws one more number
(a noisy metric), which a resumed loop does not draw again for the minibatch before.  ``--draw-before-loop``: one
draw between ``jit_get_checkpoint_path()`` and the loop (it shifts a resumed loop's inputs).  ``--lag
RANK:STEP:SECONDS``: DDP reduces through a comm hook that, on that rank in that minibatch (first attempt), sees the
all-reduce complete SECONDS late (``jobkit.lagging_hook``).  ``--eval-mode``: the model trains in eval mode (no
dropout: ``eval()`` once on the DDP module, as scripts that freeze normalisation statistics do).  Prints ``final parameters
sha256 <hex>`` on rank 0.
"""

from __future__ import annotations

import argparse
import os
import signal

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import jitckpt
from jobkit import finish, lagging_hook


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--die", default="")
    p.add_argument("--noise-after-step", action="store_true")
    p.add_argument("--draw-before-loop", action="store_true")
    p.add_argument("--lag", default="")
    p.add_argument("--eval-mode", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 5))
    ddp = DDP(model)
    if args.eval_mode:
        ddp.eval()
    progress = {"step": 0}
    if args.lag:
        ddp.register_comm_hook(None, lagging_hook(args.lag, progress))
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    torch.manual_seed(100 + rank)

    def save(path: str) -> None:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": jitckpt.current_step()},
                   os.path.join(path, "state.pt"))

    jitckpt.register_save_checkpoint(save)
    path = jitckpt.jit_get_checkpoint_path()
    start = 0
    if path:
        state = torch.load(os.path.join(path, "state.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["step"]
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if args.draw_before_loop:
        torch.rand(1)
    for step in range(start, args.steps):
        progress["step"] = step
        inputs, labels = torch.randn(20, 10), torch.randn(20, 5)
        if attempt == 0 and args.die == f"{rank}:{step}":
            print(f"rank {rank}: SIGKILL to myself at minibatch {step}, after drawing its inputs", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        optimizer.zero_grad()
        nn.functional.mse_loss(ddp(inputs), labels).backward()
        optimizer.step()
        if args.noise_after_step:
            torch.rand(1)
    finish(rank, {"model": model})
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
