"""Transparent mode covers the runtime and NCCL functions the CPU device emulator implements.

The emulator's own test programs (tests/emulator_programs: every command that
does not inject a fault or use graphs) must print the same through the device
proxy as they print directly; so must tests/proxy_programs/coverage.c, which
makes the calls those programs do not (pitched and stream-ordered
allocations, 2D copies into host buffers with gaps, device settings, queries),
with a proxy restart in the middle.  Graph capture is refused by design, and
``test_proxy.py`` checks that refusal.  Run on the emulator only: what only a
GPU could confirm is listed in proxy_server/README.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from conftest import REPO, with_build_lock
from native_toolchain import CUDA_HOME, REQUIRES_CUDA_TOOLCHAIN
from test_emulator import emulator, programs  # noqa: F401  (fixtures)
from test_proxy import EMULATOR_BUILD, PROXY, REMOTE_LIB, direct, env, proxy, remote, show, twins  # noqa: F401

pytestmark = REQUIRES_CUDA_TOOLCHAIN

COVERAGE_SRC = Path(__file__).resolve().parent / "proxy_programs" / "coverage.c"


def same_output(a: subprocess.CompletedProcess, b: subprocess.CompletedProcess) -> tuple[str, str]:
    """The stdouts of two runs with measured times ("100.4 ms", "301 ms") blanked out."""
    return re.sub(r"\d+(\.\d+)? ms", "N ms", a.stdout), re.sub(r"\d+(\.\d+)? ms", "N ms", b.stdout)


@pytest.mark.parametrize("program,cmd", [
    ("cudart_basic", "devices"), ("cudart_basic", "symbols"), ("cudart_basic", "memcpy"),
    ("cudart_basic", "reset"), ("cudart_basic", "staging"),
    # managed memory, host functions, events, the per-thread default stream (the _ptds build)
    *[(build, cmd) for build in ("streams", "streams_ptds")
      for cmd in ("ordering", "events", "legacy", "nonblocking", "per_thread", "async_alloc")],
    # stream capture across streams, graph launches, the capture rules (a query of a captured event,
    # a capture ended on the wrong thread)
    ("graphs", "capture"), ("graphs", "captured_event"), ("graphs", "rules"),
])
def test_emulator_program_prints_the_same_through_the_proxy(programs, twins, tmp_path,  # noqa: F811
                                                            program, cmd):
    want = direct(programs[program], cmd)
    assert want.returncode == 0, show(want)
    twin = twins["streams" if program.startswith("streams") else program]
    got = remote(programs[program], cmd, tmp_path=tmp_path, extra={"JITCKPT_SIMDEV_KERNELS": str(twin)})
    assert got.returncode == 0, show(got)
    ours, theirs = same_output(got, want)
    assert ours == theirs, show(got)
    assert "is not supported in transparent mode" not in got.stderr, got.stderr


def run_ranks(binary: Path, args: list[str], world: int, tmp_path: Path, through_proxy: bool,
              extra: dict[str, str] | None = None) -> list[subprocess.CompletedProcess]:
    """One process per rank, directly or each behind its own proxy (rank 0 publishes the NCCL id in a file)."""
    id_file = tmp_path / f"nccl-id-{binary.name}-{through_proxy}-{time.monotonic_ns()}"
    procs = []
    for rank in range(world):
        e = env({"RANK": str(rank), "WORLD_SIZE": str(world), "JITCKPT_TEST_ID_FILE": str(id_file), **(extra or {})})
        cmdline = [str(binary), *args]
        if through_proxy:
            cmdline = [str(PROXY), "--socket", str(tmp_path / f"rank{rank}-{time.monotonic_ns()}.sock"), "--",
                       *cmdline]
        procs.append(subprocess.Popen(cmdline, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        out.append(subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr))
    return out


@pytest.mark.parametrize("cmd,world,extra", [
    ("collectives", 3, {}),
    ("determinism", 3, {}),
    ("nonblocking", 3, {}),                         # ncclCommInitRankConfig with blocking = 0
    ("initall", 1, {"JITCKPT_SIMDEV_DEVICES": "2"}),  # ncclCommInitAll over two devices in one process
    ("graph", 2, {}),                               # collectives captured in a graph
    # argument errors: NCCL returns them at once; through the proxy an asynchronous
    # call's error comes back from the next synchronous call, unless every call waits
    ("bad_args", 1, {"JITCKPT_REMOTE_SYNC": "1"}),
])
def test_nccl_program_prints_the_same_through_the_proxy(programs, proxy, tmp_path, cmd, world,  # noqa: F811
                                                        extra):
    want = run_ranks(programs["nccl_ranks"], [cmd], world, tmp_path, False, extra)
    got = run_ranks(programs["nccl_ranks"], [cmd], world, tmp_path, True, extra)
    for rank, (w, g) in enumerate(zip(want, got)):
        assert w.returncode == 0, show(w)
        assert g.returncode == 0, show(g)
        assert g.stdout == w.stdout, (rank, show(g))
        assert "is not supported in transparent mode" not in g.stderr, g.stderr


@pytest.fixture(scope="module")
def coverage(proxy, tmp_path_factory) -> Path:  # noqa: F811
    out = tmp_path_factory.mktemp("coverage") / "coverage"
    proc = subprocess.run(["gcc", "-O1", "-I", str(CUDA_HOME / "include"), "-o", str(out), str(COVERAGE_SRC),
                           "-L", str(EMULATOR_BUILD), "-l:libcudart.so.13", "-ldl"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize("mode,devices", [("", "1"), ("restart", "1"), ("", "2")])
def test_pitched_stream_ordered_2d_peer_and_settings_through_the_proxy(coverage, tmp_path, mode, devices):
    args, extra = [mode] if mode else [], {"JITCKPT_SIMDEV_DEVICES": devices}
    want = direct(coverage, *args, extra=extra)
    assert want.returncode == 0 and "OK coverage" in want.stdout, show(want)
    got = remote(coverage, *args, tmp_path=tmp_path, extra=extra)
    assert got.returncode == 0, show(got)
    assert got.stdout == want.stdout, show(got)
    assert "is not supported in transparent mode" not in got.stderr, got.stderr
    if devices == "2":
        assert "peer copies over 2 devices: 1000 .. 1015" in got.stdout
    if mode:
        # the restart really happened, and it gave back both allocations
        assert re.search(r"device proxy restarted \(driver suspect\).*2 allocations", got.stderr), got.stderr


def test_managed_memory_turns_transparent_recovery_off_with_the_reason(programs, twins, tmp_path):  # noqa: F811
    """A replay cannot reset managed memory: a job that would recover (several ranks, torchrun's
    store named) is told once that recovery is off, and the program itself runs on unchanged."""
    extra = {"JITCKPT_SIMDEV_KERNELS": str(twins["streams"]), "RANK": "0", "WORLD_SIZE": "2",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    got = remote(programs["streams"], "ordering", tmp_path=tmp_path, extra=extra)
    assert got.returncode == 0 and "OK ordering" in got.stdout, show(got)
    said = [line for line in got.stderr.splitlines() if "Transparent recovery is OFF" in line]
    assert len(said) == 1, got.stderr
    assert "managed memory (cudaMallocManaged), which a replay cannot reset" in said[0]


def test_registering_the_programs_memory_for_device_access_is_refused_by_name(coverage, tmp_path):
    """cudaHostRegister's Mapped flag promises kernels the program's own pages, which the proxy cannot map."""
    got = remote(coverage, "mapped", tmp_path=tmp_path)
    assert got.returncode == 0 and "cudaHostRegister(Mapped): cudaErrorNotSupported" in got.stdout, show(got)
    assert re.search(r"this call of cudaHostRegister is not supported in transparent mode \(its arguments match: "
                     r"flags & \(cudaHostRegisterMapped", got.stderr), got.stderr


@pytest.mark.parametrize("form", ["fatbin", "cubin", "ptx"])
def test_device_code_loaded_at_run_time_through_the_proxy(programs, twins, tmp_path, form):  # noqa: F811
    """cudaLibraryLoadFromFile, kernel handles, their launch and their parameter layout, the unload."""
    library = str(programs[f"library.{form}"])
    want = direct(programs["cudart_basic"], "library", library,
                  extra={"JITCKPT_SIMDEV_KERNELS": str(programs["twins_lib"])})
    assert want.returncode == 0 and "OK library" in want.stdout, show(want)
    got = remote(programs["cudart_basic"], "library", library, tmp_path=tmp_path,
                 extra={"JITCKPT_SIMDEV_KERNELS": f"{programs['twins_lib']}:{twins['cudart_basic']}"})
    assert got.returncode == 0 and got.stdout == want.stdout, show(got)
    assert "is not supported in transparent mode" not in got.stderr, got.stderr


PASSTHROUGH_SRC = Path(__file__).resolve().parent / "interpose_programs" / "passthrough.cu"


@pytest.fixture(scope="module")
@with_build_lock  # one worker compiles, the others reuse (tests/conftest.py)
def passthrough(proxy) -> dict[str, Path]:  # noqa: F811
    """tests/interpose_programs/passthrough.cu (cudaLaunchKernelExC, event records with flags, 2D copies,
    an all-reduce per round), built default and per-thread, and as twins for the proxy; cached by source."""
    from native_toolchain import NCCL_WHEEL

    source = PASSTHROUGH_SRC.read_bytes() + (PASSTHROUGH_SRC.parent / "common.h").read_bytes()
    digest = hashlib.sha256(source).hexdigest()[:12]
    out_dir = PROXY.parent / "test-twins" / f"passthrough-{digest}"
    flags = {"passthrough": [], "passthrough_ptds": ["--default-stream", "per-thread"],
             "twins.so": ["-shared", "-Xcompiler", "-fPIC"]}
    if not (out_dir / "complete").exists():
        work = out_dir.with_name(out_dir.name + f".tmp-{os.getpid()}")
        work.mkdir(parents=True, exist_ok=True)
        for name, extra in flags.items():
            proc = subprocess.run(["nvcc", "-cudart", "shared", "-std=c++17", *extra, "-o", str(work / name),
                                   str(PASSTHROUGH_SRC), "-I", str(NCCL_WHEEL / "include"),
                                   "-L", str(NCCL_WHEEL / "lib"), "-l:libnccl.so.2"], capture_output=True, text=True)
            assert proc.returncode == 0, proc.stderr
        (work / "complete").touch()
        try:
            work.rename(out_dir)
        except OSError:       # another session built it first
            pass
    return {name: out_dir / name for name in flags}


@pytest.mark.parametrize("build", ["passthrough", "passthrough_ptds"])
def test_ddp_shaped_program_with_launch_attributes_api_ends_the_same_through_the_proxy(passthrough, tmp_path,
                                                                                        build):
    """2 ranks: cudaLaunchKernelEx, cudaEventRecordWithFlags, 2D copies and sets, an all-reduce on the
    legacy stream and on a stream of its own; the parameters' hash equals the direct run's."""
    extra = {"JITCKPT_SIMDEV_KERNELS": str(passthrough["twins.so"])}
    want = run_ranks(passthrough[build], [], 2, tmp_path, False, extra)
    got = run_ranks(passthrough[build], [], 2, tmp_path, True, extra)
    for w, g in zip(want, got):
        assert w.returncode == 0 and "RESULT " in w.stdout, show(w)
        assert g.returncode == 0 and g.stdout == w.stdout, show(g)
        assert "is not supported in transparent mode" not in g.stderr, g.stderr


def test_graph_capture_turns_transparent_recovery_off_with_the_reason(programs, twins, tmp_path):  # noqa: F811
    """Captured work bypasses the call log: a job that would recover is told once that recovery is off."""
    extra = {"JITCKPT_SIMDEV_KERNELS": str(twins["graphs"]), "RANK": "0", "WORLD_SIZE": "2",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    got = remote(programs["graphs"], "capture", tmp_path=tmp_path, extra=extra)
    assert got.returncode == 0 and "OK capture" in got.stdout, show(got)
    said = [line for line in got.stderr.splitlines() if "Transparent recovery is OFF" in line]
    assert len(said) == 1 and "captures CUDA graphs" in said[0], got.stderr


def test_what_a_cuda_pytorch_imports_is_marshalled_or_refused_with_its_own_reason(proxy):  # noqa: F811
    """Issue 19's list of the runtime and NCCL functions a CUDA PyTorch imports: the occupancy queries are
    marshalled, each other one is refused when called with a reason of its own (never the generic "not
    marshalled yet"), its pnccl twin too, and NCCL's device API, declared outside nccl.h, is exported as a
    refusal rather than left to bind to a real NCCL in the worker."""
    coverage = json.loads((REPO / "interpose" / "build" / "gen" / "coverage.json").read_text())
    remote, refused = coverage["remote"], coverage["refused"]
    for name in ("cudaOccupancyMaxActiveBlocksPerMultiprocessor",
                 "cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags"):
        assert remote.get(name) == "marshalled", name
    reasons = {
        "cudaIpcGetMemHandle": "CUDA IPC", "cudaIpcOpenMemHandle": "CUDA IPC", "cudaIpcCloseMemHandle": "CUDA IPC",
        "cudaIpcGetEventHandle": "CUDA IPC", "cudaIpcOpenEventHandle": "CUDA IPC",
        "cudaDeviceGetDefaultMemPool": "memory pools", "cudaMemPoolGetAttribute": "memory pools",
        "cudaMemPoolSetAttribute": "memory pools", "cudaMemPoolSetAccess": "memory pools",
        "cudaLaunchCooperativeKernel": "cooperative", "cudaGraphGetNodes": "graph introspection",
        "cudaGraphNodeGetDependencies": "graph introspection", "cudaGraphDebugDotPrint": "graph introspection",
        "ncclCommSplit": "splits", "pncclCommSplit": "splits", "ncclCommShrink": "fault tolerance",
        "ncclCommInitRankScalable": "several unique ids", "ncclCommRegister": "registration",
        "ncclCommDeregister": "registration", "ncclCommWindowRegister": "registration",
        "ncclCommWindowDeregister": "registration", "ncclGroupSimulateEnd": "simulating",
        "ncclDevCommCreate": "device API", "ncclDevCommDestroy": "device API",
    }
    for name, words in reasons.items():
        assert words in refused.get(name, ""), (name, refused.get(name))
    exported = subprocess.run(["nm", "-D", "--defined-only", str(REMOTE_LIB)], capture_output=True, text=True,
                              check=True).stdout
    assert re.search(r"\bncclDevCommCreate\b", exported) and re.search(r"\bcudaIpcOpenMemHandle@@", exported)
