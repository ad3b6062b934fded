"""Tests of the passthrough interposition library (``interpose/``), on the CPU device emulator.

``libjitckpt_interpose.so`` is LD_PRELOADed in front of the emulator's
``libcudart.so.13`` and ``libnccl.so.2`` (which stand in for NVIDIA's, with the
same sonames, symbol versions and ABI).  These tests check, *on the emulator*:

* the library's exports match the real libraries' (versions, names), and a
  CUDA 13 binary binds the wrapped calls to it and everything else to the
  runtime;
* passthrough is transparent: a DDP-shaped CUDA program prints the same bytes
  with and without the preload, and no JIT event fires in a healthy run;
* a hang injected into one rank's all-reduce makes the *other* ranks' C
  watchdog raise a JIT event within the timeout, and the save registered
  through ``jitckpt.native.interposer`` runs -- also while the main thread holds the
  GIL inside a blocking CUDA call (the SIGUSR1 release), and when it enters
  one after the event;
* device-to-host copies issued by the save on the blocked default stream
  complete and return the right bytes (save-time redirection), for the saving
  thread only and only while it saves;
* a peer's failure that NCCL reports as an asynchronous error is a JIT event
  long before the hang timeout;
* the watchdog never queries an event recorded during CUDA graph capture,
  and a collective hanging inside a graph launch is a JIT event;
* each of those mechanisms is necessary: turned off, the save does not run.

What only a GPU can confirm is listed in ``interpose/README.md``.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import with_build_lock
from native_toolchain import (CUDA_HOME, EMULATOR_BUILD, EMULATOR_ENV, NCCL_WHEEL, REAL_CUDART, REQUIRES_CUDA_TOOLCHAIN,
                              ROOT, build_emulator)

INTERPOSE = ROOT / "interpose"
LIBRARY = INTERPOSE / "build" / "libjitckpt_interpose.so"
PROGRAMS = Path(__file__).resolve().parent / "interpose_programs"

HANG_FAULT = "rank=1,op=ncclAllReduce,call=3,kind=hang"
SAVED_EXIT = 75
TIMEOUT = 2.0  # hang timeout of the hang tests, seconds
MARGIN = 3.0  # how late after the timeout the save may start

# Cleared for every run so the caller's environment cannot change a test's meaning.
CLEARED_ENV = (
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    *EMULATOR_ENV,
    "JITCKPT_HANG_TIMEOUT",
    "JITCKPT_INTERPOSE_POLL_MS",
    "JITCKPT_INTERPOSE_GIL_RELEASE",
    "JITCKPT_INTERPOSE_REDIRECT",
    "JITCKPT_INTERPOSE_STATS",
    "JITCKPT_ACTIVE",
    "RANK",
    "WORLD_SIZE",
)


pytestmark = [
    *REQUIRES_CUDA_TOOLCHAIN,
    pytest.mark.skipif(importlib.util.find_spec("cffi") is None, reason="cffi is not installed"),
]


# ---- building ------------------------------------------------------------------


@pytest.fixture(scope="session")
def emulator() -> Path:
    return build_emulator()


@pytest.fixture(scope="session")
def library(emulator: Path) -> Path:
    proc = subprocess.run(["make", "-C", str(INTERPOSE), "-j2"], capture_output=True, text=True)
    assert proc.returncode == 0, f"make -C interpose failed:\n{proc.stdout}\n{proc.stderr}"
    assert LIBRARY.exists()
    return LIBRARY


def _nvcc(out: Path, source: str, *flags: str) -> Path:
    assert NCCL_WHEEL is not None
    cmd = ["nvcc", "-cudart", "shared", "-std=c++17", "-o", str(out), str(PROGRAMS / source), *flags,
           "-I", str(NCCL_WHEEL / "include"), "-L", str(NCCL_WHEEL / "lib"), "-l:libnccl.so.2"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}"
    return out


@pytest.fixture(scope="session")
@with_build_lock  # one worker compiles, the others reuse (tests/conftest.py)
def programs(library: Path) -> dict[str, Path]:
    """passthrough.cu built twice (default stream, per-thread default stream), cached by source hash."""
    jobs = {"passthrough": ("passthrough.cu", ()),
            "passthrough_ptds": ("passthrough.cu", ("--default-stream", "per-thread")),
            "capture": ("capture.cu", ())}
    digest = hashlib.sha256()
    for path in sorted([*PROGRAMS.glob("*.cu"), *PROGRAMS.glob("*.h")]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(repr(sorted(jobs.items())).encode())
    digest.update(subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.encode())
    cache = INTERPOSE / "build" / "test-programs"
    final = cache / digest.hexdigest()[:16]
    if not (final / "complete").exists():
        work = cache / f"{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            for fut in [pool.submit(_nvcc, work / name, src, *flags) for name, (src, flags) in jobs.items()]:
                fut.result()
        (work / "complete").touch()
        try:
            work.rename(final)
        except OSError:  # another session got there first
            shutil.rmtree(work, ignore_errors=True)
        for stale in cache.iterdir():
            if stale != final and ".tmp-" not in stale.name:
                shutil.rmtree(stale, ignore_errors=True)
    return {name: final / name for name in jobs}


# ---- running -------------------------------------------------------------------


def _env(extra: dict[str, str] | None = None, preload: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV}
    env["LD_LIBRARY_PATH"] = str(EMULATOR_BUILD)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    if preload:
        env["LD_PRELOAD"] = str(LIBRARY)
    env.update(extra or {})
    return env


def start_ranks(cmd: list[str], world: int, tmp_path: Path, env: dict[str, str] | None = None,
                preload: bool = True) -> list[subprocess.Popen]:
    """One process per rank (RANK/WORLD_SIZE); rank 0 publishes the ncclUniqueId in a file."""
    id_file = tmp_path / f"nccl-id-{time.monotonic_ns()}"
    procs = []
    for rank in range(world):
        extra = {"RANK": str(rank), "WORLD_SIZE": str(world), "JITCKPT_TEST_ID_FILE": str(id_file), **(env or {})}
        procs.append(subprocess.Popen(cmd, env=_env(extra, preload), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return procs


def finish(procs: list[subprocess.Popen], timeout: float) -> list[subprocess.CompletedProcess]:
    """Waits for every rank; kills all of them if one is still running at the deadline."""
    deadline = time.monotonic() + timeout
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(0.5, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


def kill_at(procs: list[subprocess.Popen], deadline: float) -> list[subprocess.CompletedProcess]:
    """Lets the ranks run until `deadline` (monotonic), then kills those still running."""
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.kill()
    return [subprocess.CompletedProcess(p.args, p.wait(), *p.communicate()) for p in procs]


def without_and_with_the_preload(cmd: list[str], tmp_path: Path) -> tuple[list[subprocess.CompletedProcess], ...]:
    """The same 2-rank job run plainly and under the interposer (counters printed; a 1 s hang timeout,
    which a healthy run must never reach); both must succeed."""
    plain = finish(start_ranks(cmd, 2, tmp_path, preload=False), 60)
    assert all(r.returncode == 0 for r in plain), describe(plain)
    env = {"JITCKPT_INTERPOSE_STATS": "1", "JITCKPT_HANG_TIMEOUT": "1"}
    interposed = finish(start_ranks(cmd, 2, tmp_path, env=env), 60)
    assert all(r.returncode == 0 for r in interposed), describe(interposed)
    return plain, interposed


def describe(results: list[subprocess.CompletedProcess]) -> str:
    return "\n".join(f"--- rank {i}: exit {r.returncode}\n{r.stdout}\n{r.stderr}" for i, r in enumerate(results))


def stats(stderr: str) -> dict[str, int]:
    """The counters printed at exit with JITCKPT_INTERPOSE_STATS=1."""
    found = re.findall(r"jitckpt-interpose\[\d+\]: stats (.*)", stderr)
    assert found, stderr
    return {k: int(v) for k, v in (item.split("=") for item in found[-1].split())}


# ---- ELF facts -----------------------------------------------------------------


def dyn_symbols(path: Path) -> list[tuple[str, str | None, bool]]:
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(path)], capture_output=True, text=True, check=True).stdout
    result = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 8 or not fields[0].rstrip(":").isdigit():
            continue
        name, ndx = fields[7], fields[6]
        if not name or ndx == "ABS":
            continue
        base, _, version = name.partition("@")
        result.append((base, version.lstrip("@") or None, ndx != "UND"))
    return result


def exports(path: Path) -> dict[str, str | None]:
    return {name: version for name, version, defined in dyn_symbols(path) if defined}


# ---- ABI -------------------------------------------------------------------------


def test_exports_use_the_real_libraries_versions_and_names(library):
    assert NCCL_WHEEL is not None and REAL_CUDART is not None
    ours = exports(library)
    real_cudart = exports(REAL_CUDART)
    real_nccl = exports(NCCL_WHEEL / "lib" / "libnccl.so.2")
    cuda = {n: v for n, v in ours.items() if n.startswith(("cuda", "__cuda"))}
    nccl = {n: v for n, v in ours.items() if n.startswith("nccl")}
    control = {n: v for n, v in ours.items() if n.startswith(("jitckpt_interpose_", "jitckpt_phase_"))}
    assert {"cudaEventRecord", "cudaStreamWaitEvent", "cudaMemcpy", "__cudaLaunchKernel",
            "cudaEventRecord_ptsz"} <= set(cuda)
    for name, version in cuda.items():
        assert real_cudart.get(name) == version == "libcudart.so.13", (name, version, real_cudart.get(name))
    assert {"ncclAllReduce", "ncclSend", "ncclRecv", "ncclBroadcast"} <= set(nccl)
    for name, version in nccl.items():
        assert version is None and name in real_nccl, (name, version)
    assert control and all(v == "JITCKPT_INTERPOSE_1" for v in control.values())
    assert set(ours) == set(cuda) | set(nccl) | set(control), set(ours) - set(cuda) - set(nccl) - set(control)
    needed = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
    for lib in ("libcudart", "libnccl", "libpython"):
        assert lib not in needed, f"the library must find {lib} at run time, not link it"


def test_wrapped_calls_bind_to_the_interposer_and_the_rest_to_the_runtime(programs, tmp_path):
    # LD_BIND_NOW: every binding is made at start-up, before any thread could interleave its output.
    env = {"LD_DEBUG": "bindings", "LD_BIND_NOW": "1", "ROUNDS": "1"}
    [result] = finish(start_ranks([str(programs["passthrough"])], 1, tmp_path, env=env), 60)
    assert result.returncode == 0, describe([result])

    def bound(symbol: str) -> str:
        found = re.findall(rf"^\s*\d+:\s+binding file \S*passthrough \[0\] to (\S+) \[0\]: "
                           rf"normal symbol `{symbol}'(?: \[([^\]\s]+)\])?$", result.stderr, re.M)
        assert found, f"no binding of {symbol} from the program"
        lib, version = found[0]
        return f"{Path(lib).name}@{version}" if version else Path(lib).name

    assert bound("cudaEventRecord") == "libjitckpt_interpose.so@libcudart.so.13"
    assert bound("cudaStreamWaitEvent") == "libjitckpt_interpose.so@libcudart.so.13"
    assert bound("__cudaLaunchKernel") == "libjitckpt_interpose.so@libcudart.so.13"
    assert bound("ncclAllReduce") == "libjitckpt_interpose.so"
    assert bound("cudaMalloc") == "libcudart.so.13@libcudart.so.13"
    assert bound("ncclCommInitRank") == "libnccl.so.2"


# ---- the generated code (interpose/tools/gen_interpose.py) --------------------------

GEN = INTERPOSE / "build" / "gen"
CUDA_HEADER = CUDA_HOME / "include" / "cuda_runtime_api.h"


def version_script(path: Path) -> dict[str, set[str]]:
    """node -> the names of its global: list."""
    text = re.sub(r"/\*.*?\*/", "", path.read_text(), flags=re.S)
    return {node: {name.strip() for name in body.split(";") if name.strip()}
            for node, body in re.findall(r"([\w.]+)\s*\{\s*global:(.*?)\};", text, flags=re.S)}


def api_exports(path: Path) -> dict[str, str | None]:
    return {n: v for n, v in exports(path).items() if n.startswith(("cuda", "__cuda", "nccl", "pnccl"))}


def test_generated_coverage_and_version_script_agree_with_the_exports(library, emulator):
    ours = exports(library)
    nodes = version_script(GEN / "interpose.map")
    assert set(nodes) == {"libcudart.so.13", "JITCKPT_INTERPOSE_1"}
    assert nodes["libcudart.so.13"] == {n for n, v in ours.items() if v == "libcudart.so.13"}
    assert nodes["JITCKPT_INTERPOSE_1"] == {"jitckpt_interpose_*", "jitckpt_phase_*"}

    coverage = json.loads((GEN / "coverage.json").read_text())
    assert coverage["generated_by"] == "interpose/tools/gen_interpose.py -- do not edit"
    assert coverage["runtime_version_node"] == "libcudart.so.13"
    functions = coverage["functions"]
    wrapped = {n for n, f in functions.items() if f["passthrough"] == "wrapped"}
    assert wrapped == set(api_exports(library)), wrapped ^ set(api_exports(library))
    for name in wrapped:
        assert functions[name]["version"] == ours[name], name
    # The list is generated from the headers alone; the emulator implements every function in it that
    # transparent mode sends to the device proxy (a pure one the worker calls in-process needs no device).
    emulated = {**api_exports(emulator / "libcudart.so.13"), **api_exports(emulator / "libnccl.so.2")}
    if (emulator / "libcublas.so.13").exists():  # cuBLAS, forwarded when the build has its header (issue 19)
        emulated.update({n: v for n, v in exports(emulator / "libcublas.so.13").items() if n.startswith("cublas")})
    if (emulator / "libcublasLt.so.13").exists():  # cuBLASLt, forwarded when the build has cublasLt.h too
        emulated.update({n: v for n, v in exports(emulator / "libcublasLt.so.13").items() if n.startswith("cublasLt")})
    if (emulator / "libcudnn.so.9").exists():  # cuDNN, forwarded when the build has its headers
        emulated.update({n: v for n, v in exports(emulator / "libcudnn.so.9").items() if n.startswith("cudnn")})
    assert set(emulated) <= set(functions)
    proxied = {n for n, f in functions.items() if f["transparent"] and coverage["remote"][n] != "in-process"}
    assert proxied <= set(emulated), proxied - set(emulated)
    for name, version in emulated.items():
        row = functions[name]
        library = ("nccl" if "nccl" in name else "cublasLt" if name.startswith("cublasLt") else
                   "cublas" if name.startswith("cublas") else "cudnn" if name.startswith("cudnn") else "cudart")
        assert row["version"] == version and row["library"] == library, row
    assert functions["cudaMalloc"] == {"library": "cudart", "version": "libcudart.so.13",
                                       "passthrough": "forwarded", "transparent": True}
    assert functions["ncclAllReduce"]["passthrough"] == "wrapped" and functions["ncclAllReduce"]["transparent"]
    assert not functions["ncclAllReduceConfig"]["transparent"]  # wrapped, but not marshalled


def test_generated_cdef_is_the_control_header_for_cffi(library):
    import cffi

    cdef = (GEN / "jitckpt_interpose.cdef").read_text()
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    header = (INTERPOSE / "include" / "jitckpt_interpose.h").read_text()
    version = int(re.search(r"#define JITCKPT_INTERPOSE_API_VERSION (\d+)", header).group(1))
    constants = ffi.dlopen(None)  # the process itself: only the constants are read, no function
    assert constants.JITCKPT_INTERPOSE_API_VERSION == version
    assert (constants.JITCKPT_INTERPOSE_HANG, constants.JITCKPT_INTERPOSE_CUDA_ERROR,
            constants.JITCKPT_INTERPOSE_NCCL_ERROR) == (1, 2, 3)
    assert ffi.sizeof("struct jitckpt_interpose_counters") == 8 * 15
    # Save mode is the calling thread's only (API version 2 dropped the whole-process flag).
    assert "void jitckpt_interpose_save_in_progress(int on);" in cdef
    declared = set(re.findall(r"\b(jitckpt_interpose_\w+)\(", cdef))
    assert declared == {n for n in exports(library) if n.startswith("jitckpt_interpose_")}


def test_generator_names_a_fact_the_header_does_not_declare(tmp_path):
    """A function of the facts table missing from cuda_runtime_api.h stops the build, naming it."""
    assert NCCL_WHEEL is not None
    header = tmp_path / "cuda_runtime_api.h"
    header.write_text("".join(line for line in CUDA_HEADER.read_text().splitlines(keepends=True)
                              if "CUDARTAPI cudaEventQuery(" not in line))
    out = tmp_path / "gen"
    proc = subprocess.run([sys.executable, str(INTERPOSE / "tools" / "gen_interpose.py"),
                           "--cuda-header", str(header), "--nccl-header", str(NCCL_WHEEL / "include" / "nccl.h"),
                           "--control-header", str(INTERPOSE / "include" / "jitckpt_interpose.h"),
                           "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "cudaEventQuery" in proc.stderr and "api_facts.py" in proc.stderr, proc.stderr
    assert not out.exists()


# ---- passthrough -----------------------------------------------------------------


@pytest.mark.parametrize("build", ["passthrough", "passthrough_ptds"])
def test_passthrough_gives_identical_results_with_and_without_the_preload(programs, tmp_path, build):
    plain, interposed = without_and_with_the_preload([str(programs[build])], tmp_path)
    for a, b in zip(plain, interposed):
        assert "RESULT " in a.stdout and a.stdout == b.stdout
        assert "jitckpt-interpose" not in a.stderr
    for r in interposed:
        counters = stats(r.stderr)
        # The interposer really saw the calls: 6 rounds, two NCCL records and waits each.
        assert counters["nccl_streams"] >= 1 and counters["nccl_records"] >= 12, counters
        assert counters["watches"] >= 12 and counters["watchdog_started"] == 1, counters
        assert counters["jit_events"] == 0 and counters["untracked"] == 0, counters


def test_forwarding_finds_a_runtime_dlopened_with_rtld_local(library):
    script = """
