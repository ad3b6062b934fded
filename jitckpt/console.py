"""Whole-line writes to stderr, so that lines of processes sharing one stream never tear.

``print(text, file=sys.stderr)`` makes two writes, the text and the newline; with
unbuffered streams (``PYTHONUNBUFFERED``, which torchrun users often set) another
rank's line can land between them and fuse two lines into one.  One ``write``
of at most ``PIPE_BUF`` bytes to a pipe is atomic, so each line goes out whole.
"""

from __future__ import annotations

import sys


def emit(text: str) -> None:
    """Write ``text`` and its newline to stderr in one write, then flush."""
    stream = sys.stderr
    if stream is None:  # pythonw, or a closed stderr: nothing to say it on
        return
    stream.write(text + "\n")
    stream.flush()
