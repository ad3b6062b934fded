"""A tiny DDP job that finishes normally, then exits in one of several awkward ways (tests/test_shutdown.py).

--mode gil-race      The process group outlives the script (module-level DDP,
                     no destroy_process_group) and the main thread keeps the
                     GIL after the last backward (switch interval 1000 s), so
                     gloo's threads are still waiting to drop the Python state
                     of their last work when the interpreter starts to finalise.
                     Without jitckpt's hand-over at exit this aborts with
                     "terminate called without an active exception".
--mode crash-after   Rank --crash-rank finishes, then dies from SIGABRT during
                     interpreter teardown; the other ranks are still tearing
                     down (they sleep in a finaliser) when it dies.
--mode exit3-crash   Like crash-after, but rank --crash-rank's script ends
                     with sys.exit(3) first: a real failure.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import jitckpt

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=("gil-race", "crash-after", "exit3-crash"), required=True)
parser.add_argument("--crash-rank", type=int, default=2)
parser.add_argument("--steps", type=int, default=4)
args = parser.parse_args()


class AtTeardown:
    """Module-level object: its finaliser runs while the interpreter finalises, after every atexit hook."""

    def __init__(self, action: str) -> None:
        self.action = action

    def __del__(self) -> None:
        if self.action == "abort":
            os.kill(os.getpid(), signal.SIGABRT)
        elif self.action == "linger":
            time.sleep(3.0)


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
ddp = DDP(model, bucket_cap_mb=0.01)  # module global: lives until interpreter teardown
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
jitckpt.register_save_checkpoint(lambda path: torch.save(model.state_dict(), os.path.join(path, "model.pt")))

for step in range(args.steps):
    optimizer.zero_grad()
    last = step == args.steps - 1
    if last and args.mode == "gil-race":
        sys.setswitchinterval(1000)
    ddp(torch.ones(4, 64)).sum().backward()
    if not last or args.mode != "gil-race":
        optimizer.step()

if args.mode != "gil-race":
    teardown = AtTeardown("abort" if rank == args.crash_rank else "linger")
    print(f"rank {rank} finished training", flush=True)
    if args.mode == "exit3-crash" and rank == args.crash_rank:
        sys.exit(3)
