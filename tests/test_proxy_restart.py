"""Transparent mode, milestone 2b: device pointers and handles survive a restart of the device proxy.

A proxy places every device allocation in a reserved address range (``proxy_server/src/devmem.c``,
the emulator's ``jitckpt_simdev_reserve``/``jitckpt_simdev_malloc_at``); the worker's remote library
keeps the live allocations, registrations, streams, events and one-rank communicators
(``interpose/remote/restart.c``).  A restart -- the "suspected driver corruption" case of the paper's
section 4.2, asked for with ``jitckpt_remote_restart_proxy()`` or ``JITCKPT_REMOTE_RESTART_AT=N`` --
copies device memory out, SIGKILLs the proxy, starts a new one, re-creates everything at the same
addresses and behind the same virtual ids, and copies the bytes back.  A proxy that dies under the
program is restarted too, but its device memory is lost: the worker stops with a message and exit
status 75 rather than go on with wrong data.  All on the CPU emulator; nothing here runs on a GPU.

The proxy runs *beside* the worker (``--worker-pid``), as jit-run will start it, or in spawn mode, where the
serving proxy is a child of the supervising ``jitckpt-proxy`` process (a restart replaces the former only).
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import with_build_lock
from native_toolchain import REQUIRES_CUDA_TOOLCHAIN, ROOT
from test_emulator import emulator, programs  # noqa: F401  (fixtures)
from test_proxy import EMULATOR_BUILD, PROXY, REMOTE_LIB, env, proxy, show  # noqa: F401

pytestmark = REQUIRES_CUDA_TOOLCHAIN

SOURCE = Path(__file__).resolve().parent / "proxy_programs" / "restart.cu"
MLP_DIR = ROOT / "examples" / "cuda_mlp"
EXIT_MEMORY_LOST = 75          # JITCKPT_REMOTE_EXIT_MEMORY_LOST in interpose/remote/restart.c
VA_BASE = 16 << 40             # JITCKPT_PROXY_VA_DEFAULT_BASE (LOCAL_RANK 0)


@pytest.fixture(scope="session")
@with_build_lock  # one worker compiles, the others reuse (tests/conftest.py)
def restart_program(proxy) -> tuple[Path, Path]:  # noqa: F811
    """tests/proxy_programs/restart.cu, and the same source as a library of host twins for the proxy."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    out = ROOT / "proxy_server" / "build" / "test-restart" / digest
    binary, twins = out / "restart", out / "restart_twins.so"
    if not twins.exists():
        out.mkdir(parents=True, exist_ok=True)
        for target, flags in ((binary, []), (twins, ["-shared", "-Xcompiler", "-fPIC"])):
            tmp = target.with_name(f"{target.name}.tmp-{os.getpid()}")
            proc = subprocess.run(["nvcc", *flags, "-cudart", "shared", "-std=c++17", "-o", str(tmp), str(SOURCE),
                                   "-ldl"], capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr
            tmp.rename(target)
    return binary, twins


def proxies_serving(pid: int) -> list[int]:
    """Live jitckpt-proxy processes started to serve worker `pid`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            state = next(line for line in (entry / "status").read_text().splitlines() if line.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if "zombie" in state or not args or not args[0].endswith(b"jitckpt-proxy"):
            continue
        if b"--worker-pid" in args and args[args.index(b"--worker-pid") + 1] == str(pid).encode():
            found.append(int(entry.name))
    return found


class Beside:
    """A worker with the remote library preloaded and its proxy beside it (--worker-pid)."""

    def __init__(self, cmd: list[str], tmp_path: Path, kernels: Path, extra: dict[str, str] | None = None,
                 stdin=None):
        sock = tmp_path / f"p-{time.monotonic_ns()}.sock"
        quoted = " ".join(f"'{c}'" for c in cmd)
        self.worker = subprocess.Popen(
            ["sh", "-c", f"while [ ! -S {sock} ]; do sleep 0.02; done; exec {quoted}"],
            env=env({"LD_PRELOAD": str(REMOTE_LIB), "JITCKPT_PROXY_SOCKET": str(sock), **(extra or {})}),
            stdin=stdin, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.proxy = subprocess.Popen([str(PROXY), "--socket", str(sock), "--worker-pid", str(self.worker.pid)],
                                      env=env({"JITCKPT_SIMDEV_KERNELS": str(kernels), **(extra or {})}),
                                      stderr=subprocess.PIPE, text=True)

    def finish(self, timeout: float = 120) -> subprocess.CompletedProcess:
        try:
            out, err = self.worker.communicate(timeout=timeout)
        finally:
            for p in (self.worker, self.proxy):
                if p.poll() is None:
                    p.kill()
            self.proxy.wait(timeout=10)
        deadline = time.monotonic() + 10        # the restarted proxy goes with its worker
        while proxies_serving(self.worker.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not proxies_serving(self.worker.pid), "a restarted proxy outlived its worker"
        return subprocess.CompletedProcess(self.worker.args, self.worker.returncode, out, err)


def direct(binary: Path, *args: str, kernels: Path, extra: dict[str, str] | None = None):
    return subprocess.run([str(binary), *args], env=env({"JITCKPT_SIMDEV_KERNELS": str(kernels), **(extra or {})}),
                          capture_output=True, text=True, timeout=120)


# ---- the emulator's allocation-at-address extension --------------------------------------

def test_emulator_allocates_at_an_address_inside_its_reserved_range(emulator):  # noqa: F811
    """jitckpt_simdev_reserve + jitckpt_simdev_malloc_at: exact addresses, no overlap, cudaFree gives the
    pages back and keeps the range reserved, and an occupied address outside the range is refused
    (MAP_FIXED_NOREPLACE)."""
    script = f"""
import ctypes, mmap
rt = ctypes.CDLL({str(EMULATOR_BUILD / 'libcudart.so.13')!r})
V = ctypes.c_void_p
for f in (rt.jitckpt_simdev_reserve, rt.jitckpt_simdev_malloc_at):
    f.argtypes = (V, ctypes.c_size_t)
rt.cudaFree.argtypes = (V,)
base = {VA_BASE + (5 << 40)}
assert rt.jitckpt_simdev_reserve(base, 1 << 30) == 0
assert rt.jitckpt_simdev_reserve(base + (2 << 30), 1 << 30) != 0          # one range per process
assert rt.jitckpt_simdev_malloc_at(base + 8192, 10000) == 0
ctypes.memset(base + 8192, 7, 10000)
assert rt.jitckpt_simdev_malloc_at(base + 12288, 100) == 1                 # overlaps: cudaErrorInvalidValue
assert rt.jitckpt_simdev_malloc_at(base + 8193, 100) == 1                  # not page-aligned
assert rt.cudaFree(base + 8192) == 0
assert rt.jitckpt_simdev_malloc_at(base + 8192, 4096) == 0                 # the range is still ours
assert ctypes.string_at(base + 8192, 4) == bytes(4)                        # fresh pages
m = mmap.mmap(-1, 4096)
taken = ctypes.addressof(ctypes.c_char.from_buffer(m))
assert rt.jitckpt_simdev_malloc_at(taken, 4096) != 0                       # occupied, outside the range
print("OK")
"""
    proc = subprocess.run([sys.executable, "-c", script], env=env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "OK" in proc.stdout, show(proc)


# ---- a driver-suspect restart -----------------------------------------------------------

def test_allocations_and_handles_are_the_same_after_a_restart(restart_program, tmp_path):
    binary, twins = restart_program
    run = Beside([str(binary), "addresses"], tmp_path, twins)
    proc = run.finish()
    assert proc.returncode == 0 and "OK addresses" in proc.stdout, show(proc)
    before = re.search(r"^before (.*)$", proc.stdout, re.M).group(1)
    after = re.search(r"^after (.*)$", proc.stdout, re.M).group(1)
    assert before == after, proc.stdout
    a = int(re.search(r"a (0x[0-9a-f]+)", before).group(1), 16)
    assert VA_BASE <= a < VA_BASE + (1 << 40), "allocations are in the proxy's reserved range"
    for line in ("restart: 0", "bytes same", "stream flags 1 priority kept", "device variable 42.5",
                 "new allocation apart"):
        assert line in proc.stdout, proc.stdout
    assert re.search(r"device proxy restarted \(driver suspect\): pid (\d+) replaced by pid (\d+); "
                     r"3 allocations \(3151728 bytes\), 1 streams, 1 events", proc.stderr), proc.stderr
    assert run.proxy.returncode == -signal.SIGKILL          # the old proxy was killed, not the program


def test_pointer_table_in_device_memory_still_works_after_a_restart(restart_program, tmp_path):
    """Pointers stored in device memory, where no handle table reaches, are still valid: a kernel
    follows them after the restart and computes what it computed before, and what a direct run does."""
    binary, twins = restart_program
    want = direct(binary, "pointer_table", kernels=twins)
    assert want.returncode == 0, show(want)
    proc = Beside([str(binary), "pointer_table"], tmp_path, twins).finish()
    assert proc.returncode == 0 and "OK pointer_table" in proc.stdout, show(proc)
    got = re.search(r"gather before (\w+) after (\w+)", proc.stdout)
    assert got.group(1) == got.group(2), proc.stdout
    assert got.group(0) == re.search(r"gather before \w+ after \w+", want.stdout).group(0)
    assert "device proxy restarted (driver suspect)" in proc.stderr


def test_restart_mid_run_of_an_emulator_program_is_bit_identical_and_keeps_the_pid(restart_program, tmp_path):
    binary, twins = restart_program
    want = direct(binary, "train", "40", kernels=twins)
    assert want.returncode == 0, show(want)
    run = Beside([str(binary), "train", "40", "17"], tmp_path, twins)
    proc = run.finish()
    assert proc.returncode == 0 and "restart: 0" in proc.stdout, show(proc)
    checksum = re.compile(r"train checksum (\w+)")
    assert checksum.search(proc.stdout).group(1) == checksum.search(want.stdout).group(1)
    assert f"pid {run.worker.pid} " in proc.stdout, "the program is the same process throughout"


@pytest.fixture(scope="session")
def mlp(proxy) -> Path:  # noqa: F811
    proc = subprocess.run(["make", "-C", str(MLP_DIR), "-j2"], capture_output=True, text=True)
    assert proc.returncode == 0, f"make -C examples/cuda_mlp failed:\n{proc.stdout}\n{proc.stderr}"
    return MLP_DIR / "build" / "mlp"


def test_cuda_mlp_restart_mid_run_ends_with_the_same_checksum(mlp, tmp_path):
    """examples/cuda_mlp, 1 rank (its communicator is re-created too), with a driver-suspect restart
    injected before its 450th CUDA call (of about 900: mid-run), ends bit-identical to a direct run."""
    ranks = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}
    twins = MLP_DIR / "build" / "libmlp_twins.so"
    (tmp_path / "rv-direct").mkdir()
    (tmp_path / "rv-proxy").mkdir()
    want = direct(mlp, "--steps", "30", "--rendezvous-dir", str(tmp_path / "rv-direct"), kernels=twins, extra=ranks)
    assert want.returncode == 0, show(want)
    run = Beside([str(mlp), "--steps", "30", "--rendezvous-dir", str(tmp_path / "rv-proxy")], tmp_path, twins,
                 extra={**ranks, "JITCKPT_REMOTE_RESTART_AT": "450"})
    proc = run.finish()
    assert proc.returncode == 0, show(proc)
    assert re.search(r"device proxy restarted \(driver suspect\).*1 communicators re-created", proc.stderr), \
        proc.stderr
    checksum = re.compile(r"final parameters checksum ([0-9a-f]+)")
    assert checksum.search(proc.stdout).group(1) == checksum.search(want.stdout).group(1)


def test_restart_with_a_communicator_of_two_ranks_is_refused_and_the_run_goes_on(mlp, tmp_path):
    """Re-creating a communicator of more than one rank needs the re-rendezvous of the recovery
    milestone: the injected restart is refused with the reason, before anything is touched, and both
    ranks end with the checksum of a run without it."""
    twins = MLP_DIR / "build" / "libmlp_twins.so"
    (tmp_path / "rv").mkdir()
    procs = []
    for rank in range(2):
        extra = {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "JITCKPT_SIMDEV_KERNELS": str(twins),
                 "JITCKPT_REMOTE_RESTART_AT": "450"}
        procs.append(subprocess.Popen([str(PROXY), "--socket", str(tmp_path / f"r{rank}.sock"), "--", str(mlp),
                                       "--steps", "30", "--rendezvous-dir", str(tmp_path / "rv")],
                                      env=env(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, f"exit {p.returncode}\n{out}\n{err}"
            assert "proxy restart refused: a communicator of 2 ranks" in err, err
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    got = re.findall(r"final parameters checksum ([0-9a-f]+)", "".join(outs))
    assert len(got) == 2 and got[0] == got[1]
    from test_proxy import final_checksums, run_mlp_ranks
    want = final_checksums(run_mlp_ranks(mlp, 2, tmp_path, through_proxy=False))
    assert got[0] == want[0]


# ---- a proxy killed under the program ------------------------------------------------------

def test_a_sigkilled_proxy_stops_the_program_with_a_clear_message(restart_program, tmp_path):
    """The worker notices the dead proxy at its next call, restarts it and re-creates its allocations,
    but their contents died with the proxy: it stops (exit status 75) and says so; it never prints a
    result computed from lost memory."""
    binary, twins = restart_program
    run = Beside([str(binary), "killed"], tmp_path, twins, stdin=subprocess.PIPE)
    line = run.worker.stdout.readline()
    assert line.strip() == "READY", line
    run.proxy.kill()
    run.proxy.wait(timeout=10)
    run.worker.stdin.write("go\n")
    run.worker.stdin.flush()
    proc = run.finish()
    assert proc.returncode == EXIT_MEMORY_LOST, show(proc)
    assert "RESULT" not in proc.stdout
    assert re.search(r"the device proxy \(pid \d+\) is gone; restarting it", proc.stderr), proc.stderr
    assert re.search(r"7 allocations re-created at the same addresses.*contents of device memory \(65000 bytes\) "
                     r"were lost.*stopping rather than continue with wrong data \(exit status 75\)", proc.stderr), \
        proc.stderr


def test_restart_in_spawn_mode_keeps_the_launchers_view(restart_program, tmp_path):
    """Spawn mode (jitckpt-proxy -- PROGRAM): the serving proxy is a child of the supervising
    jitckpt-proxy process, so the worker can restart it while whoever started jitckpt-proxy keeps
    waiting on the same process and gets the program's own exit status."""
    binary, twins = restart_program
    want = direct(binary, "train", "40", kernels=twins)
    proc = subprocess.run([str(PROXY), "--socket", str(tmp_path / "s.sock"), "--", str(binary), "train", "40", "17"],
                          env=env({"JITCKPT_SIMDEV_KERNELS": str(twins)}), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and "restart: 0" in proc.stdout, show(proc)
    checksum = re.compile(r"train checksum (\w+)")
    assert checksum.search(proc.stdout).group(1) == checksum.search(want.stdout).group(1)
    assert not list(tmp_path.glob("*.sock"))


def test_restart_is_refused_when_the_proxy_is_the_programs_parent(restart_program, tmp_path):
    """Without the supervisor (JITCKPT_PROXY_NO_SUPERVISOR=1) the serving proxy is the program's parent:
    killing it would end the launcher's child, so the restart is refused with the reason, and the
    program goes on with its proxy."""
    binary, twins = restart_program
    proc = subprocess.run([str(PROXY), "--socket", str(tmp_path / "s.sock"), "--", str(binary), "addresses"],
                          env=env({"JITCKPT_SIMDEV_KERNELS": str(twins), "JITCKPT_PROXY_NO_SUPERVISOR": "1"}),
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, show(proc)
    assert re.search(r"restart: [1-9]", proc.stdout), proc.stdout
    assert "proxy restart refused: the proxy is this program's parent" in proc.stderr
