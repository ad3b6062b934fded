"""The native parts build against every NCCL header from 2.27 on, and what one NCCL lacks fails by name.

A CUDA 13 PyTorch brings NCCL 2.27; ``pip install nvidia-nccl-cu13`` brings
the newest.  Each native part (the CPU device emulator, the passthrough
interposer, the remote library, the device proxy) is built here, once per
header, from a copy of its sources in a temporary directory (the tree's own
``build/`` directories, which other tests use, are left alone), against the
oldest header (2.27.7, cached by ``scripts/setup.sh``: no download here) and
the newest (the installed wheel's).  The interposer and the proxy are built
in a copy that has no ``emulator/`` at all.  Then, as a program meets it:

* built against 2.27, what later NCCLs added (``ncclAlltoAll``, 2.28) is left
  out: the emulated NCCL lacks it, passthrough mode does not wrap it, and
  transparent mode refuses a call of it by name, saying which NCCL added it;
* built against the newest header and run with an NCCL that lacks
  ``ncclAlltoAll`` (the emulator built against 2.27), nothing fails at load:
  the program's call of it fails with ``ncclSystemError`` and a message naming
  it and the loaded NCCL, in passthrough mode and through the device proxy.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from native_toolchain import CUDA_HOME, EMULATOR_ENV, NCCL_WHEEL, REQUIRES_CUDA_TOOLCHAIN, ROOT

pytestmark = REQUIRES_CUDA_TOOLCHAIN

OLDEST = "2.27.7"
# Where scripts/setup.sh caches the oldest header (only nccl.h of the nvidia-nccl-cu13 2.27.7 wheel).
OLDEST_INCLUDE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "jitckpt" / f"nccl-{OLDEST}" / "include"
NATIVE = ("emulator", "interpose", "proxy_server")

# Calls an NCCL function every version has, then ncclAlltoAll, which NCCL 2.28 added.
PROGRAM = r"""
/* nccl_version_gap.c -- an NCCL program built against a newer nccl.h than the NCCL it may meet. */
#include <stdio.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

int main(void)
{
    int version = 0;
    ncclComm_t comm;
    ncclUniqueId id;
    float *buf = NULL;
    if (ncclGetVersion(&version) != ncclSuccess || ncclGetUniqueId(&id) != ncclSuccess ||
        ncclCommInitRank(&comm, 1, id, 0) != ncclSuccess || cudaMalloc((void **)&buf, 2 * sizeof *buf) != 0) {
        printf("setup failed\n");
        return 1;
    }
    printf("NCCL %d\n", version);
    ncclResult_t r = ncclAllReduce(buf, buf, 2, ncclFloat, ncclSum, comm, 0);
    printf("ncclAllReduce: %d\n", (int)r);
    r = ncclAlltoAll(buf, buf + 1, 1, ncclFloat, comm, 0);
    printf("ncclAlltoAll: %d (%s)\n", (int)r, ncclGetErrorString(r));
    printf("sync: %d\n", (int)cudaStreamSynchronize(0));
    ncclCommDestroy(comm);
    printf("DONE\n");
    return 0;
}
"""


def nccl_version(include: Path) -> str:
    """ "major.minor.patch" of include/nccl.h."""
    text = (include / "nccl.h").read_text()
    return ".".join(re.search(rf"#define NCCL_{k}\s+(\d+)", text).group(1) for k in ("MAJOR", "MINOR", "PATCH"))


def newest_include() -> Path:
    """The installed nvidia-nccl-cu13 wheel's include directory (setup.sh installs the newest)."""
    assert NCCL_WHEEL is not None
    return NCCL_WHEEL / "include"


def copy_sources(dest: Path, parts: tuple[str, ...]) -> None:
    """The parts' sources (not their build/ directories) under dest, as in the tree."""
    for part in parts:
        shutil.copytree(ROOT / part, dest / part, ignore=shutil.ignore_patterns("build", "__pycache__"))