import ctypes
cudart = ctypes.CDLL("libcudart.so.13")          # RTLD_LOCAL: not in the global scope
glob = ctypes.CDLL(None)                         # the global scope: only the interposer's wrappers
assert not hasattr(glob, "cudaMalloc")
vp = ctypes.c_void_p
stream, event = vp(), vp()
assert cudart.cudaStreamCreate(ctypes.byref(stream)) == 0
assert cudart.cudaEventCreate(ctypes.byref(event)) == 0
glob.cudaEventRecord.argtypes = [vp, vp]
glob.cudaStreamSynchronize.argtypes = [vp]
assert glob.cudaEventRecord(event, stream) == 0
assert glob.cudaStreamSynchronize(stream) == 0
cudart.cudaEventQuery.argtypes = [vp]
assert cudart.cudaEventQuery(event) == 0
print("OK rtld_local")
"""
    proc = subprocess.run([sys.executable, "-c", script], env=_env(), capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0 and "OK rtld_local" in proc.stdout, proc.stderr


def test_malformed_settings_stop_the_program_with_a_clear_message(library):
    for name, value in (("JITCKPT_HANG_TIMEOUT", "soon"), ("JITCKPT_HANG_TIMEOUT", "-1"),
                        ("JITCKPT_INTERPOSE_POLL_MS", "0"), ("JITCKPT_INTERPOSE_REDIRECT", "yes")):
        proc = subprocess.run([sys.executable, "-c", "print('ran')"], env=_env({name: value}),
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and "ran" not in proc.stdout, (name, value, proc.stderr)
        assert f"{name}={value} is not valid" in proc.stderr, proc.stderr


def test_python_binding_is_inert_without_the_preload():
    from jitckpt.native import interposer as interpose

    assert not interpose.is_loaded()  # pytest itself runs without LD_PRELOAD
    assert interpose.install(on_jit_event=lambda reason, detail: None) is False
    assert interpose.in_flight_events() == []
    assert interpose.timeout() is None
    assert interpose.counters() == {}
    interpose.save_in_progress(True)
    interpose.set_timeout(5)
    with pytest.raises(ValueError):
        interpose.set_timeout(0)


# ---- CUDA graph capture ----------------------------------------------------------------


def test_the_watchdog_never_queries_an_event_recorded_during_graph_capture(programs, tmp_path):
    """An NCCL event recorded and waited for inside a capture is a graph node, not a stream marker.

    cudaEventQuery on it returns cudaErrorCapturedEvent and invalidates the capture (on a GPU and on
    the emulator), so the watchdog must leave it alone: the capture, held open for 300 ms of 5 ms
    polls, must end well, and the graph's all-reduce must give the right results at every launch."""
    plain, interposed = without_and_with_the_preload([str(programs["capture"])], tmp_path)
    for a, b in zip(plain, interposed):
        assert "RESULT 32" in a.stdout and a.stdout == b.stdout
    for r in interposed:
        counters = stats(r.stderr)
        assert counters["captured_records"] >= 1, counters   # the join event, recorded in the capture
        assert counters["watches"] >= 1 and counters["jit_events"] == 0, counters
        assert counters["graph_launches"] == 4, counters     # each launch of the graph was watched


