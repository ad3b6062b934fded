"""Shared helpers: run real torchrun jobs of examples/train_mlp.py, with and without jit-run."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

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


def run_plain(nproc: int = 4, args: list[str] | None = None, script: Path = EXAMPLE) -> JobResult:
    """A fault-free run under plain torchrun, without jit-run (jitckpt is a no-op there)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           str(script), *(TRAIN_ARGS if script == EXAMPLE else []), *(args or [])]
    proc = subprocess.run(cmd, env=job_env(), capture_output=True, text=True, timeout=JOB_TIMEOUT, cwd=REPO)
    return JobResult(proc.returncode, proc.stdout + proc.stderr, None)


# torch 2.13's gloo teardown race (tests/test_shutdown.py): under plain torchrun a rank
# can abort in interpreter shutdown after its script finished and printed its result.
TEARDOWN_ABORT = "terminate called without an active exception"


def reference_sha(nproc: int = 4, args: list[str] | None = None, script: Path = EXAMPLE) -> str:
    """The final-parameter hash of a fault-free plain-torchrun run, the reference for bit-exactness.

    A run whose only defect is the known teardown abort, after rank 0 printed
    the hash, still computed the reference; any other failure is retried
    (at most three runs) and then fails the test with the output.
    """
    for _ in range(3):
        result = run_plain(nproc, args, script)
        if result.sha and (result.returncode == 0 or TEARDOWN_ABORT in result.output):
            return result.sha
    raise AssertionError("the fault-free reference run failed three times:\n" + result.output[-3000:])


def run_jit(
    ckpt_dir: Path,
    fault: str = "",
    max_restarts: int = 2,
    nproc: int = 4,
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
