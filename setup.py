"""Build hook: installing jitckpt also builds its native parts with make.

- ``emulator/``: the CPU device emulator (``libcudart.so.13``, ``libnccl.so.2``);
- ``interpose/``: the LD_PRELOAD interposition library, its generated coverage
  list and cffi declarations.

Their build outputs are copied into the package (``jitckpt/native/_build/``),
so a wheel carries them and a non-editable install works like a checkout;
``jitckpt.native`` looks there first, then in the source tree.

They need make, gcc, the CUDA 13 runtime headers and NCCL's header (from
``pip install nvidia-nccl-cu13``; install with ``--no-build-isolation`` so the
build can see it).  If something is missing the install says which and how to
get it.  With ``JITCKPT_REQUIRE_NATIVE=1`` that is an error; otherwise it is a
warning, because user-level mode is pure Python and works without them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
NATIVE_DIRS = ("emulator", "interpose", "proxy_server")
# What each native part ships, relative to its build/ directory.  Kept in
# step with jitckpt.native.FILES (tests/test_wheel.py checks a real wheel).
SHIPPED = {
    "emulator": ("libcudart.so.13", "libnccl.so.2", "libcudart.so", "libnccl.so"),
    "interpose": ("libjitckpt_interpose.so", "gen/coverage.json", "gen/jitckpt_interpose.cdef",
                  "libjitckpt_remote.so"),
    "proxy_server": ("jitckpt-proxy",),
}


def missing_prerequisites() -> list[str]:
    """What the native build needs and cannot find, each with how to get it."""
    missing = []
    for tool, package in (("make", "make"), ("gcc", "build-essential")):
        if shutil.which(tool) is None:
            missing.append(f"{tool} (apt-get install {package})")
    cuda_include = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "include" / "cuda_runtime_api.h"
    if not cuda_include.is_file():
        missing.append(f"the CUDA 13 runtime headers ({cuda_include}; install the CUDA toolkit or set CUDA_HOME)")
    try:
        import nvidia.nccl  # noqa: F401
    except ImportError:
        missing.append("NCCL's header nccl.h (pip install nvidia-nccl-cu13, then install jitckpt with --no-build-isolation)")
    return missing


def build_native() -> None:
    """Run make in every native folder; report or raise on what is missing."""
    required = os.environ.get("JITCKPT_REQUIRE_NATIVE") == "1"
    missing = missing_prerequisites()
    if missing:
        message = "jitckpt: the native parts (CPU device emulator, interposition library) are not built; missing:\n  - " + "\n  - ".join(missing)
        if required:
            raise SystemExit(message)
        print("WARNING: " + message, file=sys.stderr)
        return
    for folder in NATIVE_DIRS:
        if (ROOT / folder / "Makefile").is_file():
            print(f"jitckpt: building {folder}/", file=sys.stderr)
            subprocess.run(["make", "-s", "-C", str(ROOT / folder), "-j2", f"PYTHON={sys.executable}"], check=True)


def copy_native(build_lib: Path) -> None:
    """Copy the built native parts into ``build_lib/jitckpt/native/_build/<part>/`` (symlinks as files)."""
    for part, names in SHIPPED.items():
        source = ROOT / part / "build"
        if not all((source / name).exists() for name in names):
            continue  # not built here (warned above): user-level mode still works
        target = build_lib / "jitckpt" / "native" / "_build" / part
        for name in names:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source / name, target / name)  # follows symlinks
            shutil.copymode(source / name, target / name)


class BuildPyWithNative(build_py):
    """build_py that also builds the native parts and ships them (runs for wheels and editable installs)."""

    def run(self) -> None:
        build_native()
        super().run()
        if not self.editable_mode:  # an editable install finds them in the source tree
            copy_native(Path(self.build_lib))


setup(cmdclass={"build_py": BuildPyWithNative})
