"""Where the CPU device emulator lives, and how a job is put on it.

The emulator (``emulator/``, DESIGN decision 9) provides ``libcudart.so.13``
and ``libnccl.so.2`` built for the CPU.  A CUDA program built with
``nvcc -cudart shared`` runs on it when its directory comes first on
``LD_LIBRARY_PATH``; ``jit-run --emulated-gpus N`` does that for a job.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SOURCE_DIR = Path(__file__).resolve().parent.parent / "emulator"
BUILD_DIR = SOURCE_DIR / "build"
ENV_DEVICES = "JITCKPT_SIMDEV_DEVICES"


class EmulatorMissing(RuntimeError):
    """The emulator libraries are not built and cannot be built here."""


def ensure_built() -> Path:
    """The directory holding the emulator's libraries, building them first if needed."""
    if (BUILD_DIR / "libcudart.so.13").is_file() and (BUILD_DIR / "libnccl.so.2").is_file():
        return BUILD_DIR
    if not (SOURCE_DIR / "Makefile").is_file():
        raise EmulatorMissing(f"the CPU device emulator sources are not at {SOURCE_DIR} (install jitckpt from a source checkout)")
    result = subprocess.run(["make", "-s", "-C", str(SOURCE_DIR), "-j2"], capture_output=True, text=True)
    if result.returncode != 0:
        raise EmulatorMissing(
            "building the CPU device emulator failed (it needs gcc, the CUDA 13 headers in "
            "/usr/local/cuda/include and `pip install nvidia-nccl-cu13`):\n" + result.stderr[-2000:]
        )
    return BUILD_DIR


def job_environment(env: dict[str, str], devices: int) -> dict[str, str]:
    """``env`` changed so that CUDA programs in the job run on ``devices`` emulated GPUs per node."""
    build = ensure_built()
    env = dict(env)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (str(build), env.get("LD_LIBRARY_PATH", "")) if p)
    env[ENV_DEVICES] = str(devices)
    return env


def print_path(argv: list[str]) -> int:
    """`jit-run emulator-path`: print the directory to put first on LD_LIBRARY_PATH."""
    if argv:
        print("usage: jit-run emulator-path   (prints the emulator's library directory)", file=sys.stderr)
        return 2
    try:
        print(ensure_built())
    except EmulatorMissing as exc:
        print(f"jit-run emulator-path: {exc}", file=sys.stderr)
        return 1
    return 0
