"""Benchmark training job using jitckpt's two-line API, exactly like examples/train_mlp.py.

Under ``jit-run`` it is protected by just-in-time checkpointing; under plain
``torchrun`` both jitckpt calls are no-ops (one warning), so the same file is
the "without jitckpt" variant of ``overhead.py``.  With ``--fail-step`` it only
*marks* the failure point (``BENCH fail_now``): the failure itself is injected
by jit-run's ``--fault`` option, phase ``forward`` of the same minibatch.

    jit-run torchrun --standalone --nproc_per_node 4 --max-restarts 3 benchmarks/train_jit.py --steps 300
"""

from __future__ import annotations

import time

_SCRIPT_START = time.time()  # before importing torch: start-up cost of a (re)started worker

import argparse  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402

import jitckpt  # noqa: E402
import workload  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    workload.add_workload_args(p)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    workload.emit("script_start", script_start=_SCRIPT_START, process_start=workload.process_start_time())
    model, optimizer, scheduler = workload.build(args)
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
        workload.emit("resumed", step=start, path=path)
    workload.emit("state_ready", start_step=start)
    workload.run_loop(args, model, optimizer, scheduler, start, progress)


if __name__ == "__main__":
    main()
