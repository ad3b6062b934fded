"""Per-process event log: what each worker and the agent saw, with timestamps.

Every process of a job appends JSON lines to its own file in the run directory
(``JITCKPT_RUN_DIR``), so no two processes ever write the same file; the files
are owner-only (0600, their folder 0700), whatever the umask.  jit-run
reads them all back to build the recovery report.  Timestamps are wall-clock
(time.time()) because they are compared across processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from jitckpt import config

_log_file = None


def _open() -> Any:
    global _log_file
    if _log_file is None:
        run_dir = os.environ.get(config.ENV_RUN_DIR)
        if not run_dir:
            return None
        path = Path(run_dir) / "events"
        for folder in (path.parent, path):  # jit-run has made the run directory (0700); a hand-started worker may not
            with contextlib.suppress(FileExistsError):
                os.mkdir(folder, 0o700)
                os.chmod(folder, 0o700)  # mkdir's mode is masked by the umask
        fd = os.open(path / f"{os.getpid()}-{time.time_ns()}.jsonl",
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        os.fchmod(fd, 0o600)
        _log_file = open(fd, "a", buffering=1)
    return _log_file


def record(event_name: str, /, **fields: Any) -> None:
    """Append one event; a no-op outside jit-run.  Never raises into the caller."""
    try:
        log = _open()
        if log is None:
            return
        event = {"event": event_name, "time": time.time(), "pid": os.getpid(), **fields}
        log.write(json.dumps(event, default=str) + "\n")
        log.flush()
    except Exception:  # the event log must never take a worker down
        pass


def read_all(run_dir: str | os.PathLike) -> list[dict]:
    """All events of a job, sorted by time; malformed lines (a process killed mid-write) are skipped."""
    events = []
    folder = Path(run_dir) / "events"
    if not folder.is_dir():
        return events
    for file in folder.glob("*.jsonl"):
        for line in file.read_text(errors="replace").splitlines():
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return sorted(events, key=lambda e: e.get("time", 0.0))



def successful_exit(run_dir: str | os.PathLike, pid: int) -> dict | None:
    """Worker ``pid``'s ``worker_exit`` event if it recorded that its script ended successfully, else None."""
    for file in (Path(run_dir) / "events").glob(f"{pid}-*.jsonl"):
        for line in file.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if event.get("event") == "worker_exit" and event.get("script_succeeded"):
                return event
    return None
