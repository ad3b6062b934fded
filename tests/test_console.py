"""Lines of several ranks sharing one stderr never fuse (a CI failure: two
'resuming from' lines torn into one, when workers ran with PYTHONUNBUFFERED)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

WRITER = """
import os, sys
from jitckpt.worker.console import log
for i in range(int(sys.argv[1])):
    log(f"resuming from minibatch {i}: /tmp/some/long/checkpoint/path/step-{i:08d}/rank-{int(os.environ['RANK']):05d}")
"""


def test_concurrent_ranks_write_whole_lines_on_an_unbuffered_shared_stderr():
    ranks, lines = 4, 1500
    read, write = os.pipe()
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(lines)], stderr=write, stdout=subprocess.DEVNULL,
                              env={**os.environ, "RANK": str(rank), "PYTHONUNBUFFERED": "1"})
             for rank in range(ranks)]
    os.close(write)
    with os.fdopen(read, encoding="utf-8") as stream:
        output = stream.read()
    assert all(p.wait(timeout=120) == 0 for p in procs), output[-2000:]
    pattern = re.compile(r"\[jitckpt rank (\d)\] resuming from minibatch (\d+): /tmp/some/long/checkpoint/path/"
                         r"step-(\d{8})/rank-(\d{5})")
    seen: dict[int, list[int]] = {rank: [] for rank in range(ranks)}
    for line in output.splitlines():
        match = pattern.fullmatch(line)
        assert match, f"torn line: {line!r}"
        rank, step = int(match[1]), int(match[2])
        assert int(match[3]) == step and int(match[4]) == rank, line
        seen[rank].append(step)
    assert seen == {rank: list(range(lines)) for rank in range(ranks)}