def test_a_collective_that_hangs_inside_a_graph_launch_is_a_jit_event(programs, tmp_path):
    """Rank 1 never issues its third graph launch: rank 0's third launch never completes.

    The interposer records an event of its own after each cudaGraphLaunch of a graph that captured
    a collective, and watches it like an event behind an NCCL kernel."""
    env = {"JITCKPT_HANG_TIMEOUT": str(TIMEOUT), "WITHHOLD_LAUNCH": "3"}
    procs = start_ranks([str(programs["capture"])], 2, tmp_path, env=env)
    started = time.monotonic()
    results = kill_at(procs, started + 8 + TIMEOUT + MARGIN)
    assert "rank 1: withholding launch 3" in results[1].stdout, describe(results)
    assert "rank 0: launch 2 ok" in results[0].stdout and "launch 3 ok" not in results[0].stdout
    found = re.search(r"JIT event: (cudaEvent \S+ recorded after cudaGraphLaunch .*)", results[0].stderr)
    assert found, describe(results)
    assert "not complete after" in found.group(1), found.group(1)


# ---- hang detection and the JIT save ------------------------------------------------


def hang_ranks(mode: str, world: int, tmp_path: Path,
               env: dict[str, str] | None = None) -> tuple[list[subprocess.Popen], Path]:
    """hang_driver.py ranks with rank 1's third all-reduce hung; returns them and their output dir."""
    out = tmp_path / f"out-{mode}"
    out.mkdir()
    extra = {"OUT_DIR": str(out), "JITCKPT_SIMDEV_FAULT": HANG_FAULT, "JITCKPT_HANG_TIMEOUT": str(TIMEOUT),
             **(env or {})}
    procs = start_ranks([sys.executable, str(PROGRAMS / "hang_driver.py"), mode], world, tmp_path, env=extra)
    return procs, out


