"""How a job is put on the CPU device emulator.

The emulator (``emulator/``, DESIGN decision 9) provides ``libcudart.so.13``
and ``libnccl.so.2`` built for the CPU.  A CUDA program built with
``nvcc -cudart shared`` runs on it when its directory comes first on
``LD_LIBRARY_PATH``; ``jit-run --emulated-gpus N`` does that for a job.
Where the libraries are is ``jitckpt.native``'s business.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from jitckpt import native

# The emulator's own variable: how many emulated devices ("simdevs") each process sees.
ENV_DEVICES = "JITCKPT_SIMDEV_DEVICES"


def library_dir() -> Path:
    """The directory holding the emulator's libraries, built first if needed (raises native.NativeMissing)."""
    return native.ensure_built(native.EMULATOR)


def job_environment(env: dict[str, str], devices: int) -> dict[str, str]:
    """``env`` changed so that CUDA programs in the job run on ``devices`` emulated GPUs per node.

    Raises ValueError for fewer than one device and NativeMissing when the emulator is not built
    (both carry the message for the user: ``jit-run --emulated-gpus``, in either mode)."""
    if devices < 1:
        raise ValueError("--emulated-gpus must be at least 1")
    build = library_dir()
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
        print(library_dir())
    except native.NativeMissing as exc:
        print(f"jit-run emulator-path: {exc}", file=sys.stderr)
        return 1
    return 0
