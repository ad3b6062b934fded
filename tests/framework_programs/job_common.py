"""What both framework test jobs share: the fault they inject on themselves, and the result they print."""

from __future__ import annotations

import hashlib
import os
import signal


def parse_fault(spec: str) -> tuple[signal.Signals, dict[str, int | str]]:
    """``kill|hang,rank=R,step=S[,micro=M][,at=HOOK]`` -> (SIGKILL or SIGSTOP, {"rank": R, "step": S, ...})."""
    kind, *fields = spec.split(",")
    return {"kill": signal.SIGKILL, "hang": signal.SIGSTOP}[kind], {
        k: int(v) if v.lstrip("-").isdigit() else v for k, v in (f.split("=") for f in fields)}


def first_attempt() -> bool:
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


def inject(sig: signal.Signals, where: str) -> None:
    print(f"injected {sig.name} at {where}", flush=True)
    os.kill(os.getpid(), sig)


def end_cleanly() -> None:
    """Destroy the process group before interpreter teardown, as a careful script does.

    Left to the interpreter's finaliser, torch 2.13's gloo threads race it and a
    rank can abort or hang after its work is done (tests/test_shutdown.py).
    """
    import time

    import torch.distributed as dist

    # Let gloo's worker threads finish destroying their last work objects (which
    # needs the GIL) before the trainer, its DDP reducer and the process group
    # are freed on this thread, which joins them while holding the GIL.
    time.sleep(0.5)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    time.sleep(0.2)


def print_result(state_dict: dict, global_step: int) -> None:
    """The line the tests compare: a sha256 over every tensor of the final model."""
    digest = hashlib.sha256()
    for name, tensor in sorted(state_dict.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    print(f"global step {global_step}", flush=True)
    print(f"final parameters sha256 {digest.hexdigest()}", flush=True)
