"""Transparent mode, milestone 1: the device proxy and the remote interposer, on the emulator.

``proxy_server/build/jitckpt-proxy`` runs a program as its one worker with
``interpose/build/libjitckpt_remote.so`` preloaded; every CUDA runtime call
the program makes is marshalled into the shared segment and executed by the
proxy against the CPU device emulator (``proxy_server/README.md``).  These
tests check, *on the emulator*, that programs print the same output directly
and through the proxy, that the handles a program sees are virtual, that an
unsupported function is refused by name, that no other process can attach
to a proxy, and that the proxy exits with its worker.  What only a GPU could
confirm (the real runtime behind the proxy) is not tested here.

On the emulator, kernels run as host twins, which must be in the proxy's
process: the tests build each program's source a second time as a shared
library and name it in ``JITCKPT_SIMDEV_KERNELS`` (the README says why).
"""

from __future__ import annotations

import hashlib
import os
import re
import socket
import struct
import subprocess
import time
from pathlib import Path

import pytest

from conftest import with_build_lock
from native_toolchain import CUDA_HOME, EMULATOR_ENV, NCCL_WHEEL, REQUIRES_CUDA_TOOLCHAIN, ROOT
from test_emulator import emulator, programs  # noqa: F401  (fixtures)

pytestmark = REQUIRES_CUDA_TOOLCHAIN

PROXY_DIR = ROOT / "proxy_server"
PROXY = PROXY_DIR / "build" / "jitckpt-proxy"
REMOTE_LIB = ROOT / "interpose" / "build" / "libjitckpt_remote.so"
EMULATOR_BUILD = ROOT / "emulator" / "build"
PROGRAMS = Path(__file__).resolve().parent / "emulator_programs"
HANDLES_SRC = Path(__file__).resolve().parent / "proxy_programs" / "handles.c"
VIRTUAL_TAG = "0x6a6b"          # JITCKPT_VH_TAG in interpose/include/jitckpt_remote_wire.h
ENV_CLEARED = (*EMULATOR_ENV, "RANK", "WORLD_SIZE", "LD_PRELOAD", "LD_LIBRARY_PATH", "JITCKPT_PROXY_SOCKET",
               "JITCKPT_PROXY_CUDART", "JITCKPT_PROXY_NCCL", "JITCKPT_PROXY_PRELOAD")


@pytest.fixture(scope="session")
def proxy(emulator) -> Path:  # noqa: F811
    """Builds the proxy, and with it the remote interposer and the emulator."""
    proc = subprocess.run(["make", "-C", str(PROXY_DIR), "-j2"], capture_output=True, text=True)
    assert proc.returncode == 0, f"make -C proxy_server failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert PROXY.exists() and REMOTE_LIB.exists()
    return PROXY