def make(directory: Path, include: Path) -> subprocess.CompletedProcess:
    """`make -C directory -j2` against the nccl.h in include (2 cores in CI: each part once per header)."""
    cmd = ["make", "-C", str(directory), "-j2", f"NCCL_INCLUDE={include}", f"CUDA_HOME={CUDA_HOME}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def builds(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """build(which) -> the source copy, with every native part built against the "oldest" or "newest" header."""
    done: dict[str, Path] = {}

    def build(which: str) -> Path:
        if which in done:
            return done[which]
        include = OLDEST_INCLUDE if which == "oldest" else newest_include()
        assert (include / "nccl.h").is_file(), (
            f"{include / 'nccl.h'} is missing: run scripts/setup.sh, which caches nccl.h of NCCL {OLDEST}")
        tree = tmp_path_factory.mktemp(f"native-{which}")
        # The interposer and the proxy first, in a tree without emulator/: nothing of it is needed.
        copy_sources(tree, ("interpose", "proxy_server"))
        proc = make(tree / "proxy_server", include)
        assert proc.returncode == 0, f"make -C proxy_server against {include}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert "warning:" not in proc.stderr, proc.stderr
        copy_sources(tree, ("emulator",))
        proc = make(tree / "emulator", include)
        assert proc.returncode == 0, f"make -C emulator against {include}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        assert "warning:" not in proc.stderr, proc.stderr
        done[which] = tree
        return tree

    return build


def symbols(lib: Path) -> set[str]:
    """The names a shared library defines in its dynamic symbol table."""
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return {line.split()[2].split("@")[0] for line in out.splitlines() if len(line.split()) == 3}


@pytest.fixture(scope="module")
def program(builds: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """PROGRAM, compiled against the newest nccl.h and linked against the emulator built from it."""
    newest = builds("newest") / "emulator" / "build"
    src = tmp_path_factory.mktemp("nccl-gap") / "nccl_version_gap.c"
    src.write_text(PROGRAM)
    out = src.with_suffix("")
    proc = subprocess.run(["gcc", "-O1", "-I", str(CUDA_HOME / "include"), "-I", str(newest_include()), "-o", str(out),
                           str(src), "-L", str(newest), "-l:libcudart.so.13", "-l:libnccl.so.2"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def run_env(nccl_dir: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment without settings that could change a test's meaning, loading libraries from nccl_dir."""
    cleared = (*EMULATOR_ENV, "LD_PRELOAD", "LD_LIBRARY_PATH", "RANK", "WORLD_SIZE", "JITCKPT_PROXY_SOCKET",
               "JITCKPT_PROXY_CUDART", "JITCKPT_PROXY_NCCL", "JITCKPT_PROXY_PRELOAD", "JITCKPT_REMOTE_SYNC")
    env = {k: v for k, v in os.environ.items() if k not in cleared}
    env["LD_LIBRARY_PATH"] = str(nccl_dir)
    env.update(extra or {})
    return env


def show(proc: subprocess.CompletedProcess) -> str:
    """A finished process's exit status and output, for an assertion message."""
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


@pytest.mark.parametrize("which", ["oldest", "newest"])
def test_every_native_part_builds_against_the_header(builds: Callable[[str], Path], which: str) -> None:
    """(The fixture builds the interposer and the proxy in a copy without emulator/, warning-free.)"""
    assert nccl_version(OLDEST_INCLUDE) == OLDEST
    assert tuple(map(int, nccl_version(newest_include()).split("."))) > (2, 27, 7), "the installed wheel is not newer"
    tree = builds(which)
    for path in ("emulator/build/libcudart.so.13", "emulator/build/libnccl.so.2",
                 "interpose/build/libjitckpt_interpose.so", "interpose/build/libjitckpt_remote.so",
                 "interpose/build/gen/coverage.json", "proxy_server/build/jitckpt-proxy"):
        assert (tree / path).is_file(), path


def test_built_against_the_oldest_header_what_later_nccl_added_is_left_out(builds: Callable[[str], Path], program: Path,
                                                                           tmp_path: Path) -> None:
    old, new = builds("oldest"), builds("newest")
    # The emulated NCCL implements what its header declares; the interposer wraps only that.
    assert "ncclAlltoAll" in symbols(new / "emulator/build/libnccl.so.2")
    assert "ncclAlltoAll" not in symbols(old / "emulator/build/libnccl.so.2")
    assert {"ncclAllReduce", "ncclAlltoAll"} <= symbols(new / "interpose/build/libjitckpt_interpose.so")
    passthrough = symbols(old / "interpose/build/libjitckpt_interpose.so")
    assert "ncclAllReduce" in passthrough and "ncclAlltoAll" not in passthrough
    # Transparent mode still exports it, as a refusal that says why (and doctor's list says so too).
    assert {"ncclAlltoAll", "pncclAlltoAll", "ncclAllReduceConfig"} <= symbols(old / "interpose/build/libjitckpt_remote.so")
    coverage = json.loads((old / "interpose/build/gen/coverage.json").read_text())
    assert coverage["functions"]["ncclAlltoAll"] == {"library": "nccl", "version": None, "passthrough": "forwarded",
                                                     "transparent": False}
    assert "NCCL 2.28 added it" in coverage["refused"]["ncclAlltoAll"]
    assert f"NCCL {OLDEST}" in coverage["refused"]["ncclAlltoAll"]
    assert coverage["functions"]["ncclAllReduce"]["transparent"]

    # A program built against a newer NCCL, through the proxy built against 2.27: refused by name
    # in the worker, so the virtual communicator never reaches a real NCCL.
    sock = tmp_path / "proxy.sock"
    emulator = new / "emulator/build"
    proc = subprocess.run([str(old / "proxy_server/build/jitckpt-proxy"), "--socket", str(sock),
                           "--cudart", str(emulator / "libcudart.so.13"), "--nccl", str(emulator / "libnccl.so.2"),
                           "--preload", str(old / "interpose/build/libjitckpt_remote.so"), "--", str(program)], env=run_env(emulator), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "DONE" in proc.stdout, show(proc)
    assert "ncclAllReduce: 0" in proc.stdout, show(proc)
    assert "ncclAlltoAll: 5 (invalid usage)" in proc.stdout, show(proc)
    assert re.search(r"ncclAlltoAll is not supported in transparent mode \(NCCL 2\.28 added it, and jitckpt was built "
                     r"against the nccl\.h of NCCL 2\.27\.7: rebuild", proc.stderr), show(proc)


def test_a_function_the_loaded_nccl_lacks_fails_by_name_when_called_in_passthrough_mode(builds: Callable[[str], Path],
                                                                                        program: Path) -> None:
    new, old_nccl = builds("newest"), builds("oldest") / "emulator/build"
    env = run_env(old_nccl, {"LD_PRELOAD": str(new / "interpose/build/libjitckpt_interpose.so")})
    proc = subprocess.run([str(program)], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "DONE" in proc.stdout, show(proc)
    assert "NCCL 22707" in proc.stdout and "ncclAllReduce: 0" in proc.stdout, show(proc)
    assert "ncclAlltoAll: 2 (unhandled system error)" in proc.stdout, show(proc)
    said = [line for line in proc.stderr.splitlines() if "ncclAlltoAll" in line]
    assert len(said) == 1, proc.stderr
    assert (f"cannot forward ncclAlltoAll: the loaded NCCL library ({old_nccl}/libnccl.so.2, NCCL {OLDEST}) "
            "does not have it; the call fails with ncclSystemError") in said[0], proc.stderr


def test_a_function_the_loaded_nccl_lacks_fails_by_name_when_called_through_the_proxy(builds: Callable[[str], Path],
                                                                                      program: Path, tmp_path: Path) -> None:
    """Built against the newest nccl.h, the proxy starts with NCCL 2.27 (before: 'the CUDA runtime lacks
    ncclAlltoAll', and no program ran); the program's call of ncclAlltoAll fails, named."""
    new, old_nccl = builds("newest"), builds("oldest") / "emulator/build"
    cudart = new / "emulator/build/libcudart.so.13"
    proc = subprocess.run([str(new / "proxy_server/build/jitckpt-proxy"), "--socket", str(tmp_path / "proxy.sock"),
                           "--cudart", str(cudart), "--nccl", str(old_nccl / "libnccl.so.2"),
                           "--preload", str(new / "interpose/build/libjitckpt_remote.so"), "--", str(program)],
                          env=run_env(old_nccl, {"JITCKPT_REMOTE_SYNC": "1"}), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "DONE" in proc.stdout, show(proc)
    assert "NCCL 22707" in proc.stdout and "ncclAllReduce: 0" in proc.stdout, show(proc)
    assert "ncclAlltoAll: 2 (unhandled system error)" in proc.stdout, show(proc)
    said = [line for line in proc.stderr.splitlines() if "ncclAlltoAll" in line]
    assert len(said) == 1, proc.stderr
    assert re.search(rf"jitckpt-proxy\[\d+\]: ncclAlltoAll is not in the loaded NCCL \({re.escape(str(old_nccl))}"
                     rf"/libnccl\.so\.2, NCCL 2\.27\.7\): the program's call of it fails with ncclSystemError",
                     said[0]), proc.stderr