def check_saved(results: list[subprocess.CompletedProcess], out: Path, rank: int, timeout: float = TIMEOUT) -> dict:
    """The checks every healthy rank's JIT save must pass; returns its record."""
    result = results[rank]
    assert result.returncode == SAVED_EXIT, describe(results)
    record = json.loads((out / f"save-rank{rank}.json").read_text())
    assert record["reason"] == "cuda-hang"
    assert "not complete after" in record["detail"] and f"NCCL stream {hex(record['nccl_stream'])}" in record["detail"]
    # Within the timeout (the coarse clock may run a few ms behind) plus a margin.
    assert timeout - 0.05 <= record["seconds_after_hang"] <= timeout + MARGIN, record
    assert record["timeout"] == timeout
    # The watch-list holds the hung all-reduce's event, recorded on the NCCL stream and
    # waited for by the legacy default stream (handle 1).
    assert any(e["recorded_on"] == record["nccl_stream"] and e["waited_by"] == 1 and e["age_seconds"] >= timeout - 0.05
               for e in record["in_flight"]), record["in_flight"]
    # The save's copies on the blocked default stream completed with the right bytes.
    assert record["rc"] == [0, 0, 0], record
    assert record["memcpy_ok"] and record["memcpy_async_ok"], record
    counters = record["counters"]
    assert counters["jit_events"] == 1 and counters["redirected_ops"] >= 3, counters
    assert "JIT event: cudaEvent" in result.stderr
    return record


