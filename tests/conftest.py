"""Shared helpers: run real torchrun jobs of examples/train_mlp.py, with and without jit-run;
and how the suite runs in parallel (pytest-xdist workers, the `serial` marker, the per-run
cache that the workers share, the native build before the workers start)."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.metadata
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, TypeVar

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "train_mlp.py"
JOB_TIMEOUT = 300
# Small but complete: Adam, StepLR, dropout with per-rank seeds, 2-way gradient accumulation.
TRAIN_ARGS = ["--steps", "24", "--accum", "2", "--log-every", "1000"]


def job_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    env.pop("JITCKPT_ACTIVE", None)
    env.pop("JITCKPT_FAULT", None)
    return env


@dataclass
class JobResult:
    returncode: int
    output: str
    report: dict | None

    @property
    def sha(self) -> str | None:
        found = re.findall(r"final parameters sha256 ([0-9a-f]{64})", self.output)
        return found[-1] if found else None


def run_plain(nproc: int = 3, args: list[str] | None = None, script: Path = EXAMPLE) -> JobResult:
    """A fault-free run under plain torchrun, without jit-run (jitckpt is a no-op there)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           str(script), *(TRAIN_ARGS if script == EXAMPLE else []), *(args or [])]
    proc = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, timeout=JOB_TIMEOUT, cwd=REPO)
    return JobResult(proc.returncode, proc.stdout + proc.stderr, None)


# torch 2.13's gloo teardown race (tests/test_shutdown.py): under plain torchrun a rank
# can abort in interpreter shutdown after its script finished and printed its result.
TEARDOWN_ABORT = "terminate called without an active exception"


def reference_sha(nproc: int = 3, args: list[str] | None = None, script: Path = EXAMPLE) -> str:
    """The final-parameter hash of a fault-free plain-torchrun run, the reference for bit-exactness.

    A run whose only defect is the known teardown abort, after rank 0 printed
    the hash, still computed the reference; any other failure is retried
    (at most three runs) and then fails the test with the output.

    Computed once per test run: the xdist workers and both passes of
    scripts/test.sh share the result (``computed_once``), keyed by the job and
    by every source it runs.
    """

    def compute() -> str:
        for _ in range(3):
            result = run_plain(nproc, args, script)
            if result.sha and (result.returncode == 0 or TEARDOWN_ABORT in result.output):
                return result.sha
        raise AssertionError("the fault-free reference run failed three times:\n" + result.output[-3000:])

    return computed_once("reference-sha", _job_key(nproc, args, script), compute)


def run_jit(
    ckpt_dir: Path,
    fault: str = "",
    max_restarts: int = 2,
    nproc: int = 3,
    hang_timeout: float = 3.0,
    args: list[str] | None = None,
    jit_options: list[str] | None = None,
    timeout: float = JOB_TIMEOUT,
    script: Path = EXAMPLE,
) -> JobResult:
    """The same job under jit-run (or ``script`` with only ``args``); returns output and the JSON report."""
    report_path = ckpt_dir.parent / f"{ckpt_dir.name}-report.json"
    if report_path.exists():
        report_path.unlink()
    cmd = [sys.executable, "-m", "jitckpt", "--checkpoint-dir", str(ckpt_dir), "--hang-timeout", str(hang_timeout),
           "--save-grace", "30", "--report", str(report_path), *(jit_options or [])]
    if fault:
        cmd += ["--fault", fault]
    cmd += ["torchrun", "--standalone", "--nproc_per_node", str(nproc), "--max-restarts", str(max_restarts),
            str(script), *(TRAIN_ARGS if script == EXAMPLE else []), *(args or [])]
    log_path = ckpt_dir.parent / f"{ckpt_dir.name}.log"  # kept for post-mortems, even on a timeout
    with open(log_path, "w") as log:
        proc = subprocess.run(cmd, env=job_env(), stdout=log, stderr=subprocess.STDOUT, text=True, timeout=timeout, cwd=REPO)
    output = log_path.read_text(errors="replace")
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    return JobResult(proc.returncode, output, report)


