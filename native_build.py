"""Building jitckpt's native parts: the headers they need, make, and the build backend that asks for them.

The native parts are C, built by ``make`` with gcc (nothing needs nvcc):

* ``emulator/``     the CPU device emulator (``libcudart.so.13``, ``libnccl.so.2``);
* ``interpose/``    the interposition libraries, their coverage list and cffi declarations;
* ``proxy_server/`` ``jitckpt-proxy``, the device proxy of transparent mode.

They compile against two sets of headers, looked for in this order:

* the **CUDA 13 runtime headers** (``cuda_runtime_api.h`` and the ``crt/``
  headers it includes, ``cuda_profiler_api.h``, ``cuda.h`` (the driver API,
  which transparent mode fences), and ``nv/target``, which
  ``nccl.h`` pulls in through ``cuda_fp16.h``): ``$CUDA_INCLUDE`` if set;
  else the CUDA toolkit's, ``$CUDA_HOME/include`` (default
  ``/usr/local/cuda``); else NVIDIA's header wheels (``nvidia-cuda-runtime``,
  ``nvidia-cuda-crt``, ``nvidia-cuda-cccl``, ``nvidia-cuda-profiler-api``:
  about 7 MB, ``nvidia/cu13/include``), in the build environment or already
  installed in the environment being installed into;
* **NCCL's** ``nccl.h``: ``$NCCL_INCLUDE`` if set; else the
  ``nvidia-nccl-cu13`` wheel's, in the build environment or already installed
  in the environment being installed into (a CUDA PyTorch brings it: the
  NCCL the jobs will load); else a system one (``$NCCL_HOME/include``,
  ``$CUDA_HOME/include``, ``/usr/include``, ``/usr/local/include``).

This module is the PEP 517 build backend named in ``pyproject.toml``:
setuptools' own, except that ``get_requires_for_build_wheel`` (and
``_editable``) asks pip for the header wheels that are still missing, and only
those.  A host with the toolkit and NCCL's header asks for none; and
``nvidia-nccl-cu13`` (a 300 MB wheel, for one 30 kB header) is asked for only
when no ``nccl.h`` is found anywhere else.  So a plain, isolated
``pip wheel .`` or ``pip install .`` builds the complete wheel.  ``setup.py``
calls ``build_native``/``copy_native`` from its ``build_py`` step.

If the native parts cannot be built, the build **fails**, saying what is
missing and how to get it.  Two environment variables change that:

* ``JITCKPT_BUILD_NATIVE=0``: build a pure-Python jitckpt (user-level mode
  only: no emulator, no interposer, no device proxy) and say so; the wheel
  records it (``jitckpt/native/_build/build-info.json``), so that
  ``jitckpt.native`` can say it too when a native part is asked for;
* ``JITCKPT_HEADER_WHEELS=0``: never ask pip for header wheels (an offline
  build, or one that must use the toolkit's and the system's headers).

Every wheel with native parts records, in the same file, which headers it was
built against.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F401,F403  (every other hook is setuptools')

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
# Shipped when built: the emulator's libraries of cuBLAS, cuBLASLt and cuDNN (built only with their headers).
SHIPPED_IF_BUILT = {"emulator": ("libcublas.so.13", "libcublasLt.so.13", "libcudnn.so.9")}
# The libraries transparent mode forwards at the library level when the build has their headers: a function of
# each that the generated coverage list marks transparent, and where the headers come from.
FORWARDED_LIBRARIES = {
    "cuBLAS": ("cublasSgemm_v2", "CUBLAS_INCLUDE, the nvidia-cublas wheel (nvidia/cu13/include)"),
    "cuBLASLt": ("cublasLtMatmul", "cublasLt.h beside cuBLAS's headers"),
    "cuDNN": ("cudnnBackendExecute", "CUDNN_INCLUDE, the nvidia-cudnn-cu13 wheel (nvidia/cudnn/include)"),
}
# Written next to the shipped parts; read by jitckpt.native (keep the name in step).
BUILD_INFO = "build-info.json"

ENV_BUILD_NATIVE = "JITCKPT_BUILD_NATIVE"
ENV_HEADER_WHEELS = "JITCKPT_HEADER_WHEELS"

# NVIDIA's wheels that carry the CUDA 13 runtime headers the build needs (all under nvidia/cu13/include).
CUDA_HEADER_WHEELS = ("nvidia-cuda-runtime>=13,<14", "nvidia-cuda-crt>=13,<14", "nvidia-cuda-cccl>=13,<14",
                      "nvidia-cuda-profiler-api>=13,<14")
NCCL_HEADER_WHEEL = "nvidia-nccl-cu13>=2.27"
# The CUDA headers the sources include (directly, or through cuda_runtime_api.h and nccl.h); cuda.h is read
# by interpose/tools/gen_driver_guard.py (every driver function, fenced in transparent mode).
CUDA_HEADERS = ("cuda_runtime_api.h", "crt/host_defines.h", "cuda_profiler_api.h", "cuda.h")
NV_TARGET = "nv/target"


class NativeBuildError(Exception):
    """The native parts cannot be built here; the message says why and what to do."""


# ---- what the user asked for -----------------------------------------------------------------------


def _switch(name: str) -> bool:
    """An on/off environment variable: True unless it is 0 (unset or 1 is on); anything else is an error."""
    value = os.environ.get(name, "").strip()
    if value not in ("", "0", "1"):
        raise NativeBuildError(f"{name}={value!r}: use 1 (the default) or 0")
    return value != "0"


def native_wanted() -> bool:
    """False when JITCKPT_BUILD_NATIVE=0 asks for a pure-Python jitckpt."""
    return _switch(ENV_BUILD_NATIVE)


# ---- where the headers are -------------------------------------------------------------------------


@dataclass
class Headers:
    """An include directory, how it was found, and (for the CUDA headers) where ``nv/target`` is."""

    include: Path
    how: str
    version: str
    extra_include: Optional[Path] = None  # a second directory to search (the toolkit's include/cccl)

    def to_json(self) -> dict[str, Any]:
        """What build-info.json records about it."""
        return {"include": str(self.include), "how": self.how, "version": self.version}


def _build_env_sites() -> list[Path]:
    """The directories this interpreter imports from: pip's build environment (or, without build isolation,
    the environment itself)."""
    return [Path(p) for p in sys.path if p and Path(p).is_dir()]


def _target_sites() -> list[Path]:
    """The site-packages of the environment being installed into (under pip's build isolation too: the
    interpreter is the target's, only its sys.path is changed)."""
    paths = sysconfig.get_paths()
    return list(dict.fromkeys(Path(paths[k]) for k in ("purelib", "platlib") if k in paths))


def _wheel_version(site: Path, name: str) -> str:
    """``name``'s version as installed in ``site``, or "" if its metadata is not there."""
    from importlib.metadata import distributions

    for dist in distributions(path=[str(site)]):
        if (dist.metadata["Name"] or "").lower().replace("_", "-") == name:
            return dist.version
    return ""


def _define(header: Path, name: str) -> str:
    """The value of ``#define name VALUE`` in ``header``, or ""."""
    try:
        found = re.search(rf"^#\s*define\s+{name}\s+(\S+)", header.read_text(errors="replace"), re.M)
    except OSError:
        return ""
    return found.group(1) if found else ""


def _explicit(variable: str) -> Optional[Path]:
    """The directory an environment variable names, if it is set."""
    value = os.environ.get(variable, "").strip()
    return Path(value) if value else None


def _wheel_sites(build_env: bool) -> list[tuple[Path, str]]:
    """Where installed wheels may hold headers, each with its description: the build environment (unless
    ``build_env`` is False), then the environment being installed into."""
    places = [(site, "the build environment") for site in (_build_env_sites() if build_env else [])]
    return places + [(site, "the environment being installed into") for site in _target_sites()]


def _cuda_at(include: Path, how: str) -> Optional[Headers]:
    """The CUDA headers in ``include`` if every one the build needs is there."""
    if not all((include / name).is_file() for name in CUDA_HEADERS):
        return None
    if (include / NV_TARGET).is_file():
        extra = None
    elif (include / "cccl" / NV_TARGET).is_file():  # a CUDA 13 toolkit keeps CCCL in include/cccl
        extra = include / "cccl"
    else:
        return None
    return Headers(include, how, _define(include / "cuda_runtime_api.h", "CUDART_VERSION"), extra)


def find_cuda_headers(build_env: bool = True) -> tuple[Optional[Headers], list[str]]:
    """The CUDA 13 runtime headers (see the module's docstring for the order), and every place looked at."""
    explicit = _explicit("CUDA_INCLUDE")
    if explicit:
        return _cuda_at(explicit, "CUDA_INCLUDE"), [f"CUDA_INCLUDE={explicit}"]
    cuda_home = _explicit("CUDA_HOME") or Path("/usr/local/cuda")
    searched = [f"the CUDA toolkit, {cuda_home}/include (CUDA_HOME)"]
    found = _cuda_at(cuda_home / "include", f"the CUDA toolkit, CUDA_HOME={cuda_home}")
    if found:
        return found, searched
    for site, where in _wheel_sites(build_env):
        found = _cuda_at(site / "nvidia" / "cu13" / "include", f"NVIDIA's header wheels in {where}")
        if found:
            versions = ", ".join(f"{name} {v}" for name in ("nvidia-cuda-runtime", "nvidia-cuda-crt",
                                                              "nvidia-cuda-cccl", "nvidia-cuda-profiler-api")
                                 if (v := _wheel_version(site, name)))
            found.how += f" ({versions})" if versions else ""
            return found, searched
    searched.append("NVIDIA's header wheels (nvidia/cu13/include) in "
                    + ("the build environment and " if build_env else "") + "the environment being installed into")
    return None, searched


def _nccl_at(include: Path, how: str) -> Optional[Headers]:
    header = include / "nccl.h"
    if not header.is_file():
        return None
    version = ".".join(_define(header, f"NCCL_{part}") for part in ("MAJOR", "MINOR", "PATCH"))
    return Headers(include, how, version)


def find_nccl_header(build_env: bool = True) -> tuple[Optional[Headers], list[str]]:
    """NCCL's header (see the module's docstring for the order), and every place looked at."""
    explicit = _explicit("NCCL_INCLUDE")
    if explicit:
        return _nccl_at(explicit, "NCCL_INCLUDE"), [f"NCCL_INCLUDE={explicit}"]
    searched: list[str] = []
    for site, where in _wheel_sites(build_env):
        include = site / "nvidia" / "nccl" / "include"
        if (include / "nccl.h").is_file():
            version = _wheel_version(site, "nvidia-nccl-cu13")
            return _nccl_at(include, f"nvidia-nccl-cu13{f' {version}' if version else ''} in {where}"), searched
    searched.append("nvidia-nccl-cu13 (nvidia/nccl/include) in "
                    + ("the build environment and " if build_env else "") + "the environment being installed into")
    nccl_home = _explicit("NCCL_HOME")
    system = [nccl_home / "include"] if nccl_home else []
    system += [(_explicit("CUDA_HOME") or Path("/usr/local/cuda")) / "include", Path("/usr/include"),
               Path("/usr/local/include")]
    for include in system:
        found = _nccl_at(include, f"the system's, {include}")
        if found:
            return found, searched
    searched.append(", ".join(str(p) for p in system))
    return None, searched


def missing_tools() -> list[str]:
    """The build tools that are not on PATH, each with how to get it."""
    return [f"{tool} (e.g. apt-get install {package})"
            for tool, package in (("make", "make"), ("gcc", "gcc")) if shutil.which(tool) is None]


# ---- the build backend: ask pip only for what is missing ------------------------------------------


def header_requirements() -> list[str]:
    """The header wheels the build environment needs: those whose headers are found nowhere else."""
    if not native_wanted() or missing_tools() or not _switch(ENV_HEADER_WHEELS):
        return []  # nothing to build, or the build is going to fail at once and say why
    wanted: list[str] = []
    if find_cuda_headers(build_env=False)[0] is None:
        wanted += CUDA_HEADER_WHEELS
    if find_nccl_header(build_env=False)[0] is None:
        wanted.append(NCCL_HEADER_WHEEL)
    if wanted:
        print(f"jitckpt: the native build asks for header wheels: {', '.join(wanted)}", file=sys.stderr)
    return wanted


def get_requires_for_build_wheel(config_settings: Optional[dict] = None) -> list[str]:
    """setuptools' requirements plus the header wheels still missing (PEP 517)."""
    return _setuptools.get_requires_for_build_wheel(config_settings) + header_requirements()


def get_requires_for_build_editable(config_settings: Optional[dict] = None) -> list[str]:
    """As for a wheel: an editable install builds the native parts in the source tree (PEP 660)."""
    return _setuptools.get_requires_for_build_editable(config_settings) + header_requirements()


# ---- the build ---------------------------------------------------------------------------------------


def _skipped_message() -> str:
    return (f"jitckpt: {ENV_BUILD_NATIVE}=0: building a pure-Python jitckpt without its native parts (the CPU "
            "device emulator, the interposition libraries, the device proxy): user-level mode works, transparent "
            "mode and --emulated-gpus do not")


def build_native() -> Optional[dict[str, Any]]:
    """Run make in every native folder; the build-info record, or None when skipped (JITCKPT_BUILD_NATIVE=0).

    Raises NativeBuildError naming everything that is missing, or the folder whose make failed."""
    if not native_wanted():
        print(_skipped_message(), file=sys.stderr)
        return None
    absent = [folder for folder in NATIVE_DIRS if not (ROOT / folder / "Makefile").is_file()]
    if absent:
        raise NativeBuildError(f"the native parts' sources ({', '.join(f + '/' for f in absent)}) are not in "
                               f"{ROOT}: build from a checkout of the repository")
    missing = missing_tools()
    cuda, cuda_searched = find_cuda_headers()
    nccl, nccl_searched = find_nccl_header()
    if cuda is None:
        missing.append("the CUDA 13 runtime headers (cuda_runtime_api.h, crt/host_defines.h, cuda_profiler_api.h, "
                       f"nv/target); looked in: {'; '.join(cuda_searched)}. Install the CUDA toolkit and set "
                       f"CUDA_HOME, or let pip install {' '.join(CUDA_HEADER_WHEELS)} (an isolated build does that "
                       f"unless {ENV_HEADER_WHEELS}=0)")
    if nccl is None:
        missing.append(f"NCCL's header nccl.h; looked in: {'; '.join(nccl_searched)}. Set NCCL_INCLUDE, install "
                       f"libnccl-dev, or let pip install {NCCL_HEADER_WHEEL} (an isolated build does that unless "
                       f"{ENV_HEADER_WHEELS}=0)")
    if missing:
        raise NativeBuildError("jitckpt: cannot build the native parts (the CPU device emulator, the interposition "
                               "libraries, the device proxy); missing:\n  - " + "\n  - ".join(missing)
                               + f"\nTo install jitckpt without them (user-level mode only): {ENV_BUILD_NATIVE}=0")
    assert cuda is not None and nccl is not None
    print(f"jitckpt: building the native parts against the CUDA {cuda.version} runtime headers in {cuda.include} "
          f"({cuda.how}) and NCCL {nccl.version}'s nccl.h in {nccl.include} ({nccl.how})", file=sys.stderr)
    env = dict(os.environ)
    if cuda.extra_include is not None:
        env["CPATH"] = os.pathsep.join(p for p in (str(cuda.extra_include), env.get("CPATH", "")) if p)
    jobs = max(1, min(os.cpu_count() or 1, 8))
    for folder in NATIVE_DIRS:
        print(f"jitckpt: building {folder}/", file=sys.stderr)
        done = subprocess.run(["make", "-s", "-C", str(ROOT / folder), f"-j{jobs}", f"PYTHON={sys.executable}",
                               f"CUDA_INCLUDE={cuda.include}", f"NCCL_INCLUDE={nccl.include}"], env=env)
        if done.returncode != 0:
            raise NativeBuildError(f"jitckpt: building the native parts failed: `make -C {folder}` exited with "
                                   f"status {done.returncode} (its messages are above).\nTo install jitckpt without "
                                   f"them (user-level mode only): {ENV_BUILD_NATIVE}=0")
    forwarded = forwarded_libraries()
    absent = [name for name, on in forwarded.items() if not on]
    print("jitckpt: transparent mode forwards " + (", ".join(n for n, on in forwarded.items() if on) or "none")
          + " of NVIDIA's libraries" + ("" if not absent else "; not " + ", ".join(absent) + " (their headers were not "
          "found: " + "; ".join(f"{n}: {FORWARDED_LIBRARIES[n][1]}" for n in absent) + ", or the copy "
          "scripts/setup.sh caches in ~/.cache/jitckpt), whose calls transparent mode then refuses"), file=sys.stderr)
    return {"native": True, "cuda_headers": cuda.to_json(), "nccl_header": nccl.to_json(), "forwarded": forwarded}


def forwarded_libraries() -> dict[str, bool]:
    """Which of cuBLAS, cuBLASLt and cuDNN the built remote library forwards (read from the coverage list)."""
    try:
        functions = json.loads((ROOT / "interpose" / "build" / "gen" / "coverage.json").read_text())["functions"]
    except (OSError, ValueError, KeyError):
        return {name: False for name in FORWARDED_LIBRARIES}
    return {name: bool(functions.get(probe, {}).get("transparent")) for name, (probe, _) in FORWARDED_LIBRARIES.items()}


def copy_native(build_lib: Path, info: Optional[dict[str, Any]]) -> None:
    """Copy the built parts into ``build_lib/jitckpt/native/_build/<part>/`` (symlinks as files), with the
    build-info record beside them (``info`` None: built without them, and the record says so)."""
    target_root = build_lib / "jitckpt" / "native" / "_build"
    target_root.mkdir(parents=True, exist_ok=True)
    if info is None:
        info = {"native": False, "reason": f"built with {ENV_BUILD_NATIVE}=0 (a pure-Python jitckpt)"}
    else:
        for part, names in SHIPPED.items():
            source = ROOT / part / "build"
            absent = [name for name in names if not (source / name).exists()]
            if absent:
                raise NativeBuildError(f"jitckpt: make -C {part} succeeded but did not produce {', '.join(absent)}")
            for name in (*names, *(n for n in SHIPPED_IF_BUILT.get(part, ()) if (source / n).exists())):
                (target_root / part / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source / name, target_root / part / name)  # follows symlinks
                shutil.copymode(source / name, target_root / part / name)
    (target_root / BUILD_INFO).write_text(json.dumps(info, indent=1) + "\n")
