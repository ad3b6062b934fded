"""Helpers shared by the benchmark drivers: launch a job, collect its BENCH events, print tables.

Each job runs as a subprocess with its stdout and stderr kept in a log
directory, so a failed run can be inspected afterwards.  The training
scripts report through ``BENCH {json}`` lines (``workload.emit``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Sequence

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
BENCH_PREFIX = "BENCH "


class RunFailed(RuntimeError):
    """A benchmark job exited non-zero or did not report what it should have."""


@dataclasses.dataclass
class Run:
    """One finished job: its command, exit status, wall time and BENCH events."""

    name: str
    cmd: list[str]
    returncode: int
    wall_seconds: float
    events: list[dict[str, Any]]
    log_dir: Path
    started_at: float = 0.0  # time.time() at launch
    cpu_seconds: float = 0.0  # user + system CPU of the job and every process of it that was reaped

    @property
    def ended_at(self) -> float:
        return self.started_at + self.wall_seconds

    def of(self, event: str, **match: Any) -> list[dict[str, Any]]:
        """Events named ``event`` whose fields equal ``match``."""
        return [e for e in self.events if e["event"] == event and all(e.get(k) == v for k, v in match.items())]

    def one(self, event: str, **match: Any) -> dict[str, Any]:
        """The single (last) matching event; raises RunFailed if there is none."""
        found = self.of(event, **match)
        if not found:
            raise RunFailed(f"{self.name}: no BENCH {event} {match or ''} event (logs: {self.log_dir})")
        return found[-1]


def free_port() -> int:
    """A TCP port free on loopback now (for a rendezvous of several agents on this machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun() -> list[str]:
    """The torchrun command: the console script if on PATH, else ``python -m torch.distributed.run``."""
    found = shutil.which("torchrun")
    return [found] if found else [sys.executable, "-m", "torch.distributed.run"]


def jit_run() -> list[str]:
    """The jit-run command: the console script installed next to this Python, else the one on PATH.

    (Not ``python -m`` a module of jitckpt: where its command line lives is
    jitckpt's business.)  The jobs still import the jitckpt of this checkout,
    which :func:`job_env` puts first on their ``PYTHONPATH``.
    """
    beside = Path(sys.executable).with_name("jit-run")
    found = str(beside) if beside.is_file() else shutil.which("jit-run")
    if not found:
        raise SystemExit(f"jit-run not found next to {sys.executable} nor on PATH: pip install -e {REPO}")
    return [found]


def job_env() -> dict[str, str]:
    """Environment for a job: the repository first on PYTHONPATH (the jobs use this checkout's jitckpt)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("JITCKPT_ENABLE", None)  # the admin switch would silently turn jit-run into plain torchrun
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def parse_events(text: str) -> list[dict[str, Any]]:
    """Every ``BENCH {json}`` record in ``text`` (torchrun may prefix lines, so search anywhere)."""
    events = []
    decoder = json.JSONDecoder()
    marker = BENCH_PREFIX + "{"
    at = text.find(marker)
    while at >= 0:
        try:
            record, _ = decoder.raw_decode(text, at + len(BENCH_PREFIX))
            events.append(record)
        except json.JSONDecodeError:
            pass  # a record cut by another process's output
        at = text.find(marker, at + len(marker))
    return events


def run_job(name: str, cmd: list[str], log_dir: Path, timeout: float = 900.0, cwd: Path | None = None) -> Run:
    """Run ``cmd`` to completion; stdout/stderr go to ``log_dir/{name}.out|.err``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log_dir / f"{name}.out", log_dir / f"{name}.err"
    (log_dir / f"{name}.cmd").write_text(" ".join(cmd) + "\n")
    started_at, started = time.time(), time.perf_counter()
    before = resource.getrusage(resource.RUSAGE_CHILDREN)  # (jobs run one at a time)
    with open(out_path, "w") as out, open(err_path, "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=job_env(), cwd=cwd or REPO, start_new_session=True)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)  # the job's own process group (start_new_session), nothing else
            proc.wait()
            code = -9
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return Run(name, cmd, code, wall, parse_events(out_path.read_text(errors="replace")), log_dir, started_at, cpu)


def require_ok(run: Run) -> Run:
    """Raise RunFailed unless the job exited 0."""
    if run.returncode != 0:
        raise RunFailed(f"{run.name} exited with status {run.returncode}; see {run.log_dir}/{run.name}.err")
    return run


def median(values: Iterable[float]) -> float:
    return statistics.median(list(values))


def spread(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    """``median [min, max]`` of ``values``."""
    if not values:
        return "-"
    return f"{fmt.format(median(values))} [{fmt.format(min(values))}, {fmt.format(max(values))}]"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table with aligned columns (readable in a terminal, pastes into RESULTS.md)."""
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(row: Sequence[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"

    out = [line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in cells[1:]]
    return "\n".join(out)


def machine_summary() -> str:
    """One line about the host: cores, memory, CPU model, torch version, load average."""
    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = "not installed"
    mem_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return f"{os.cpu_count()} cores, {mem_gb:.0f} GiB, {cpu}, torch {torch_version}, load average {load}"


def log(message: str) -> None:
    """Progress line on stderr (the tables go to stdout)."""
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)
