"""jit-run's child process (torchrun): waiting for it while passing on the signals jit-run receives."""

from __future__ import annotations

import signal
import subprocess


def wait_forwarding_signals(child: subprocess.Popen) -> int:
    """Waits for ``child`` (torchrun), passing it the SIGINT and SIGTERM jit-run receives meanwhile."""

    def forward(signum: int, frame: object) -> None:
        child.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        return child.wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
