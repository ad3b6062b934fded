"""Per-process event log: what each worker and the agent saw, with timestamps.

Every process of a job appends JSON lines to its own file in the run directory
(``JITCKPT_RUN_DIR``), so no two processes ever write the same file; the files
are owner-only (0600, their folder and any it creates 0700), whatever the
umask.  A process that cannot record says so once on stderr.  jit-run
reads them all back to build the recovery report.  Timestamps are wall-clock
(time.time()) because they are compared across processes.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from jitckpt import config

_log_file = None
_cannot_record = False  # said once on stderr; no more tries in this process


def _make_folders(folder: Path) -> None:
    """Create ``folder`` and its missing parents owner-only (0700) whatever the umask; existing ones stay as they are.

    jit-run has made the run directory; a worker started by hand may be given
    one that does not exist yet, nested.  (The store's ``private`` module does
    this for the layers above; the event log sits below them.)
    """
    missing = []
    while not folder.is_dir() and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    for new in reversed(missing):
        with contextlib.suppress(FileExistsError):  # made meanwhile by another process of the job
            os.mkdir(new, 0o700)
            os.chmod(new, 0o700)  # mkdir's mode is masked by the umask


def _open() -> Any:
    global _log_file, _cannot_record
    if _log_file is None and not _cannot_record:
        run_dir = os.environ.get(config.ENV_RUN_DIR)
        if not run_dir:
            return None
        folder = Path(run_dir) / "events"
        try:
            _make_folders(folder)
            fd = os.open(folder / f"{os.getpid()}-{time.time_ns()}.jsonl",
                         os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
            os.fchmod(fd, 0o600)
        except OSError as exc:
            _say_cannot_record(f"{folder}: {exc.strerror or exc}")
            return None
        _log_file = open(fd, "a", buffering=1)
    return _log_file


def _say_cannot_record(reason: str) -> None:
    """Say once on stderr that this process's events are lost (jit-run's report will lack them), and stop trying."""
    global _cannot_record
    if not _cannot_record:
        _cannot_record = True
        with contextlib.suppress(Exception):
            print(f"jitckpt: cannot record this process's events ({reason}); jit-run's recovery report will lack "
                  f"them. Set {config.ENV_RUN_DIR} to a folder this user can create and write", file=sys.stderr, flush=True)


def record(event_name: str, /, **fields: Any) -> None:
    """Append one event; a no-op outside jit-run.  Never raises into the caller; if the event cannot be
    recorded, says so once on stderr."""
    try:
        log = _open()
        if log is None:
            return
        event = {"event": event_name, "time": time.time(), "pid": os.getpid(), **fields}
        log.write(json.dumps(event, default=str) + "\n")
        log.flush()
    except Exception as exc:  # the event log must never take a worker down
        _say_cannot_record(f"{type(exc).__name__}: {exc}")


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
