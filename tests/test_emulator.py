"""Conformance tests of the CPU device emulator (``emulator/``).

The emulator provides ``libcudart.so.13`` and ``libnccl.so.2`` with the
sonames, symbol versions and ABI of the real libraries.  These tests build it
with ``make -C emulator``, compile ordinary CUDA C++ programs from
``tests/emulator_programs/`` with ``nvcc -cudart shared`` (linked against the
*real* CUDA runtime and the *real* NCCL from the ``nvidia-nccl-cu13`` wheel),
and run them with ``LD_LIBRARY_PATH=emulator/build`` so that the dynamic
linker binds them to the emulator instead.

Every program checks its results against a host reference and exits 0 only
if all checks pass.  Test names say what they verify *on the emulator*;
``emulator/README.md`` lists what only a real GPU can confirm.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import with_build_lock
from native_toolchain import CUDA_HOME, EMULATOR, EMULATOR_ENV, NCCL_WHEEL, REAL_CUDART, REQUIRES_CUDA_TOOLCHAIN, build_emulator

BUILD = EMULATOR / "build"
PROGRAMS = Path(__file__).resolve().parent / "emulator_programs"

# Environment variables of the emulator; cleared for every run so that the
# caller's environment cannot change a test's meaning.
EMULATOR_ENV = (*EMULATOR_ENV, "RANK", "WORLD_SIZE")

# Hidden entry points that nvcc 13 (-cudart shared) emits into a program with
# kernels and __device__ variables (verified with nm -D; see the README).
NVCC13_HIDDEN = {
    "__cudaRegisterFatBinary",
    "__cudaRegisterFatBinaryEnd",
    "__cudaUnregisterFatBinary",
    "__cudaRegisterFunction",
    "__cudaRegisterVar",
    "__cudaPushCallConfiguration",
    "__cudaPopCallConfiguration",
    "__cudaGetKernel",
    "__cudaLaunchKernel",
    "__cudaInitModule",
}


pytestmark = REQUIRES_CUDA_TOOLCHAIN


# ---- building ------------------------------------------------------------------


@pytest.fixture(scope="session")
def emulator() -> Path:
    """Builds emulator/build/{libcudart.so.13,libnccl.so.2} once per session."""
    build_emulator()
    for lib in ("libcudart.so.13", "libnccl.so.2"):
        assert (BUILD / lib).exists()
    return BUILD


def _nvcc(out: Path, source: str, *flags: str, nccl: bool = False) -> Path:
    device_only = any(f in ("-fatbin", "-cubin", "-ptx") for f in flags)
    cmd = ["nvcc", *(() if device_only else ("-cudart", "shared", "-std=c++17")), "-o", str(out),
           str(PROGRAMS / source), *flags]
    if nccl:
        assert NCCL_WHEEL is not None
        cmd += ["-I", str(NCCL_WHEEL / "include"), "-L", str(NCCL_WHEEL / "lib"), "-l:libnccl.so.2"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}"
    return out


def _programs_key(jobs: dict) -> str:
    """Hash of the program sources, the build recipes and the nvcc version."""
    digest = hashlib.sha256()
    for path in sorted(PROGRAMS.iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(repr(sorted(jobs.items())).encode())
    digest.update(subprocess.run(["nvcc", "--version"], capture_output=True, text=True).stdout.encode())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
@with_build_lock  # one worker compiles, the others reuse (tests/conftest.py)
def programs(emulator: Path) -> dict[str, Path]:
    """Compiles the test programs (two nvcc at a time: the machine has 2 cores).

    The binaries do not depend on the emulator, so they are kept in
    emulator/build/test-programs/<hash of sources and recipes>/ and reused
    while nothing they are built from changes.
    """
    jobs = {
        "cudart_basic": ("cudart_basic.cu", (), False),
        # The same program with other fatbinary encodings: cubins compressed
        # with zstd and with LZ4, PTX only, and relocatable device code.
        "cudart_basic_zstd": ("cudart_basic.cu", ("--compress-mode=size",), False),
        "cudart_basic_lz4": ("cudart_basic.cu", ("--compress-mode=speed", "-Xfatbin", "-compress-all"), False),
        "cudart_basic_ptx": ("cudart_basic.cu", ("-gencode", "arch=compute_80,code=compute_80"), False),
        "cudart_basic_rdc": ("cudart_basic.cu", ("-rdc=true",), False),
        "streams": ("streams.cu", (), False),
        "streams_ptds": ("streams.cu", ("--default-stream", "per-thread"), False),
        "nccl_ranks": ("nccl_ranks.cu", (), True),
        "graphs": ("graphs.cu", (), False),
        # Device code for cudaLibraryLoadFromFile, in the three forms it accepts.
        "library.fatbin": ("library_kernels.cu", ("-fatbin",), False),
        "library.cubin": ("library_kernels.cu", ("-cubin", "-arch=sm_80"), False),
        "library.ptx": ("library_kernels.cu", ("-ptx",), False),
    }
    cache = BUILD / "test-programs"
    final = cache / _programs_key(jobs)
    if not (final / "complete").exists():
        # Build in a private directory and rename it into place, so that two
        # test sessions running at once never see a half-built set.
        work = cache / f"{final.name}.tmp-{os.getpid()}"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
            futures = [pool.submit(_nvcc, work / name, src, *flags, nccl=nccl)
                       for name, (src, flags, nccl) in jobs.items()]
            for fut in futures:
                fut.result()
        proc = subprocess.run(
            ["gcc", "-shared", "-fPIC", "-I", str(CUDA_HOME / "include"), "-o", str(work / "twins_lib.so"),
             str(PROGRAMS / "twins_lib.c")],
            capture_output=True,
            text=True,
        )
        assert proc.returncode == 0, proc.stderr
        (work / "complete").touch()
        try:
            work.rename(final)
        except OSError:                     # another session got there first
            shutil.rmtree(work, ignore_errors=True)
        for stale in cache.iterdir():       # sets built from older sources
            if stale != final and ".tmp-" not in stale.name:
                shutil.rmtree(stale, ignore_errors=True)
    built = {name: final / name for name in jobs}
    built["twins_lib"] = final / "twins_lib.so"
    return built


# ---- running -------------------------------------------------------------------


def _env(extra: dict[str, str] | None = None, emulated: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in EMULATOR_ENV and k != "LD_LIBRARY_PATH"}
    if emulated:
        env["LD_LIBRARY_PATH"] = str(BUILD)
    env.update(extra or {})
    return env


def run(binary: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 30, emulated: bool = True):
    return subprocess.run(
        [str(binary), *args], env=_env(env, emulated), capture_output=True, text=True, timeout=timeout
    )


def ok(proc: subprocess.CompletedProcess, marker: str) -> None:
    assert proc.returncode == 0 and marker in proc.stdout, (
        f"exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )


def run_ranks(binary: Path, cmd: str, world: int, tmp_path: Path, env: dict[str, str] | None = None,
              ranks: list[int] | None = None, timeout: float = 60) -> list[subprocess.CompletedProcess]:
    """Starts one process per rank with RANK/WORLD_SIZE; rank 0 publishes the ncclUniqueId in a file."""
    id_file = tmp_path / f"nccl-id-{cmd}-{time.monotonic_ns()}"
    procs = []
    for rank in ranks if ranks is not None else range(world):
        extra = {"RANK": str(rank), "WORLD_SIZE": str(world), "JITCKPT_TEST_ID_FILE": str(id_file), **(env or {})}
        procs.append(
            subprocess.Popen([str(binary), cmd], env=_env(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        )
    results = []
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return results


def shm_segments() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("jitckpt-nccl-*")}


# ---- ELF facts -----------------------------------------------------------------


def dyn_symbols(path: Path) -> list[tuple[str, str | None, bool]]:
    """(name, version or None, defined) for every dynamic symbol, from readelf."""
    out = subprocess.run(["readelf", "--dyn-syms", "-W", str(path)], capture_output=True, text=True, check=True).stdout
    result = []
    for line in out.splitlines():
        fields = line.split()
        if len(fields) < 8 or not fields[0].rstrip(":").isdigit():
            continue
        name, ndx = fields[7], fields[6]
        if not name or ndx == "ABS":        # ABS entries name the version nodes themselves
            continue
        base, _, version = name.partition("@")
        result.append((base, version.lstrip("@") or None, ndx != "UND"))
    return result


def exports(path: Path) -> dict[str, str | None]:
    return {name: version for name, version, defined in dyn_symbols(path) if defined}


def imports(path: Path) -> dict[str, str | None]:
    return {name: version for name, version, defined in dyn_symbols(path) if not defined}


def version_definitions(path: Path) -> list[str]:
    """Names of the version nodes a library defines (empty if none)."""
    out = subprocess.run(["readelf", "-V", "-W", str(path)], capture_output=True, text=True, check=True).stdout
    section = out.split("Version definition section", 1)
    if len(section) == 1:
        return []
    body = section[1].split("Version needs section", 1)[0]
    return re.findall(r"Name: (\S+)", body)


# ---- ABI: sonames, versions, imports ----------------------------------------------


def test_libraries_have_the_real_sonames(emulator):
    for lib, soname in (("libcudart.so.13", "libcudart.so.13"), ("libnccl.so.2", "libnccl.so.2")):
        out = subprocess.run(["readelf", "-d", str(emulator / lib)], capture_output=True, text=True, check=True).stdout
        assert f"Library soname: [{soname}]" in out


def test_cudart_version_nodes_match_the_real_library(emulator):
    real = version_definitions(REAL_CUDART)
    ours = version_definitions(emulator / "libcudart.so.13")
    assert real == ["libcudart.so.13", "libcudart.so.13"], real     # base node + one version node
    assert ours[:2] == real, ours
    assert set(ours[2:]) == {"JITCKPT_SIMDEV_1"}                     # the private node for our NCCL
    real_exports = exports(REAL_CUDART)
    ours_exports = exports(emulator / "libcudart.so.13")
    cuda = {n: v for n, v in ours_exports.items() if n.startswith(("cuda", "__cuda"))}
    assert len(cuda) > 100
    for name, version in cuda.items():
        assert name in real_exports, f"{name} is not a symbol of the real libcudart.so.13"
        assert version == real_exports[name] == "libcudart.so.13", (name, version, real_exports[name])
    private = {n for n in ours_exports if not n.startswith(("cuda", "__cuda"))}
    assert private and all(n.startswith("jitckpt_simdev_") and ours_exports[n] == "JITCKPT_SIMDEV_1" for n in private)


def test_nccl_symbols_are_unversioned_like_the_real_library(emulator):
    assert NCCL_WHEEL is not None
    real_lib = NCCL_WHEEL / "lib" / "libnccl.so.2"
    assert version_definitions(real_lib) == []
    assert version_definitions(emulator / "libnccl.so.2") == []
    real_exports = exports(real_lib)
    ours = exports(emulator / "libnccl.so.2")
    assert {"ncclAllReduce", "ncclCommInitRank", "ncclSend", "pncclAllReduce"} <= set(ours)
    for name, version in ours.items():
        assert version is None, (name, version)
        assert name in real_exports, f"{name} is not a symbol of the real libnccl.so.2"
    # NCCL reaches the device only through the private interface, never the
    # public cuda* functions an interposer would see.
    assert not [n for n in imports(emulator / "libnccl.so.2") if n.startswith("cuda")]


def test_nvcc13_emits_the_hidden_entry_points_the_emulator_exports(emulator, programs):
    needed = {n for n, v in imports(programs["cudart_basic"]).items() if n.startswith("__cuda")}
    assert needed == NVCC13_HIDDEN, needed
    ptds = {n for n in imports(programs["streams_ptds"]) if n.startswith("__cuda")}
    assert "__cudaLaunchKernel_ptsz" in ptds
    ours = exports(emulator / "libcudart.so.13")
    assert needed | ptds <= set(ours)


@pytest.mark.parametrize("name", ["cudart_basic", "streams", "streams_ptds", "nccl_ranks"])
def test_every_versioned_import_is_satisfied_by_the_emulator(emulator, programs, name):
    binary = programs[name]
    cudart = exports(emulator / "libcudart.so.13")
    nccl = exports(emulator / "libnccl.so.2")
    for symbol, version in imports(binary).items():
        if symbol.startswith(("cuda", "__cuda")):
            assert version == "libcudart.so.13", (symbol, version)
            assert cudart.get(symbol) == version, f"{symbol}@{version} is not exported by the emulator"
        elif symbol.startswith("nccl"):
            assert version is None and symbol in nccl, symbol
    # The dynamic linker resolves both sonames to emulator/build.
    trace = run(binary, env={"LD_TRACE_LOADED_OBJECTS": "1"})
    assert f"libcudart.so.13 => {BUILD}/libcudart.so.13" in trace.stdout, trace.stdout
    if name == "nccl_ranks":
        assert f"libnccl.so.2 => {BUILD}/libnccl.so.2" in trace.stdout, trace.stdout


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this host has a GPU: the real runtime would work")
def test_the_same_binary_fails_on_the_real_runtime_without_a_gpu(programs):
    proc = run(programs["cudart_basic"], "saxpy", emulated=False)
    assert proc.returncode != 0 and "OK" not in proc.stdout


# ---- devices, memory, kernels ----------------------------------------------------


def test_device_management_honours_the_device_count_and_memory(programs):
    proc = run(programs["cudart_basic"], "devices", env={"JITCKPT_SIMDEV_DEVICES": "3", "JITCKPT_SIMDEV_MEMORY": "1G"})
    ok(proc, "OK devices")
    assert "count 3" in proc.stdout
    assert f"total {1 << 30}" in proc.stdout


def test_cuda_visible_devices_selects_and_orders_emulated_devices(programs):
    proc = run(programs["cudart_basic"], "devices", env={"JITCKPT_SIMDEV_DEVICES": "3", "CUDA_VISIBLE_DEVICES": "2,0"})
    ok(proc, "OK devices")
    assert "count 2" in proc.stdout
    assert re.search(r"device 0 name=jitckpt simulated GPU 2 .*\ndevice 1 name=jitckpt simulated GPU 0", proc.stdout)


def test_zero_devices_means_no_device(programs):
    proc = run(programs["cudart_basic"], "devices", env={"JITCKPT_SIMDEV_DEVICES": "0"})
    assert proc.returncode == 1 and "cudaErrorNoDevice" in proc.stderr


def test_saxpy_kernel_matches_host_reference(programs):
    proc = run(programs["cudart_basic"], "saxpy")
    ok(proc, "OK saxpy")
    assert "kernel name _Z5saxpyifPKfPf" in proc.stdout


def test_block_reduction_with_shared_memory_matches_host_reference(programs):
    ok(run(programs["cudart_basic"], "reduce"), "OK reduce")


def test_device_variables_start_with_their_initialisers_and_copy_to_and_from_symbols(programs):
    ok(run(programs["cudart_basic"], "symbols"), "OK symbols")


def test_memcpy_and_memset_sync_async_and_2d(programs):
    ok(run(programs["cudart_basic"], "memcpy"), "OK memcpy")


def test_async_copies_with_pageable_memory_stage_the_source_and_wait_for_the_destination(programs):
    ok(run(programs["cudart_basic"], "staging"), "OK staging")


def test_invalid_pointers_configurations_and_handles_are_rejected(programs):
    ok(run(programs["cudart_basic"], "validation"), "OK validation")


def test_device_reset_frees_memory_and_invalidates_streams_and_events(programs):
    ok(run(programs["cudart_basic"], "reset"), "OK reset")


def test_missing_twin_is_a_clear_error_naming_the_expected_symbol(programs):
    proc = run(programs["cudart_basic"], "missing_twin")
    ok(proc, "OK missing_twin")
    assert "launch result cudaErrorInvalidDeviceFunction" in proc.stdout
    assert "no host twin for kernel _Z14no_twin_kernelPi" in proc.stderr
    assert '_Z14no_twin_kernelPi__host(dim3 grid, dim3 block, size_t shared_mem, void **args)' in proc.stderr


def test_twins_from_a_library_named_in_jitckpt_simdev_kernels(programs):
    without = run(programs["cudart_basic"], "external_twin")
    assert without.returncode == 3 and "_Z9ext_scalePffi__host" in without.stderr
    ok(run(programs["cudart_basic"], "external_twin", env={"JITCKPT_SIMDEV_KERNELS": str(programs["twins_lib"])}),
       "OK external_twin")


def test_a_missing_kernels_library_is_reported(programs):
    proc = run(programs["cudart_basic"], "saxpy", env={"JITCKPT_SIMDEV_KERNELS": "/nonexistent/twins.so"})
    ok(proc, "OK saxpy")                 # the twin in the program is still found
    assert "cannot load /nonexistent/twins.so" in proc.stderr


@pytest.mark.parametrize("form", ["fatbin", "cubin", "ptx"])
def test_device_code_loaded_at_run_time_launches_by_name(programs, form):
    env = {"JITCKPT_SIMDEV_KERNELS": str(programs["twins_lib"])}
    ok(run(programs["cudart_basic"], "library", str(programs[f"library.{form}"]), env=env), "OK library")


@pytest.mark.parametrize(
    "variant,commands",
    [
        ("cudart_basic_zstd", ["saxpy", "reduce", "symbols"]),
        ("cudart_basic_lz4", ["saxpy", "reduce", "symbols"]),
        ("cudart_basic_ptx", ["saxpy", "reduce"]),
        ("cudart_basic_rdc", ["saxpy", "reduce", "symbols"]),
    ],
)
def test_kernel_parameters_are_read_from_every_fatbinary_encoding(programs, variant, commands):
    for command in commands:
        ok(run(programs[variant], command), f"OK {command}")


# ---- streams and events -----------------------------------------------------------


@pytest.mark.parametrize("build", ["streams", "streams_ptds"])
def test_many_async_operations_run_in_issue_order(programs, build):
    ok(run(programs[build], "ordering"), "OK ordering")


@pytest.mark.parametrize("build", ["streams", "streams_ptds"])
def test_event_query_elapsed_time_and_cross_stream_waits(programs, build):
    proc = run(programs[build], "events")
    ok(proc, "OK events")


def test_legacy_default_stream_synchronises_with_blocking_streams(programs):
    ok(run(programs["streams"], "legacy"), "OK legacy")


def test_non_blocking_streams_do_not_synchronise_with_the_legacy_stream(programs):
    ok(run(programs["streams"], "nonblocking"), "OK nonblocking")


def test_default_stream_is_per_thread_only_when_built_so(programs):
    legacy = run(programs["streams"], "per_thread")
    ok(legacy, "OK per_thread")
    assert "legacy default stream" in legacy.stdout
    per_thread = run(programs["streams_ptds"], "per_thread")
    ok(per_thread, "OK per_thread")
    assert "per-thread default stream" in per_thread.stdout
    assert "cudaMemcpyAsync_ptsz" in imports(programs["streams_ptds"])


def test_stream_ordered_allocation_and_callbacks(programs):
    ok(run(programs["streams"], "async_alloc"), "OK async_alloc")


# ---- fault injection (CUDA) ---------------------------------------------------------


def test_sticky_fault_fails_this_and_every_later_call(programs):
    proc = run(programs["streams"], "fault_sticky", env={"JITCKPT_SIMDEV_FAULT": "op=cudaLaunchKernel,call=2,kind=sticky"})
    ok(proc, "OK fault_sticky")
    assert "injecting fault kind=sticky at cudaLaunchKernel call 2" in proc.stderr


def test_lost_device_fault_fails_everything_after_it(programs):
    proc = run(programs["streams"], "fault_lost", env={"JITCKPT_SIMDEV_FAULT": "op=cudaMemcpyAsync,call=1,kind=lost"})
    ok(proc, "OK fault_lost")


def test_hang_fault_stalls_the_stream_but_not_the_host(programs):
    start = time.monotonic()
    proc = run(programs["streams"], "fault_hang", env={"JITCKPT_SIMDEV_FAULT": "op=cudaMemcpyAsync,call=2,kind=hang"})
    ok(proc, "OK fault_hang")
    assert time.monotonic() - start < 20       # and the process could still exit


def test_slow_fault_delays_the_kernel_on_its_stream(programs):
    proc = run(programs["streams"], "fault_slow", env={"JITCKPT_SIMDEV_FAULT": "op=_Z4spinx,kind=slow,delay_ms=300"})
    ok(proc, "OK fault_slow")


def test_fault_on_another_rank_does_not_fire(programs):
    proc = run(
        programs["streams"], "ordering",
        env={"JITCKPT_SIMDEV_FAULT": "rank=1,op=cudaLaunchKernel,call=1+,kind=sticky", "RANK": "0"},
    )
    ok(proc, "OK ordering")


@pytest.mark.parametrize(
    "spec,message",
    [
        ("op=cudaMalloc,kind=explode", "unknown kind 'explode'"),
        ("kind=hang", "op and kind are required"),
        ("op=cudaMalloc,kind=hang,call=zero", "call=zero is not a number"),
        ("op=cudaMalloc,kind=hang,when=now", "unknown key 'when'"),
    ],
)
def test_malformed_fault_spec_stops_the_program_with_the_syntax(programs, spec, message):
    proc = run(programs["cudart_basic"], "saxpy", env={"JITCKPT_SIMDEV_FAULT": spec})
    assert proc.returncode == 2 and message in proc.stderr and "syntax:" in proc.stderr, proc.stderr


# ---- NCCL -------------------------------------------------------------------------------


@pytest.mark.serial  # counts every /dev/shm/jitckpt-nccl-* segment, also those of other tests' jobs
@pytest.mark.parametrize("world,chunk", [(1, None), (2, None), (3, None), (4, "4096")])
def test_nccl_collectives_and_grouped_send_recv_match_host_reference(programs, tmp_path, world, chunk):
    before = shm_segments()
    env = {"JITCKPT_SIMDEV_NCCL_CHUNK": chunk} if chunk else {}
    if world == 4:
        env["P2P_COUNT"] = "700000"          # still bigger than the 1 MiB ring buffer
    results = run_ranks(programs["nccl_ranks"], "collectives", world, tmp_path, env=env)
    for rank, proc in enumerate(results):
        ok(proc, f"OK collectives rank {rank}")
    assert not (shm_segments() - before), "the shared-memory segment was not unlinked"


def test_nccl_results_are_bitwise_deterministic_across_ranks_and_runs(programs, tmp_path):
    hashes = set()
    for _ in range(2):
        for proc in run_ranks(programs["nccl_ranks"], "determinism", 3, tmp_path):
            assert proc.returncode == 0, proc.stderr
            hashes.add(re.search(r"HASH (\w+)", proc.stdout).group(1))
    assert len(hashes) == 1, hashes


def test_nccl_hang_fault_stalls_every_rank_until_abort(programs, tmp_path):
    env = {"JITCKPT_SIMDEV_FAULT": "rank=1,op=ncclAllReduce,call=3,kind=hang"}
    results = run_ranks(programs["nccl_ranks"], "hang", 3, tmp_path, env=env)
    for rank, proc in enumerate(results):
        ok(proc, f"NOT_READY_OK rank {rank}")
        assert f"ABORT_RELEASED rank {rank}" in proc.stdout
    assert "injecting fault kind=hang at ncclAllReduce call 3 (rank 1)" in results[1].stderr


def test_nccl_dead_peer_becomes_remote_error_while_the_stream_stays_stuck(programs, tmp_path):
    results = run_ranks(programs["nccl_ranks"], "peer_exit", 3, tmp_path)
    for rank in (0, 1):
        ok(results[rank], f"OK peer_exit rank {rank}")
        assert "peer rank 2" in results[rank].stderr
    assert "EXITING rank 2" in results[2].stdout


@pytest.mark.parametrize("kind", ["sticky", "lost"])
def test_nccl_sticky_and_lost_faults(programs, tmp_path, kind):
    env = {"JITCKPT_SIMDEV_FAULT": f"op=ncclAllReduce,call=2,kind={kind}"}
    results = run_ranks(programs["nccl_ranks"], kind, 2, tmp_path, env=env)
    for rank, proc in enumerate(results):
        ok(proc, f"OK fault rank {rank}")


def test_nccl_mismatched_collectives_are_reported_on_every_rank(programs, tmp_path):
    results = run_ranks(programs["nccl_ranks"], "mismatch", 2, tmp_path)
    for proc in results:
        assert proc.returncode == 0, proc.stderr
        assert "ASYNC invalid usage" in proc.stdout
        assert "collective mismatch" in proc.stderr


def test_nccl_nonblocking_init(programs, tmp_path):
    for rank, proc in enumerate(run_ranks(programs["nccl_ranks"], "nonblocking", 3, tmp_path)):
        ok(proc, f"OK nonblocking rank {rank}")


def test_nccl_bad_arguments_get_clear_errors(programs, tmp_path):
    (proc,) = run_ranks(programs["nccl_ranks"], "bad_args", 1, tmp_path)
    ok(proc, "OK bad_args")
    assert "is not memory of the emulated device" in proc.stderr


def test_nccl_comm_init_all_in_one_process_over_two_devices(programs):
    ok(run(programs["nccl_ranks"], "initall", env={"JITCKPT_SIMDEV_DEVICES": "2"}), "OK initall")


@pytest.mark.serial  # counts every /dev/shm/jitckpt-nccl-* segment, also those of other tests' jobs
def test_nccl_init_times_out_when_a_rank_never_joins(programs, tmp_path):
    before = shm_segments()
    (proc,) = run_ranks(
        programs["nccl_ranks"], "collectives", 2, tmp_path, env={"JITCKPT_SIMDEV_NCCL_TIMEOUT": "1"}, ranks=[0]
    )
    assert proc.returncode == 1
    assert "ranks [1] of 2 never joined" in proc.stderr
    assert not (shm_segments() - before)


# ---- stream capture and graphs ---------------------------------------------------


def test_stream_capture_records_without_running_and_the_graph_runs_at_each_launch(programs):
    """Fork/join across two streams inside a capture; nothing runs until cudaGraphLaunch."""
    proc = run(programs["graphs"], "capture")
    ok(proc, "OK capture")
    assert "CAPTURED nothing ran" in proc.stdout and "LAUNCHED 3 times ok" in proc.stdout


def test_querying_an_event_recorded_in_a_capture_fails_and_invalidates_it(programs):
    """What a watchdog thread must never do during capture (a GPU forbids it too): cudaErrorCapturedEvent."""
    ok(run(programs["graphs"], "captured_event"), "OK captured_event")


def test_stream_capture_rules(programs):
    """Legacy stream, synchronisation, isolation, wrong thread, relaxed mode, the thread's capture mode."""
    ok(run(programs["graphs"], "rules"), "OK rules")


def test_nccl_all_reduce_captured_in_a_graph_runs_at_every_launch(programs, tmp_path):
    results = run_ranks(programs["nccl_ranks"], "graph", 2, tmp_path)
    for rank, r in enumerate(results):
        ok(r, f"OK graph rank {rank}")
