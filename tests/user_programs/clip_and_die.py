"""A user's training loop with work between backward() and optimizer.step(), and a rank that dies there.

The job is examples/train_mlp.py's (same model, data, dropout with per-rank
seeds, gradient accumulation, jitckpt's two calls), but the loop is written
out the way many scripts are: after backward it clips the gradients and logs
``loss.item()``, and only then steps the optimizer.  With ``--die RANK:STEP``
that rank kills (``kill``) or freezes (``stop``) itself right there, in user
code, in the first attempt only: outside every jitckpt hook; or (``exitN``)
ends its script there with ``sys.exit(N)``, a status of its own.

How the gradients are reduced (``--grad-sync``):

- ``no_sync`` (default): DDP, with ``no_sync()`` around every micro-batch but
  the last, so only the last backward all-reduces;
- ``every``: DDP without ``no_sync()``: every micro-batch's backward
  all-reduces (each draws its dropout masks after the first all-reduce);
- ``manual``: no DDP: the script all-reduces every ``p.grad`` itself after
  the last backward and divides by the world size;
- ``p2p``: no DDP: the script sends every ``p.grad`` to every other rank
  (``batch_isend_irecv``), adds them in rank order and divides.

With ``--lag RANK:STEP:SECONDS`` DDP reduces through a comm hook of the
script's (divide, then all-reduce, as DDP's default does) whose callback, on
that rank in that minibatch of the first attempt, sleeps after the
all-reduce has completed: a busy host, whose rank still waits for a
collective that its peers have already left behind.
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

from mlp_job import add_job_args, batch, build, init_process_group, parameters_sha256  # noqa: E402
from train_mlp import use_jitckpt  # noqa: E402

from jobkit import lagging_hook  # noqa: E402


def exchange_gradients(model: nn.Module, rank: int, world: int) -> None:
    """Sum every ``p.grad`` over the ranks with point-to-point transfers (the same order everywhere), then average."""
    for param in model.parameters():
        received = {peer: torch.empty_like(param.grad) for peer in range(world) if peer != rank}
        ops = [dist.P2POp(dist.isend, param.grad, peer) for peer in received]
        ops += [dist.P2POp(dist.irecv, buffer, peer) for peer, buffer in received.items()]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        total = torch.zeros_like(param.grad)
        for peer in range(world):
            total += param.grad if peer == rank else received[peer]
        param.grad.copy_(total).div_(world)


def main() -> None:
    p = argparse.ArgumentParser()
    add_job_args(p)
    p.add_argument("--die", default="", help="RANK:STEP:HOW (HOW: kill or stop between backward and step, exitN: "
                                              "sys.exit(N) there, stop-before-broadcast: before the step's object "
                                              "broadcast, kill-before-forward: at the start of the minibatch, "
                                              "kill-in-logging or stop-in-logging: before the --log-allreduce), "
                                              "first attempt only")
    p.add_argument("--grad-sync", choices=("no_sync", "every", "manual", "p2p"), default="no_sync",
                   help="no_sync: DDP all-reduces in the last micro-batch only; every: in every micro-batch; "
                        "manual: no DDP, the script all-reduces p.grad itself; p2p: no DDP, the script "
                        "exchanges p.grad with point-to-point transfers")
    p.add_argument("--object-collective", action="store_true",
                   help="every step, rank 0 broadcasts the step number with dist.broadcast_object_list first")
    p.add_argument("--log-every", type=int, default=1000)
    p.add_argument("--log-allreduce", action="store_true",
                   help="after scheduler.step(), all-reduce the loss for logging (a collective after the optimizer "
                        "step: a failure there is saved as the start of the next minibatch)")
    p.add_argument("--save-loop-counter", action="store_true",
                   help="save() records the loop's own counter, not jitckpt.current_step() (one behind after a "
                        "failure in the logging all-reduce)")
    p.add_argument("--loader-before-loop", action="store_true",
                   help="create a shuffled DataLoader iterator (it draws a seed from the global generator) "
                        "between jit_get_checkpoint_path() and the first minibatch, as most real scripts do")
    p.add_argument("--lag", default="", help="RANK:STEP:SECONDS: DDP reduces through a comm hook of the script's, "
                                              "which on that rank sees the all-reduce of that minibatch complete "
                                              "SECONDS late (first attempt only)")
    args = p.parse_args()
    init_process_group(args)
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    die_rank, die_step, how = (args.die.split(":") + ["", "", ""])[:3] if args.die else ("-1", "-1", "")
    model, optimizer, scheduler = build(args, rank)
    progress = {"step": 0}
    start, _ = use_jitckpt(model, optimizer, scheduler, progress if args.save_loop_counter else None)
    if args.loader_before_loop:
        loader = torch.utils.data.DataLoader(list(range(16)), batch_size=4, shuffle=True)
        next(iter(loader))  # the iterator draws its base seed, the sampler its permutation
    world = dist.get_world_size()
    ddp = model if args.grad_sync in ("manual", "p2p") else DDP(model)
    if args.lag:
        ddp.register_comm_hook(None, lagging_hook(args.lag, progress))
    loss_fn = nn.MSELoss()
    for step in range(start, args.steps):
        progress["step"] = step
        if args.object_collective:
            if attempt == 0 and rank == int(die_rank) and step == int(die_step) and how == "stop-before-broadcast":
                print(f"rank {rank}: freezing before the object broadcast of minibatch {step}", flush=True)
                os.kill(os.getpid(), signal.SIGSTOP)
            box = [step if rank == 0 else None]
            dist.broadcast_object_list(box, src=0)
            assert box[0] == step, (box, step)
        if attempt == 0 and rank == int(die_rank) and step == int(die_step) and how == "kill-before-forward":
            print(f"rank {rank}: dying before the forward of minibatch {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        for micro in range(args.accum):
            x, y = batch(args, step, micro, rank)
            if micro < args.accum - 1 and args.grad_sync == "no_sync":
                with ddp.no_sync():
                    (loss_fn(ddp(x), y) / args.accum).backward()
            else:
                loss = loss_fn(ddp(x), y) / args.accum
                loss.backward()
        if args.grad_sync == "manual":
            for param in model.parameters():
                dist.all_reduce(param.grad)
                param.grad.div_(world)
        if args.grad_sync == "p2p":
            exchange_gradients(model, rank, world)
        # ---- user code between backward() and step() ----
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), max_norm=1.0)
        logged = loss.item()
        if attempt == 0 and rank == int(die_rank) and step == int(die_step) and how in ("kill", "stop"):
            print(f"rank {rank}: dying ({how}) between backward and step of minibatch {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        if attempt == 0 and rank == int(die_rank) and step == int(die_step) and how.startswith("exit"):
            print(f"rank {rank}: sys.exit({how[4:]}) between backward and step of minibatch {step}", flush=True)
            sys.exit(int(how[4:]))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        if args.log_allreduce:
            if attempt == 0 and rank == int(die_rank) and step == int(die_step) and how.endswith("-in-logging"):
                print(f"rank {rank}: dying ({how}) before the logging all-reduce of minibatch {step}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL if how.startswith("kill") else signal.SIGSTOP)
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss)
            logged = mean_loss.item() / world
        if rank == 0 and (step + 1) % args.log_every == 0:
            print(f"step {step + 1} loss {logged:.5f}", flush=True)
    if rank == 0:
        print(f"final parameters sha256 {parameters_sha256(model)}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