@pytest.fixture(scope="session")
@with_build_lock  # one worker compiles, the others reuse (tests/conftest.py)
def twins(proxy) -> dict[str, Path]:
    """Each test program's source built again as a shared library: its host twins, for the proxy."""
    out = {}
    for name in ("cudart_basic", "streams", "graphs"):
        source = PROGRAMS / f"{name}.cu"
        digest = hashlib.sha256(source.read_bytes() + (PROGRAMS / "common.h").read_bytes()).hexdigest()[:12]
        lib = PROXY_DIR / "build" / "test-twins" / f"{name}-{digest}.so"
        if not lib.exists():
            lib.parent.mkdir(parents=True, exist_ok=True)
            tmp = lib.with_suffix(f".tmp-{os.getpid()}")
            proc = subprocess.run(["nvcc", "-shared", "-Xcompiler", "-fPIC", "-cudart", "shared", "-std=c++17",
                                   "-o", str(tmp), str(source)], capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr
            tmp.rename(lib)
        out[name] = lib
    return out


@pytest.fixture(scope="session")
def handles(proxy, tmp_path_factory) -> Path:
    """tests/proxy_programs/handles.c, a plain C program against the runtime API."""
    out = tmp_path_factory.mktemp("proxy-programs") / "handles"
    proc = subprocess.run(["gcc", "-O1", "-I", str(CUDA_HOME / "include"), "-o", str(out), str(HANDLES_SRC),
                           "-L", str(EMULATOR_BUILD), "-l:libcudart.so.13"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


def env(extra: dict[str, str] | None = None) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if k not in ENV_CLEARED}
    e["LD_LIBRARY_PATH"] = str(EMULATOR_BUILD)
    e.update(extra or {})
    return e


def direct(binary: Path, *args: str, extra: dict[str, str] | None = None, timeout: float = 60):
    return subprocess.run([str(binary), *args], env=env(extra), capture_output=True, text=True, timeout=timeout)


def remote(binary: Path, *args: str, tmp_path: Path, extra: dict[str, str] | None = None, timeout: float = 60,
           proxy_args: tuple[str, ...] = ()):
    sock = tmp_path / f"proxy-{time.monotonic_ns()}.sock"
    cmd = [str(PROXY), "--socket", str(sock), *proxy_args, "--", str(binary), *args]
    return subprocess.run(cmd, env=env(extra), capture_output=True, text=True, timeout=timeout)


def show(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"


# ---- the library covers the whole API -------------------------------------------------


def test_remote_library_exports_every_function_the_emulator_implements(proxy):
    """Nothing binds past the remote library to a runtime in the worker: every CUDA runtime and
    NCCL function the emulator defines is exported (as a stub, a refusal or a pure local call)."""

    def defined(lib: Path) -> set[str]:
        out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                             check=True).stdout
        return {line.split()[2].split("@")[0] for line in out.splitlines() if len(line.split()) == 3}

    api = {n for lib in ("libcudart.so.13", "libnccl.so.2") for n in defined(EMULATOR_BUILD / lib)
           if n.startswith(("cuda", "__cuda", "nccl", "pnccl"))}
    missing = api - defined(REMOTE_LIB)
    assert not missing, f"not exported by libjitckpt_remote.so: {sorted(missing)}"
    versions = subprocess.run(["nm", "-D", str(REMOTE_LIB)], capture_output=True, text=True).stdout
    assert "cudaMalloc@@libcudart.so.13" in versions


def test_generator_refuses_to_marshal_a_pointer_the_facts_do_not_classify():
    """A remote="gen" row whose pointer parameter says neither host buffer, output nor device
    pointer stops the generator with the function's and the parameter's names."""
    import dataclasses
    import sys

    sys.path.insert(0, str(ROOT / "interpose" / "tools"))
    sys.dont_write_bytecode = True
    try:
        import api_facts
        import gen_interpose
        import gen_remote
    finally:
        sys.path.pop(0)
    facts = dict(api_facts.FACTS)
    facts["cudaMemcpy"] = dataclasses.replace(facts["cudaMemcpy"], host_in={}, host_out={}, remote_check="")
    functions = gen_interpose.describe(CUDA_HOME / "include" / "cuda_runtime_api.h",
                                       NCCL_WHEEL / "include" / "nccl.h", facts)
    with pytest.raises(gen_remote.RemoteGenError, match=r"cudaMemcpy: .*parameter void \*dst"):
        gen_remote.classify(functions["cudaMemcpy"])


# ---- same output directly and through the proxy ----------------------------------------


@pytest.mark.parametrize("program,cmd,fault", [
    ("cudart_basic", "saxpy", None),
    ("cudart_basic", "reduce", None),
    ("cudart_basic", "validation", None),      # errors: bad pointers, kind, configuration, handles
    ("streams", "fault_sticky", "op=cudaLaunchKernel,call=2,kind=sticky"),
    ("streams", "fault_slow", "op=_Z4spinx,kind=slow,delay_ms=300"),
])
def test_program_prints_the_same_through_the_proxy_on_the_emulator(programs, twins, tmp_path,  # noqa: F811
                                                                   program, cmd, fault):
    extra = {"JITCKPT_SIMDEV_FAULT": fault} if fault else {}
    want = direct(programs[program], cmd, extra=extra)
    assert want.returncode == 0, show(want)
    got = remote(programs[program], cmd, tmp_path=tmp_path,
                 extra={**extra, "JITCKPT_SIMDEV_KERNELS": str(twins[program])})
    assert got.returncode == 0, show(got)

    def timings_out(text: str) -> str:         # fault_slow prints measured milliseconds
        return re.sub(r"\d+\.\d+ ms", "N ms", text)

    assert timings_out(got.stdout) == timings_out(want.stdout)
    assert f"OK {cmd}" in got.stdout
    if cmd == "validation":  # the occupancy queries, marshalled (the emulator's SM: 2048 threads)
        assert "occupancy saxpy 256 threads: 8 blocks" in got.stdout and "1000 threads: 2 blocks" in got.stdout


def test_host_device_copies_round_trip_through_the_arena(handles, tmp_path):
    proc = remote(handles, "roundtrip", tmp_path=tmp_path)
    assert proc.returncode == 0 and "roundtrip equal" in proc.stdout, show(proc)


# ---- virtual handles ----------------------------------------------------------------


def test_program_sees_virtual_stream_and_event_handles(handles, tmp_path):
    plain = direct(handles, "show")
    assert plain.returncode == 0, show(plain)
    proc = remote(handles, "show", tmp_path=tmp_path)
    assert proc.returncode == 0, show(proc)
    seen = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if line.startswith(("stream", "event")))
    assert seen["stream"].startswith(VIRTUAL_TAG + "01"), proc.stdout     # VH_STREAM
    assert seen["event"].startswith(VIRTUAL_TAG + "02"), proc.stdout      # VH_EVENT
    assert VIRTUAL_TAG not in plain.stdout
    # A destroyed virtual handle is an error, as the runtime's own is.
    assert "destroyed stream sync: cudaErrorInvalidResourceHandle" in proc.stdout


# ---- refusals ------------------------------------------------------------------------


def test_unsupported_function_is_refused_by_name(handles, tmp_path):
    proc = remote(handles, "refused", tmp_path=tmp_path)
    assert proc.returncode == 0, show(proc)
    assert "cudaMallocArray: cudaErrorNotSupported" in proc.stdout
    assert "cudaMemcpy2D(HostToHost): cudaErrorNotSupported" in proc.stdout
    assert re.search(r"cudaMallocArray is not supported in transparent mode \(not marshalled by remote mode yet\)",
                     proc.stderr), proc.stderr
    assert re.search(r"this call of cudaMemcpy2D is not supported in transparent mode \(its arguments match: "
                     r"kind == cudaMemcpyDefault \|\| kind == cudaMemcpyHostToHost", proc.stderr), proc.stderr
    # cudaMemcpyDefault: the worker tells its device allocations from host memory
    assert "cudaMemcpy(Default) round trip: 1" in proc.stdout


def test_worker_without_a_proxy_fails_with_a_clear_message(handles):
    proc = subprocess.run([str(handles), "show"], env=env({"LD_PRELOAD": str(REMOTE_LIB)}), capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 1, show(proc)
    assert "JITCKPT_PROXY_SOCKET is not set" in proc.stderr
    assert "cudaErrorDevicesUnavailable" in proc.stderr


# ---- who may attach ----------------------------------------------------------------------


def test_only_the_proxys_worker_can_attach(proxy, handles, tmp_path):
    sock_path = tmp_path / "p.sock"
    sleeper = subprocess.Popen(["sleep", "60"])
    proxy_proc = subprocess.Popen([str(PROXY), "--socket", str(sock_path), "--worker-pid", str(sleeper.pid)],
                                  env=env(), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while not sock_path.exists():
            assert time.monotonic() < deadline and proxy_proc.poll() is None, "the proxy did not listen"
            time.sleep(0.02)
        assert (sock_path.stat().st_mode & 0o777) == 0o600          # owner-only
        # This test process is not the worker: SO_PEERCRED says so.
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.connect(str(sock_path))
            msg, ancdata, _, _ = s.recvmsg(24, socket.CMSG_SPACE(4))
            magic, version, _size, _pid, status = struct.unpack("=IIQii", msg)
            assert status == -1 and not ancdata, "a stranger was handed the segment"
        # Nor is a program with the remote library preloaded, run by this test.
        stranger = subprocess.run([str(handles), "show"], env=env({"LD_PRELOAD": str(REMOTE_LIB),
                                                                    "JITCKPT_PROXY_SOCKET": str(sock_path)}),
                                  capture_output=True, text=True, timeout=30)
        assert stranger.returncode == 1 and "refused this process" in stranger.stderr, show(stranger)
        assert proxy_proc.poll() is None, "the proxy must keep waiting for its worker"
    finally:
        proxy_proc.kill()
        sleeper.kill()
        _, err = proxy_proc.communicate(timeout=10)
        sleeper.wait(timeout=10)
    assert f"refused a connection from pid" in err and f"serves only pid {sleeper.pid}" in err


# ---- the proxy's life follows its worker's -------------------------------------------------


def test_proxy_exits_with_its_spawned_worker(handles, tmp_path):
    start = time.monotonic()
    proc = remote(handles, "exit_early", tmp_path=tmp_path, timeout=30)
    assert proc.returncode == 3 and "OK exit_early" in proc.stdout, show(proc)
    assert time.monotonic() - start < 20
    assert not list(tmp_path.glob("*.sock")), "the socket file must be gone"


def test_proxy_exits_cleanly_when_its_named_worker_exits(proxy, handles, tmp_path):
    sock_path = tmp_path / "w.sock"
    # The worker first waits for the proxy's socket; its pid is known before the proxy starts.
    worker = subprocess.Popen(["sh", "-c", f"while [ ! -S {sock_path} ]; do sleep 0.02; done; exec {handles} show"],
                              env=env({"LD_PRELOAD": str(REMOTE_LIB), "JITCKPT_PROXY_SOCKET": str(sock_path)}),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proxy_proc = subprocess.Popen([str(PROXY), "--socket", str(sock_path), "--worker-pid", str(worker.pid)],
                                  env={k: v for k, v in env().items() if k != "LD_PRELOAD"},
                                  stderr=subprocess.PIPE, text=True)
    try:
        out, err = worker.communicate(timeout=30)
        assert worker.returncode == 0 and "OK show" in out, f"{out}\n{err}"
        assert proxy_proc.wait(timeout=10) == 0
    finally:
        for p in (worker, proxy_proc):
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


# ---- the CUDA training example, with NCCL through the proxy ----------------------------------

MLP_DIR = ROOT / "examples" / "cuda_mlp"


@pytest.fixture(scope="session")
def mlp(proxy) -> Path:
    proc = subprocess.run(["make", "-C", str(MLP_DIR), "-j2"], capture_output=True, text=True)
    assert proc.returncode == 0, f"make -C examples/cuda_mlp failed:\n{proc.stdout}\n{proc.stderr}"
    return MLP_DIR / "build" / "mlp"


def final_checksums(outputs: list[str]) -> dict[int, str]:
    found = {}
    for out in outputs:
        for rank, value in re.findall(r"\[rank (\d+)\] final parameters checksum ([0-9a-f]+)", out):
            found[int(rank)] = value
    return found


def run_mlp_ranks(mlp: Path, world: int, tmp_path: Path, through_proxy: bool, steps: int = 30) -> list[str]:
    """One process per rank (a proxy per rank when through_proxy), meeting through a rendezvous file."""
    rendezvous = tmp_path / f"rv-{'proxy' if through_proxy else 'direct'}"
    rendezvous.mkdir()
    procs = []
    for rank in range(world):
        extra = {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank)}
        cmd = [str(mlp), "--steps", str(steps), "--rendezvous-dir", str(rendezvous)]
        if through_proxy:
            extra["JITCKPT_SIMDEV_KERNELS"] = str(MLP_DIR / "build" / "libmlp_twins.so")
            cmd = [str(PROXY), "--socket", str(tmp_path / f"rank{rank}.sock"), "--", *cmd]
        procs.append(subprocess.Popen(cmd, env=env(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    outs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, f"exit {p.returncode}\n{out}\n{err}"
            outs.append(out)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return outs


@pytest.mark.parametrize("world", [1, 2])
def test_cuda_mlp_ends_with_the_same_checksum_through_the_proxy_on_the_emulator(mlp, tmp_path, world):
    want = final_checksums(run_mlp_ranks(mlp, world, tmp_path, through_proxy=False))
    got = final_checksums(run_mlp_ranks(mlp, world, tmp_path, through_proxy=True))
    assert len(want) == world and got == want
