"""A worker's normal end: how its script finished, and a safe hand-over to interpreter teardown.

When a training script returns, jitckpt's exit hook (``JitRuntime.record_exit``,
run by ``atexit`` before the interpreter starts finalising) does two things:

1. It records whether the script *succeeded*: no uncaught exception and no
   non-zero ``sys.exit``.  jit-run's agent reads that record: a worker that
   finished its script and then died from a signal during interpreter
   teardown has finished training, and must not make torchrun tear the job
   down and redo it from the last JIT checkpoint.

2. It releases the GIL for a moment.  torch's gloo worker threads destroy each
   work object right after its collective completes; the destructor drops
   Python references (the thread-local state captured with the work), which
   needs the GIL.  If the main thread reaches finalisation first and later
   releases the GIL (e.g. while destroying a process group that outlived
   ``main()``), CPython ends the waiting gloo thread with ``pthread_exit``
   inside a C++ destructor and the process aborts with "terminate called
   without an active exception".  Seen with torch 2.13 under plain torchrun
   too; reproduced in tests/test_shutdown.py.
"""

from __future__ import annotations

import sys
import time
from typing import Any

# How long the exit hook lets backend threads take the GIL: far longer than the
# microseconds their destructors need, short enough to be invisible at exit.
HANDOVER_SECONDS = 0.05

_exit_code_requested: Any = None
_installed = False


def install() -> None:
    """Remember the code passed to ``sys.exit`` (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    original_exit = sys.exit

    def exit(status: Any = None) -> None:  # noqa: A001  (mirrors sys.exit)
        global _exit_code_requested
        _exit_code_requested = status
        original_exit(status)

    exit.__doc__ = original_exit.__doc__
    sys.exit = exit


def script_succeeded() -> bool:
    """True if the script is ending normally: no uncaught exception, no ``sys.exit`` with an error status."""
    if getattr(sys, "last_value", None) is not None or getattr(sys, "last_exc", None) is not None:
        return False  # the interpreter printed an uncaught exception
    return _exit_code_requested is None or _exit_code_requested == 0


def hand_over_to_backend_threads(seconds: float = HANDOVER_SECONDS) -> None:
    """Release the GIL briefly so backend threads can finish dropping their Python references."""
    if "torch.distributed" in sys.modules:
        time.sleep(seconds)