def test_hang_on_another_rank_fires_the_watchdog_and_the_save_runs(library, tmp_path):
    procs, out = hang_ranks("release", 3, tmp_path)
    results = finish(procs, 60)
    assert "injecting fault kind=hang at ncclAllReduce call 3 (rank 1)" in results[1].stderr
    for rank in (0, 2):  # the healthy ranks
        record = check_saved(results, out, rank)
        assert record["counters"]["gil_released"] == 0  # nothing held the GIL: ctypes.CDLL released it
        assert "round 1 ok" in results[rank].stdout and "round 2 ok" not in results[rank].stdout


def test_save_runs_while_the_main_thread_holds_the_gil_blocked_in_cuda(library, tmp_path):
    # The timeout comes from set_timeout() this time; the environment says 10 minutes.
    procs, out = hang_ranks("hold", 3, tmp_path, env={"JITCKPT_HANG_TIMEOUT": "600", "DRIVER_TIMEOUT": str(TIMEOUT)})
    results = finish(procs, 60)
    for rank in (0, 2):
        counters = check_saved(results, out, rank)["counters"]
        # The main thread was signalled inside cudaStreamSynchronize and its GIL released.
        assert counters["signals_sent"] >= 1 and counters["gil_released"] == 1, counters


def test_under_a_runtime_the_callback_triggers_it_and_its_save_thread_is_redirected(library, tmp_path):
    """jitckpt.api.runtime() present: its trigger() runs, and saves on a Python thread of its own."""
    procs, out = hang_ranks("runtime", 2, tmp_path)
    results = finish(procs, 60)
    record = check_saved(results, out, 0)
    assert record["thread"] == "jitckpt-save"  # not the watchdog thread: the save thread marked itself
    assert record["counters"]["gil_released"] == 1


