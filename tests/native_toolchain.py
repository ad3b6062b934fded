"""Shared by the native test files: where the CUDA toolkit, NCCL's wheel and
the CPU device emulator are, the skips for a machine without them, and the
emulator build."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EMULATOR = ROOT / "emulator"
EMULATOR_BUILD = EMULATOR / "build"
CUDA_HOME = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))

# The emulator's environment variables; tests clear them so that the caller's
# environment cannot change a test's meaning.
EMULATOR_ENV = (
    "JITCKPT_SIMDEV_DEVICES",
    "JITCKPT_SIMDEV_MEMORY",
    "JITCKPT_SIMDEV_KERNELS",
    "JITCKPT_SIMDEV_FAULT",
    "JITCKPT_SIMDEV_TRACE",
    "JITCKPT_SIMDEV_NCCL_TIMEOUT",
    "JITCKPT_SIMDEV_NCCL_CHUNK",
    "CUDA_VISIBLE_DEVICES",
)


def nccl_wheel() -> Path | None:
    """The nvidia-nccl-cu13 package directory (include/nccl.h, lib/libnccl.so.2), if installed."""
    spec = importlib.util.find_spec("nvidia.nccl")
    if spec is None or not spec.submodule_search_locations:
        return None
    base = Path(list(spec.submodule_search_locations)[0])
    return base if (base / "include" / "nccl.h").exists() else None


def real_cudart() -> Path | None:
    """NVIDIA's libcudart.so.13 from the CUDA toolkit, if installed."""
    for candidate in [CUDA_HOME / "lib64" / "libcudart.so.13", *CUDA_HOME.glob("targets/*/lib/libcudart.so.13")]:
        if candidate.exists():
            return candidate
    return None


NCCL_WHEEL = nccl_wheel()
REAL_CUDART = real_cudart()

REQUIRES_CUDA_TOOLCHAIN = [
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA 13 toolkit) is not installed"),
    pytest.mark.skipif(NCCL_WHEEL is None, reason="nccl.h not found: pip install nvidia-nccl-cu13"),
    pytest.mark.skipif(REAL_CUDART is None, reason="the real libcudart.so.13 is not installed"),
]


def build_emulator() -> Path:
    """Run `make -C emulator` (a no-op when up to date) and return its build directory."""
    proc = subprocess.run(["make", "-C", str(EMULATOR), "-j2"], capture_output=True, text=True)
    assert proc.returncode == 0, f"make -C emulator failed:\n{proc.stdout}\n{proc.stderr}"
    return EMULATOR_BUILD


def header_include(variable: str, package: str, cache_dir: str, header: str) -> Path | None:
    """A library's headers, where the Makefiles look for them: $<variable>, NVIDIA's wheel (<package>/include,
    as a CUDA PyTorch installs it), the copy scripts/setup.sh caches (~/.cache/jitckpt/<cache_dir>/include)."""
    candidates = [os.environ.get(variable, "")]
    try:
        spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:
        spec = None
    if spec is not None and spec.submodule_search_locations:
        candidates += [str(Path(p) / "include") for p in spec.submodule_search_locations]
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    candidates.append(str(Path(cache) / "jitckpt" / cache_dir / "include"))
    for candidate in candidates:
        if candidate and (Path(candidate) / header).is_file():
            return Path(candidate)
    return None


CUBLAS_INCLUDE = header_include("CUBLAS_INCLUDE", "nvidia.cu13", "cublas-13", "cublas_api.h")
REQUIRES_CUBLAS_HEADER = pytest.mark.skipif(
    CUBLAS_INCLUDE is None, reason="cuBLAS's cublas_api.h not found: scripts/setup.sh caches it (or set CUBLAS_INCLUDE)")
# cuBLASLt's cublasLt.h beside it (the Makefiles forward and emulate cuBLASLt only then)
HAS_CUBLASLT_HEADER = CUBLAS_INCLUDE is not None and (CUBLAS_INCLUDE / "cublasLt.h").is_file()
REQUIRES_CUBLASLT_HEADER = pytest.mark.skipif(
    not HAS_CUBLASLT_HEADER, reason="cuBLASLt's cublasLt.h not found beside cublas_api.h: scripts/setup.sh caches it")
# cuDNN 9's headers (the Makefiles forward and emulate cuDNN only with them)
CUDNN_INCLUDE = header_include("CUDNN_INCLUDE", "nvidia.cudnn", "cudnn-9", "cudnn_graph.h")
REQUIRES_CUDNN_HEADER = pytest.mark.skipif(
    CUDNN_INCLUDE is None, reason="cuDNN's headers (cudnn_graph.h) not found: scripts/setup.sh caches them (or set "
                                  "CUDNN_INCLUDE)")
