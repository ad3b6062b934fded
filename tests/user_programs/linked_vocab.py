"""A user's DDP script whose save function hard-links a large unchanged file into the checkpoint.

The job is examples/train_mlp.py's (model, data, dropout with per-rank seeds,
gradient accumulation), and its ``save(path)`` does what scripts with a
tokenizer vocabulary or frozen weights do to keep a checkpoint cheap: it
writes the trained state, and ``os.link``s the file given with ``--vocab``
(which does not change) into the checkpoint instead of copying it.  On
resume it reads the vocabulary back from the checkpoint and checks it.
``--die RANK:STEP`` makes that rank SIGKILL itself as minibatch STEP begins,
in the first attempt only.

Prints ``final parameters sha256 <hex>`` on rank 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import jitckpt  # noqa: E402
from mlp_job import add_job_args, build, init_process_group, parameters_sha256, train_step  # noqa: E402

VOCAB_NAME = "vocab.txt"


def main() -> None:
    p = argparse.ArgumentParser()
    add_job_args(p)
    p.add_argument("--vocab", required=True, help="a file the save function links into every checkpoint")
    p.add_argument("--die", default="", help="RANK:STEP: that rank dies as minibatch STEP begins (first attempt)")
    args = p.parse_args()
    init_process_group(args)
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    die_rank, die_step = (int(v) for v in args.die.split(":")) if args.die else (-1, -1)
    model, optimizer, scheduler = build(args, rank)
    progress = {"step": 0}

    def save(path: str) -> None:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "step": progress["step"]}, os.path.join(path, "state.pt"))
        os.link(args.vocab, os.path.join(path, VOCAB_NAME))  # unchanged and large: linked, not copied

    jitckpt.register_save_checkpoint(save)
    start = 0
    path = jitckpt.jit_get_checkpoint_path()
    if path:
        state = torch.load(os.path.join(path, "state.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start = state["step"]
        with open(os.path.join(path, VOCAB_NAME)) as saved, open(args.vocab) as original:
            assert saved.read() == original.read(), "the checkpoint's vocabulary differs from the original"
        print(f"rank {rank}: resumed at minibatch {start} with the vocabulary from {path}", flush=True)
    ddp = DDP(model)
    loss_fn = nn.MSELoss()
    for step in range(start, args.steps):
        progress["step"] = step
        if attempt == 0 and (rank, step) == (die_rank, die_step):
            print(f"rank {rank}: dying as minibatch {step} begins", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        train_step(args, ddp, optimizer, loss_fn, step, rank)
        scheduler.step()
    if rank == 0:
        print(f"final parameters sha256 {parameters_sha256(model)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
