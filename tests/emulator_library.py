"""Shared by the conformance tests of the emulator's NVIDIA libraries (tests/test_emulator_cublas.py,
tests/test_emulator_cublaslt.py, tests/test_emulator_cudnn.py): where emulator/Makefile finds a library's
headers, running a test program on the emulator, reading the lines it prints, and the checks of a built
library's ELF interface (soname, version node, exports, imports) that each of them makes."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from native_toolchain import CUDA_HOME, EMULATOR, EMULATOR_BUILD, EMULATOR_ENV, NCCL_WHEEL, build_emulator

# What building the emulator and a test program needs besides the library's own headers.
REQUIRES_GCC_CUDA_HEADERS_NCCL = [
    pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is not installed"),
    pytest.mark.skipif(not (CUDA_HOME / "include" / "cuda_runtime_api.h").exists(),
                       reason="the CUDA 13 headers are not installed"),
    pytest.mark.skipif(NCCL_WHEEL is None, reason="make -C emulator needs nccl.h: pip install nvidia-nccl-cu13"),
]

# ---- headers, found as emulator/Makefile finds them --------------------------------------------------------


def package_dir(package: str) -> Path | None:
    """An installed Python package's directory (e.g. nvidia.cudnn, the nvidia-cudnn-cu13 of a CUDA PyTorch), if any.
    The first of its search locations, as emulator/Makefile's probe (``list(m.__path__)[0]``) takes it."""
    try:
        spec = importlib.util.find_spec(package)
    except ModuleNotFoundError:  # the parent package (nvidia) is not installed either
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def makefile_include(variable: str, cache_dir: str, probe: tuple[str, ...], package: str | None = None,
                     needs: tuple[str, ...] = ()) -> Path | None:
    """The include directory emulator/Makefile builds a library against, or None where it skips the library.

    The Makefile takes ``$<variable>`` when it is set (an environment variable is a make variable); else the
    first of <package>'s include directory (where a package is named), ``$XDG_CACHE_HOME/jitckpt/<cache_dir>/include``
    (where XDG_CACHE_HOME is set) and ``~/.cache/jitckpt/<cache_dir>/include`` that holds every header of
    ``probe``; it builds the library only if that directory holds them.  ``needs``: headers a test program also
    includes, which must be in that same directory.

    (Not native_toolchain.header_include: that one also looks in other places and falls through past a set
    variable, where the Makefile would not find the headers and would skip the library.)"""
    if variable in os.environ:
        candidates = [Path(os.environ[variable])]
    else:
        candidates = []
        base = package_dir(package) if package is not None else None
        if base is not None:
            candidates.append(base / "include")
        if os.environ.get("XDG_CACHE_HOME"):
            candidates.append(Path(os.environ["XDG_CACHE_HOME"]) / "jitckpt" / cache_dir / "include")
        candidates.append(Path.home() / ".cache" / "jitckpt" / cache_dir / "include")
    found = next((c for c in candidates if all((c / h).exists() for h in probe)), None)
    if found is None or not all((found / h).exists() for h in needs):
        return None
    return found


# ---- building the library and a test program -------------------------------------------------------------


def build_library(soname: str) -> Path:
    """Run ``make -C emulator`` and return its build directory, asserting that it built ``soname`` (which it
    skips without the library's headers)."""
    build_emulator()
    assert (EMULATOR_BUILD / soname).exists(), f"make -C emulator did not build {soname}"
    return EMULATOR_BUILD


