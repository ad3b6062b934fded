"""What both framework test jobs share: the fault they inject on themselves, and the result they print."""

from __future__ import annotations

import hashlib
import os
import signal


def parse_fault(spec: str) -> tuple[signal.Signals, dict[str, int]]:
    """``kill|hang,rank=R,step=S[,micro=M]`` -> (SIGKILL or SIGSTOP, {"rank": R, "step": S, ...})."""
    kind, *fields = spec.split(",")
    return {"kill": signal.SIGKILL, "hang": signal.SIGSTOP}[kind], {k: int(v) for k, v in (f.split("=") for f in fields)}


def first_attempt() -> bool:
    return os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"


def inject(sig: signal.Signals, where: str) -> None:
    print(f"injected {sig.name} at {where}", flush=True)
    os.kill(os.getpid(), sig)


def print_result(state_dict: dict, global_step: int) -> None:
    """The line the tests compare: a sha256 over every tensor of the final model."""
    digest = hashlib.sha256()
    for name, tensor in sorted(state_dict.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().contiguous().numpy().tobytes())
    print(f"global step {global_step}", flush=True)
    print(f"final parameters sha256 {digest.hexdigest()}", flush=True)