@pytest.fixture(scope="session")
def fault_free_sha() -> str:
    """Final-parameter hash of the fault-free run with plain torchrun (no jitckpt)."""
    return reference_sha()


class PlantedCode:
    """What an attacker with write access to a checkpoint root plants: a pickle that creates ``marker`` when loaded."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (open, (self.marker, "w"))


def plant_code(step_dir: Path, prefix: str, marker: Path) -> int:
    """Replace every file under ``prefix`` in each rank checkpoint of ``step_dir`` by planted code, with the
    metadata's checksums updated to match (old sha256 format); returns how many files were replaced."""
    import hashlib
    import pickle

    payload = pickle.dumps(PlantedCode(str(marker)))
    planted = 0
    for replica in sorted(step_dir.glob("rank-*")):
        meta_path = replica / "jitckpt-meta.json"
        meta = json.loads(meta_path.read_text())
        for name in list(meta["files"]):
            if name.startswith(prefix):
                (replica / name).write_bytes(payload)
                meta["files"][name] = {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest()}
                planted += 1
        meta_path.write_text(json.dumps(meta))
    return planted


# ---- running the suite in parallel ------------------------------------------------------------
#
# scripts/test.sh runs the suite in two passes (README, "Tests"):
#   1. every test not marked `serial`, on pytest-xdist workers (-n, --dist loadgroup,
#      --serial-tests=exclude);
#   2. the `serial` tests alone, one at a time (--serial-tests=only).
# A test is `serial` when it measures time or needs the machine to itself: beside other
# jobs on two cores its timing would fail for a busy machine, not for a bug.
#
# What each worker would otherwise do again is done once per run:
#   - reference_sha(): computed by the first worker that asks, read by the others from
#     the run's shared directory (computed_once, keyed by the job and its sources);
#   - the native parts (NATIVE_DIRS): built by the controller before the workers start,
#     so the tests' own `make` calls are no-ops and no two workers run make in one folder;
#   - CUDA test programs cached by source hash under the build folders: compiled under
#     build_lock(), so that one worker compiles and the others wait and reuse them;
#   - module fixtures that are one expensive job each (GROUPED_FIXTURES): the tests that
#     use one go to the same worker (an xdist_group), which computes it once.

SHARED_ENV = "JITCKPT_TEST_SHARED"  # the run's shared directory (scripts/test.sh sets it for both passes)
T = TypeVar("T")
LOCK_DIR = Path(tempfile.gettempdir()) / f"jitckpt-tests-{os.getuid()}"
NATIVE_DIRS = ("emulator", "interpose", "proxy_server", "examples/cuda_mlp")
# Module fixtures that run a job, or build into a temporary folder, once per worker: the
# tests of that file that use one run on the same worker, which computes it once.
GROUPED_FIXTURES: dict[str, tuple[str, ...]] = {
    "tests/test_frameworks.py": ("hf_fault_free", "lightning_fault_free"),  # a framework job each
    "tests/test_optimizer_phase.py": ("zero", "lbfgs", "gan"),              # a traced plain run each
    "tests/test_cuda_mlp.py": ("dp_runs", "single_rank"),                   # torchrun jobs of the CUDA program
    "tests/test_doctor.py": ("cuda_builds",),                               # six nvcc runs
    "tests/test_proxy_recovery.py": ("reference",),                         # a fault-free CUDA job
    "tests/test_native_nccl_versions.py": ("builds",),                      # the native parts, twice
    "tests/test_wheel.py": ("image", "bare_python"),                        # a wheel build, a venv
}


