"""Where jitckpt's native parts are: the only code that knows where ``.so`` files live.

The native parts are built by ``make`` from the source tree:

* ``emulator/``  -> the CPU device emulator, ``libcudart.so.13`` and ``libnccl.so.2``
  (DESIGN decision 9; "simdev" is its name for an emulated device);
* ``interpose/`` -> ``libjitckpt_interpose.so`` (the LD_PRELOAD interposition
  library) and, generated from the CUDA and NCCL headers, its coverage list
  (``coverage.json``, read by ``jit-run doctor``) and the cffi declarations of
  its control interface (``jitckpt_interpose.cdef``); and ``libjitckpt_remote.so``,
  the worker side of transparent mode;
* ``proxy_server/`` -> ``jitckpt-proxy``, the device proxy of transparent mode.

They are looked up in two places, first match wins:

1. **package data**, ``jitckpt/native/_build/{emulator,interpose,proxy_server}/``: what a
   wheel (``pip install .``) carries, copied there by the build hook
   (``setup.py``, ``native_build.py``), with ``build-info.json``: which headers
   they were built against, or that the wheel was built without them
   (``JITCKPT_BUILD_NATIVE=0``), which ``build_info`` reads;
2. **the source tree** this package sits in, ``emulator/build/``,
   ``interpose/build/`` and ``proxy_server/build/`` (an editable install or a plain checkout), built on
   demand by ``ensure_built``.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

PACKAGE_BUILD = Path(__file__).resolve().parent / "_build"
SOURCE_ROOT = Path(__file__).resolve().parent.parent.parent

EMULATOR = "emulator"
INTERPOSE = "interpose"
PROXY = "proxy_server"
# Files of each part, relative to its build directory (the first is the part's marker).
FILES: dict[str, tuple[str, ...]] = {
    EMULATOR: ("libcudart.so.13", "libnccl.so.2", "libcudart.so", "libnccl.so"),
    INTERPOSE: ("libjitckpt_interpose.so", "gen/coverage.json", "gen/jitckpt_interpose.cdef",
                "libjitckpt_remote.so"),
    PROXY: ("jitckpt-proxy",),
}
INTERPOSER_SONAME = "libjitckpt_interpose.so"
REMOTE_INTERPOSER = "libjitckpt_remote.so"
PROXY_EXECUTABLE = "jitckpt-proxy"


# What native_build.py records in a wheel, next to the parts (keep the name in step).
BUILD_INFO = "build-info.json"


def build_info() -> Optional[dict[str, Any]]:
    """The wheel's record of its native build (read as JSON data only), or None: a source tree, or unreadable."""
    try:
        info = json.loads((PACKAGE_BUILD / BUILD_INFO).read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def not_shipped_reason() -> Optional[str]:
    """Why this jitckpt has no native parts, when it was built without them on purpose (else None)."""
    info = build_info()
    if info is None or info.get("native") is not False:
        return None
    reason = info.get("reason")
    return (f"this jitckpt was installed without its native parts ({reason if isinstance(reason, str) else 'no reason'}"
            "): reinstall it without JITCKPT_BUILD_NATIVE=0, on a machine with make, gcc and the headers "
            "(an isolated `pip install` fetches the headers)")


class NativeMissing(RuntimeError):
    """A native part is not built and cannot be built here; the message says what to install."""


def source_dir(part: str) -> Path:
    """The part's source folder in the checkout (it may not exist in a wheel install)."""
    return SOURCE_ROOT / part


def _candidates(part: str) -> list[Path]:
    return [PACKAGE_BUILD / part, source_dir(part) / "build"]


def build_dir(part: str) -> Path | None:
    """The first directory holding every file of ``part``, or None if it is built nowhere."""
    for directory in _candidates(part):
        if all((directory / name).exists() for name in FILES[part]):
            return directory
    return None


def find(part: str, name: str) -> Path | None:
    """File ``name`` of ``part`` (e.g. ``find("interpose", "gen/coverage.json")``), or None."""
    directory = build_dir(part)
    return None if directory is None else directory / name


def ensure_built(part: str) -> Path:
    """The build directory of ``part``, running ``make`` in the source tree first if needed."""
    found = build_dir(part)
    if found is not None:
        return trusted(part, found)
    source = source_dir(part)
    if not (source / "Makefile").is_file():
        reason = not_shipped_reason()
        if reason is not None:
            raise NativeMissing(f"the {part} libraries are not installed: {reason}")
        raise NativeMissing(
            f"the {part} libraries are not installed with this jitckpt and there is no source tree at {source} "
            f"to build them from: reinstall jitckpt from a wheel built on a machine with gcc, the CUDA 13 headers "
            f"and nvidia-nccl-cu13"
        )
    try:
        # umask 022 whatever the user's: what jit-run preloads into every worker must not be writable by others
        result = subprocess.run(["make", "-s", "-C", str(source), "-j2", f"PYTHON={sys.executable}"],
                                capture_output=True, text=True, preexec_fn=lambda: os.umask(0o022))
    except OSError as exc:
        raise NativeMissing(f"the {part} libraries are not built and make cannot run ({exc})") from None
    found = build_dir(part)
    if result.returncode != 0 or found is None:
        raise NativeMissing(
            f"building {source} failed (it needs gcc, the CUDA 13 headers in /usr/local/cuda/include and "
            f"`pip install nvidia-nccl-cu13`):\n{result.stderr[-2000:]}"
        )
    return trusted(part, found)


def trusted(part: str, directory: Path) -> Path:
    """``directory`` if no file of ``part`` in it, nor a folder above them, can be changed by another user.

    jit-run preloads these libraries into every worker and runs the proxy as
    the job's user, so a file that others can write is code they can inject.
    Raises NativeMissing naming the file and the fix.
    """
    me = os.geteuid()
    checked: set[Path] = set()
    for name in FILES[part]:
        path = directory / name
        for item in (path, *path.parents):
            if item in checked or item == item.parent:
                break
            checked.add(item)
            try:
                info = item.stat()
            except OSError:
                continue
            sticky_dir = stat.S_ISDIR(info.st_mode) and info.st_mode & stat.S_ISVTX
            if info.st_uid not in (me, 0):
                raise NativeMissing(f"{item} belongs to another user (uid {info.st_uid}), and jitckpt runs its "
                                    f"{part} files as code in every worker: use a copy that you or root own")
            if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not sticky_dir:
                raise NativeMissing(f"{item} can be written by other users, and jitckpt runs its {part} files as "
                                    f"code in every worker: `chmod go-w {item}` (and rebuild if it may have "
                                    "been changed)")
    return directory
