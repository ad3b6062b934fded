"""What a worker prints: one prefix per rank, and backend errors boiled down to their gist."""

from __future__ import annotations

import os
import re

from jitckpt.console import emit


def log(message: str) -> None:
    """Print a jitckpt message prefixed with this worker's rank."""
    emit(f"[jitckpt rank {os.environ.get('RANK', '?')}] {message}")


def short_error(error: BaseException) -> str:
    """The gist of a backend error: first line, without source paths and boilerplate advice."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    text = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", text)
    return text.split(". This is typically caused")[0]