_held_locks: dict[Path, int] = {}


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` against other processes (xdist workers, other sessions).

    Re-entrant within one process: a fixture that holds it may call code that takes it again.
    """
    path = path.resolve()
    if _held_locks.get(path):
        _held_locks[path] += 1
        try:
            yield
        finally:
            _held_locks[path] -= 1
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        _held_locks[path] = 1
        try:
            yield
        finally:
            _held_locks[path] = 0
            fcntl.flock(handle, fcntl.LOCK_UN)


def build_lock() -> contextlib.AbstractContextManager[None]:
    """Held while building into the checkout's build folders (make, nvcc test programs).

    One build at a time for this user on this machine: the second worker that
    needs a cached program waits for the first and finds it built.
    """
    return file_lock(LOCK_DIR / "build.lock")


def with_build_lock(fixture: Callable[..., T]) -> Callable[..., T]:
    """Decorates a fixture that builds into a cache under the checkout's build folders:
    it runs under build_lock(), so that one xdist worker builds and the others reuse."""

    @functools.wraps(fixture)
    def locked(*args: object, **kwargs: object) -> T:
        with build_lock():
            return fixture(*args, **kwargs)

    return locked


def shared_dir() -> Path:
    """This run's directory, shared by the xdist workers and by both passes of scripts/test.sh."""
    return Path(os.environ[SHARED_ENV])


def computed_once(kind: str, key: str, compute: Callable[[], str]) -> str:
    """``compute()`` for ``key``, run by the first caller of this run; the others wait for it and read it.

    The value is kept as JSON (files read back are data, never code).  A
    failure is not kept: the next caller computes again and fails on its own.
    """
    directory = shared_dir() / kind
    result = directory / f"{key}.json"
    with file_lock(directory / f"{key}.lock"):
        if result.exists():
            return json.loads(result.read_text())["value"]
        value = compute()
        partial = directory / f"{key}.json.tmp-{os.getpid()}"
        partial.write_text(json.dumps({"value": value}))
        partial.replace(result)
        return value


def _job_key(nproc: int, args: list[str] | None, script: Path) -> str:
    """What a plain run's result depends on: its command line, the script and the Python
    files beside it, the jitckpt package, Python's and torch's versions."""
    try:
        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = "none"
    digest = hashlib.sha256(json.dumps({
        "nproc": nproc, "script": str(script), "args": [*(TRAIN_ARGS if script == EXAMPLE else []), *(args or [])],
        "python": sys.version, "torch": torch_version,
    }).encode())
    sources = {script, *script.parent.glob("*.py"), *(REPO / "jitckpt").rglob("*.py")}
    for path in sorted(sources):
        digest.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--serial-tests", choices=("include", "exclude", "only"), default="include",
        help="tests marked serial: run them with the others (default), leave them out (scripts/test.sh's "
             "parallel pass) or run only them (its serial pass)")


_MADE_SHARED = pytest.StashKey[str]()
_EXIT_STATUS = pytest.StashKey[int]()


@pytest.hookimpl(tryfirst=True)  # before pytest's tmp_path factory reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    if not config.pluginmanager.hasplugin("xdist"):  # the groups below are then only labels
        config.addinivalue_line("markers", "xdist_group(name): tests that pytest-xdist runs on one worker")
    if hasattr(config, "workerinput"):
        return  # an xdist worker: the controller's directory and basetemp are in its environment and options
    if not os.environ.get(SHARED_ENV):  # not under scripts/test.sh: this session's own directory
        made = tempfile.mkdtemp(prefix="jt-")
        os.environ[SHARED_ENV] = made
        config.stash[_MADE_SHARED] = made
    if _uses_xdist(config) and config.option.basetemp is None:
        # Each worker's tmp_path is under <basetemp>/popen-gwN/: keep the paths as short as a
        # run without xdist has (/tmp/pytest-of-USER/pytest-N/), for tests that place Unix
        # sockets there (108 bytes at most).
        config.option.basetemp = str(shared_dir() / "tmp")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


def pytest_unconfigure(config: pytest.Config) -> None:
    made = config.stash.get(_MADE_SHARED, None)
    if made:
        os.environ.pop(SHARED_ENV, None)
        if config.stash.get(_EXIT_STATUS, 0) == 0:
            shutil.rmtree(made, ignore_errors=True)
        elif (Path(made) / "tmp").is_dir():
            print(f"\n[tests] the workers' temporary files are kept in {made}/tmp", file=sys.stderr)
        else:
            shutil.rmtree(made, ignore_errors=True)


def _uses_xdist(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not hasattr(config, "workerinput")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Before the xdist workers start: bring the native parts up to date, once."""
    config = session.config
    if not _uses_xdist(config) or config.option.collectonly or shutil.which("nvcc") is None:
        return
    for folder in NATIVE_DIRS:
        if not (REPO / folder / "Makefile").is_file():
            continue
        with build_lock():
            proc = subprocess.run(["make", "-s", "-C", str(REPO / folder), "-j2", f"PYTHON={sys.executable}"],
                                  capture_output=True, text=True)
        if proc.returncode != 0:  # the tests that need it run make again and fail with its output
            print(f"\n[tests] make -C {folder} failed before the workers started:\n{proc.stderr[-2000:]}",
                  file=sys.stderr)


# Seconds per test of the files whose tests are multi-process jobs (the parallel pass of 2026-11-27, 2-core
# machine): they are handed out first, so that the pass does not end with one worker on a 90 s job while the
# others have nothing left (the last files in name order, test_user_code_faults to test_wheel, are such jobs).
# A hint for the order only: a file not listed comes after them, in its usual place.
SECONDS_PER_TEST = {
    "test_save_grace": 95, "test_multinode": 81, "test_memory_tier": 55, "test_sharded": 53, "test_pytorch_examples": 49,
    "test_bad_checkpoints": 47, "test_user_code_faults": 46, "test_recovery": 45, "test_warm_restart": 45,
    "test_strict_matrix": 44, "test_nccl_ordering": 43, "test_data_loading": 41, "test_frameworks": 41,
    "test_optimizer_phase": 38, "test_step_agreement": 28, "test_wheel": 20, "test_nccl_order_backend": 20,
    "test_shutdown": 18, "test_native_nccl_versions": 12,
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """--serial-tests; the xdist groups (serial tests on one worker, GROUPED_FIXTURES' tests together); the
    longest jobs first (SECONDS_PER_TEST; a stable sort: each file keeps its tests' order)."""
    mode = config.getoption("serial_tests")
    if mode != "include":
        keep, dropped = [], []
        for item in items:
            (keep if (item.get_closest_marker("serial") is not None) == (mode == "only") else dropped).append(item)
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
    for item in items:
        if item.get_closest_marker("serial") is not None:
            item.add_marker(pytest.mark.xdist_group("serial"))  # under plain `pytest -n`: at least one at a time
            continue
        path = item.nodeid.split("::")[0]
        shared = sorted(set(getattr(item, "fixturenames", ())) & set(GROUPED_FIXTURES.get(path, ())))
        if shared:
            item.add_marker(pytest.mark.xdist_group(f"{path}:{'+'.join(shared)}"))
    items.sort(key=lambda item: -SECONDS_PER_TEST.get(Path(item.nodeid.split("::")[0]).stem, 0))


def _cpu_seconds() -> float:
    """User + system seconds of this process and of every child it has waited for (and theirs, transitively)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Record each test's CPU seconds (its processes', once reaped) in the run's shared directory, one file per
    pytest process, for scripts/test.sh's table of the tests that cost the most CPU: on two cores the suite is
    CPU-bound, so CPU, not wall time, is what a test costs the run."""
    cpu, wall = _cpu_seconds(), time.monotonic()
    yield
    folder = shared_dir() / "cpu-per-test"
    folder.mkdir(exist_ok=True)
    name = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(folder / f"{name}-{os.getpid()}.tsv", "a") as out:
        out.write(f"{_cpu_seconds() - cpu:.2f}\t{time.monotonic() - wall:.2f}\t{item.nodeid}\n")