def make_with(variable: str, value: Path | str) -> str:
    """Run ``make -C emulator <variable>=<value>`` (e.g. an include directory without the headers), assert that
    it succeeded, and return what it printed on stdout (its notes of the libraries it skips among it)."""
    proc = subprocess.run(["make", "-C", str(EMULATOR), f"{variable}={value}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def gcc_program(source: Path, out: Path, include: Path, libs: list[str], werror: bool = True) -> Path:
    """Build a plain C test program with gcc against the real headers (CUDA's and ``include``), linked with the
    emulator's libraries ``libs`` (``-l...`` arguments) and libm; -ffp-contract=off, so that the program's
    fixed-order host references round like the emulator.  Returns out."""
    cmd = ["gcc", "-std=gnu11", "-O2", "-Wall", "-Wextra", *(["-Werror"] if werror else []), "-ffp-contract=off",
           "-I", str(CUDA_HOME / "include"), "-I", str(include), "-o", str(out), str(source),
           "-L", str(EMULATOR_BUILD), *libs, "-lm"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}"
    return out


# ---- running a test program and reading what it prints -----------------------------------------------------


def run(binary: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a test program on the emulator's libraries (LD_LIBRARY_PATH=emulator/build, none of the emulator's
    environment variables) and assert that it exited 0 with DONE as the last thing it printed."""
    env = {k: v for k, v in os.environ.items() if k not in EMULATOR_ENV and k != "LD_LIBRARY_PATH"}
    env["LD_LIBRARY_PATH"] = str(EMULATOR_BUILD)
    proc = subprocess.run([str(binary), *args], env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith("DONE"), (
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    return proc


def results(tag: str, stdout: str) -> dict[str, dict]:
    """The result lines ``<tag> <name> hash=<16 hex digits> maxdiff=<float> exact=<int> pad=<int>``, by name:
    {"hash": str, "maxdiff": float, "exact": int, "pad": int}."""
    line_re = re.compile(rf"^{re.escape(tag)} (\S+) hash=([0-9a-f]{{16}}) maxdiff=(\S+) exact=(\d+) pad=(\d+)$")
    result = {}
    for line in stdout.splitlines():
        m = line_re.match(line)
        if m:
            name, digest, maxdiff, exact, pad = m.groups()
            result[name] = {"hash": digest, "maxdiff": float(maxdiff), "exact": int(exact), "pad": int(pad)}
    return result


def statuses(stdout: str) -> dict[str, int]:
    """The lines ``STATUS <name> <status returned>``, by name."""
    return {f[1]: int(f[2]) for f in (line.split() for line in stdout.splitlines()) if f and f[0] == "STATUS"}


def infos(stdout: str) -> dict[str, str]:
    """The lines ``INFO <name> <value>`` (the value: the rest of the line), by name."""
    return {f[1]: f[2] for f in (line.split(maxsplit=2) for line in stdout.splitlines()) if f and f[0] == "INFO"}


# ---- a built library's ELF interface ----------------------------------------------------------------------


def dyn_symbols(path: Path) -> list[tuple[str, str | None, bool]]:
    """(name, version or None, defined) for every dynamic symbol, from readelf."""
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(path)], capture_output=True, text=True, check=True).stdout
    result = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 8 or not fields[0].rstrip(":").isdigit() or fields[6] == "ABS":
            continue
        base, _, version = fields[7].partition("@")
        result.append((base, version.lstrip("@") or None, fields[6] != "UND"))
    return result


def assert_soname_and_symlink(lib: Path) -> None:
    """lib (e.g. build/libcublas.so.13) has its file name as its soname, and lib's name up to ``.so`` (the
    link-time name, build/libcublas.so) is a symlink to it."""
    out = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=True).stdout
    assert f"Library soname: [{lib.name}]" in out
    link = lib.with_name(lib.name[:lib.name.index(".so") + len(".so")])
    assert os.readlink(link) == lib.name


def assert_exports_exactly(lib: Path, exported: set[str]) -> None:
    """lib defines exactly the functions of ``exported``, every one in a single version node named like its
    soname (its file name), and no other node."""
    exports = {name: version for name, version, defined in dyn_symbols(lib) if defined}
    assert set(exports) == exported
    assert all(v == lib.name for v in exports.values()), exports
    out = subprocess.run(["readelf", "-V", "-W", str(lib)], capture_output=True, text=True, check=True).stdout
    definitions = out.split("Version definition section", 1)[1].split("Version needs section", 1)[0]
    assert re.findall(r"Name: (\S+)", definitions) == [lib.name, lib.name]


def assert_device_only_through_the_private_interface(lib: Path, forbidden: tuple[str, ...]) -> None:
    """lib imports no symbol that starts with one of ``forbidden`` (the runtime's cuda* and __cuda*, and any
    library it must not depend on), and reaches the emulated device through the runtime's private interface
    (jitckpt_simdev_enqueue, jitckpt_simdev_check_range, ..., all of node JITCKPT_SIMDEV_1)."""
    imports = {name: version for name, version, defined in dyn_symbols(lib) if not defined}
    assert not [n for n in imports if n.startswith(forbidden)], imports
    private = {n: v for n, v in imports.items() if n.startswith("jitckpt_simdev_")}
    assert "jitckpt_simdev_enqueue" in private and "jitckpt_simdev_check_range" in private
    assert set(private.values()) == {"JITCKPT_SIMDEV_1"}