def test_save_mode_is_the_saving_threads_own_and_ends_with_the_save(library, tmp_path):
    """Under a runtime, only the thread that saves has its copies redirected, and only while it saves.

    A bystander thread's copy on the blocked default stream, issued during the save, stays behind the
    hung collective (it never escapes the hang because another thread saves), and a copy issued after
    save_in_progress(False) is not redirected."""
    procs, out = hang_ranks("scoped", 2, tmp_path)
    results = finish(procs, 60)
    record = check_saved(results, out, 0)
    assert record["thread"] == "jitckpt-save"
    assert not record["bystander_escaped"], "a thread that was not saving had its copy redirected"
    assert record["rc_after"] == 0
    during, after = record["counters"]["redirected_ops"], record["counters_after"]["redirected_ops"]
    assert after == during, f"a copy issued after the save ended was redirected ({during} -> {after})"


def test_a_peers_asynchronous_nccl_error_is_a_jit_event_before_the_hang_timeout(library, tmp_path):
    """Rank 1 dies before its third all-reduce: the others' communicators report ncclRemoteError.

    The C watchdog polls ncclCommGetAsyncError of the communicators it has seen in NCCL calls and
    raises a JIT event with reason nccl-error, seconds after the loss, while the hang timeout is
    ten minutes away."""
    procs, out = hang_ranks("peer_dies", 3, tmp_path, env={"JITCKPT_SIMDEV_FAULT": "", "JITCKPT_HANG_TIMEOUT": "600"})
    results = kill_at(procs, time.monotonic() + 20)
    assert results[1].returncode == 9 and "exiting before round 2" in results[1].stdout, describe(results)
    for rank in (0, 2):
        assert results[rank].returncode == SAVED_EXIT, describe(results)
        record = json.loads((out / f"save-rank{rank}.json").read_text())
        assert record["reason"] == "nccl-error", record
        assert "ncclCommGetAsyncError" in record["detail"] and "ncclRemoteError" in record["detail"], record
        assert record["seconds_after_hang"] < 10, record  # the hang timeout is 600 s
        # The save's copies on the default stream, stuck behind the failed all-reduce, were redirected.
        assert record["rc"] == [0, 0, 0] and record["memcpy_ok"] and record["memcpy_async_ok"], record
        counters = record["counters"]
        assert counters["jit_events"] == 1 and counters["nccl_comms"] == 1, counters


def test_thread_that_blocks_with_the_gil_after_the_event_is_parked(library, tmp_path):
    procs, out = hang_ranks("late", 2, tmp_path)
    results = finish(procs, 60)
    assert "save started, now blocking with the GIL" in results[0].stdout, describe(results)
    counters = check_saved(results, out, 0)["counters"]
    assert counters["threads_parked"] == 1 and counters["signals_sent"] == 0, counters


def test_without_the_gil_release_a_thread_holding_the_gil_blocks_the_save(library, tmp_path):
    """Negative control for the test above: the emulator hang really holds the GIL forever."""
    procs, out = hang_ranks("hold", 2, tmp_path, env={"JITCKPT_INTERPOSE_GIL_RELEASE": "0"})
    results = kill_at(procs, time.monotonic() + 8 + TIMEOUT + MARGIN)
    assert "JIT event: cudaEvent" in results[0].stderr, describe(results)  # detected ...
    assert not (out / "started-rank0").exists()  # ... but the Python save never got the GIL
    assert results[0].returncode != SAVED_EXIT


def test_without_redirection_the_saves_copy_waits_behind_the_hung_collective(library, tmp_path):
    """Negative control for the copy checks: cudaMemcpy on the default stream deadlocks."""
    procs, out = hang_ranks("release", 2, tmp_path, env={"JITCKPT_INTERPOSE_REDIRECT": "0"})
    results = kill_at(procs, time.monotonic() + 8 + TIMEOUT + MARGIN)
    assert (out / "started-rank0").exists(), describe(results)
    assert not (out / "save-rank0.json").exists()
    assert results[0].returncode != SAVED_EXIT
