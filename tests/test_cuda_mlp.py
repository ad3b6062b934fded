"""The data-parallel CUDA C++ example (``examples/cuda_mlp/``) on the CPU device emulator.

The program is ordinary CUDA C++ with NCCL, built with ``nvcc -cudart shared``
against the real CUDA runtime and the real NCCL; the tests run the unchanged
binary with ``LD_LIBRARY_PATH=emulator/build`` (and, for several ranks, under
``torchrun --no-python``), so it binds to the emulator instead.

Verified here, on the emulator:

- the kernels' math, as run by their host twins, against an independent
  numpy implementation (``reference_train`` below): equal bit for bit, for one
  rank and for 2 and 4 data-parallel ranks, because every operation is an
  exactly rounded IEEE operation in a fixed order and the emulator's NCCL sums
  ranks in rank order;
- all ranks end with the same parameters, the loss falls, and runs repeat
  bit for bit, also with the legacy default stream as compute stream and the
  file rendezvous;
- a hung all-reduce on one rank (an injected fault) stalls every rank at that
  step's all-reduce, and the job never finishes.

Only a GPU can confirm that nvcc's device code of the same kernels computes
the same thing (see examples/cuda_mlp/README.md).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from native_toolchain import EMULATOR, EMULATOR_BUILD, EMULATOR_ENV, ROOT

EXAMPLE = ROOT / "examples" / "cuda_mlp"
BINARY = EXAMPLE / "build" / "mlp"
TWINS_LIB = EXAMPLE / "build" / "libmlp_twins.so"

# Cleared for every run, so that the caller's environment cannot change a
# test's meaning (emulator settings, and a torchrun environment around pytest).
CLEARED_ENV = (
    *EMULATOR_ENV,
    "LD_LIBRARY_PATH",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
)

STEPS = 200
TWIN_NAMES = [f"mlp_{k}__host" for k in
              ("forward_hidden", "forward_output", "backward_output", "backward_delta", "backward_hidden", "adam")]

pytestmark = [
    pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc (CUDA 13 toolkit) is not installed"),
    pytest.mark.skipif(importlib.util.find_spec("nvidia.nccl") is None,
                       reason="nccl.h not found: pip install nvidia-nccl-cu13"),
]


# ---- the reference: the same math in numpy, float32, in the kernels' order ------

IN, HIDDEN = 32, 64
KW1, KB1 = 0, HIDDEN * IN
KW2 = KB1 + HIDDEN
KB2 = KW2 + HIDDEN
NPARAMS = KB2 + 1
f32 = np.float32


def _splitmix64(z):
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _uniform(seed: int, stream: int, index) -> np.ndarray:
    """U[-1, 1) in multiples of 2^-23, as mlp::uniform."""
    with np.errstate(over="ignore"):
        key = _splitmix64(np.uint64(seed) + _splitmix64(np.uint64(stream)))
        h = _splitmix64(key + np.asarray(index, dtype=np.uint64))
    return ((h >> np.uint64(40)).astype(np.int64) - (1 << 23)).astype(f32) * f32(1.0 / 8388608.0)


def _softsign(z: np.ndarray) -> np.ndarray:
    return z / (f32(1) + np.abs(z))


def _init_params(seed: int) -> np.ndarray:
    u = _uniform(seed, 1, np.arange(NPARAMS))
    scale = np.where(np.arange(NPARAMS) < KW2, f32(1.0 / np.sqrt(IN)), f32(1.0 / np.sqrt(HIDDEN)))
    return (u * scale.astype(f32)).astype(f32)


def _samples(seed: int, first: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    g = np.arange(first, first + n, dtype=np.uint64)
    x = _uniform(seed, 3, g[:, None] * np.uint64(IN) + np.arange(IN, dtype=np.uint64)[None, :])
    teacher = _uniform(seed, 2, np.arange(IN)) * f32(0.5)
    t = np.zeros(n, f32)
    for k in range(IN):
        t = t + teacher[k] * x[:, k]
    return x, _softsign(t) + (f32(0.25) * x[:, 0]) * x[:, 1]


def _rank_gradient(p: np.ndarray, x: np.ndarray, y: np.ndarray, inv_n: np.float32) -> np.ndarray:
    """One rank's gradient (and loss share in the last slot), summed in the kernels' order."""
    batch = x.shape[0]
    w1, b1, w2, b2 = p[KW1:KB1].reshape(HIDDEN, IN), p[KB1:KW2], p[KW2:KB2], p[KB2]
    z = np.broadcast_to(b1, (batch, HIDDEN)).copy()
    for k in range(IN):
        z = z + w1[:, k][None, :] * x[:, k][:, None]
    act = _softsign(z)
    out = np.full(batch, b2, f32)
    for j in range(HIDDEN):
        out = out + w2[j] * act[:, j]
    err = out - y
    coef = (f32(2) * err) * inv_n
    g_w2, g_b2, loss = np.zeros(HIDDEN, f32), f32(0), f32(0)
    for b in range(batch):
        g_w2 = g_w2 + coef[b] * act[b]
        g_b2 = f32(g_b2 + coef[b])
        loss = f32(loss + err[b] * err[b])
    s = f32(1) - np.abs(act)
    delta = (coef[:, None] * w2[None, :]) * (s * s)
    g_w1, g_b1 = np.zeros((HIDDEN, IN), f32), np.zeros(HIDDEN, f32)
    for b in range(batch):
        g_w1 = g_w1 + delta[b][:, None] * x[b][None, :]
        g_b1 = g_b1 + delta[b]
    return np.concatenate([g_w1.ravel(), g_b1, g_w2, [g_b2], [f32(loss * inv_n)]]).astype(f32)


def reference_train(steps: int, world: int, seed: int = 1, batch: int = 32, lr: float = 0.01):
    """Final parameters and per-step losses of ``mlp --steps steps`` with ``world`` ranks."""
    p = _init_params(seed)
    m, v = np.zeros(NPARAMS, f32), np.zeros(NPARAMS, f32)
    inv_n = f32(1.0 / (batch * world))
    lr32, beta1, beta2, eps = f32(lr), f32(0.9), f32(0.999), f32(1e-8)
    losses = []
    for step in range(1, steps + 1):
        total = None
        for rank in range(world):        # the all-reduce: ranks summed in rank order
            x, y = _samples(seed, ((step - 1) * world + rank) * batch, batch)
            g = _rank_gradient(p, x, y, inv_n)
            total = g if total is None else total + g
        losses.append(float(total[NPARAMS]))
        g = total[:NPARAMS]
        bias1, bias2 = f32(1.0 - float(beta1) ** step), f32(1.0 - float(beta2) ** step)
        m = beta1 * m + (f32(1) - beta1) * g
        v = beta2 * v + (f32(1) - beta2) * (g * g)
        p = p - (lr32 * (m / bias1)) / (np.sqrt(v / bias2) + eps)
    return p, losses


def fnv1a64(data: bytes) -> str:
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


# ---- building and running -----------------------------------------------------


@pytest.fixture(scope="session")
def binary() -> Path:
    """Builds the emulator (make is a no-op when it is up to date) and the example."""
    for target in (EMULATOR, EXAMPLE):
        proc = subprocess.run(["make", "-C", str(target), "-j2"], capture_output=True, text=True)
        assert proc.returncode == 0, f"make -C {target} failed:\n{proc.stdout}\n{proc.stderr}"
    assert (EMULATOR_BUILD / "libcudart.so.13").exists() and (EMULATOR_BUILD / "libnccl.so.2").exists()
    assert BINARY.exists() and TWINS_LIB.exists()
    return BINARY


def _env(extra: dict[str, str] | None = None, emulated: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEARED_ENV and not k.startswith("TORCHELASTIC_")}
    if emulated:
        env["LD_LIBRARY_PATH"] = str(EMULATOR_BUILD)
    env.update(extra or {})
    return env


def run_direct(*args: str, env: dict[str, str] | None = None, timeout: float = 30,
               emulated: bool = True) -> subprocess.CompletedProcess:
    """One process, without torchrun (a single rank unless env says otherwise)."""
    return subprocess.run([str(BINARY), *args], env=_env(env, emulated), capture_output=True, text=True,
                          timeout=timeout)


def torchrun_cmd(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--no-python",
            "--nproc_per_node", str(nproc), str(BINARY), *args]


def checksums(output: str) -> dict[int, str]:
    found = re.findall(r"^\[rank (\d+)\] final parameters checksum ([0-9a-f]{16})$", output, re.M)
    result: dict[int, str] = {}
    for rank, digest in found:
        assert int(rank) not in result, f"rank {rank} printed two checksums"
        result[int(rank)] = digest
    return result


def losses(output: str) -> dict[int, float]:
    return {int(s): float(v) for s, v in re.findall(r"^\[rank 0\] step (\d+) loss (\S+)$", output, re.M)}


def show(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-4000:]}"


# ---- the build ---------------------------------------------------------------------


def test_binary_uses_cudart_shared_and_nccl_and_carries_its_twins(binary):
    dyn = subprocess.run(["readelf", "-d", "--dyn-syms", "-W", str(binary)], capture_output=True, text=True,
                         check=True).stdout
    assert "Shared library: [libcudart.so.13]" in dyn and "Shared library: [libnccl.so.2]" in dyn
    # The Figure 3 calls, bound to the runtime's versioned symbols, and NCCL's unversioned ones.
    for name in ("cudaEventRecord", "cudaStreamWaitEvent", "cudaEventQuery", "cudaMemcpyAsync",
                 "__cudaLaunchKernel"):
        assert re.search(rf"UND {name}@libcudart\.so\.13\b", dyn), name
    for name in ("ncclAllReduce", "ncclBroadcast", "ncclCommInitRank", "ncclCommGetAsyncError"):
        assert re.search(rf"UND {name}$", dyn, re.M), name
    # Twins: in the program's symbol table (found with no special link flags),
    # and exported by the stand-alone library for JITCKPT_SIMDEV_KERNELS.
    symtab = subprocess.run(["nm", str(binary)], capture_output=True, text=True, check=True).stdout
    lib = subprocess.run(["nm", "-D", "--defined-only", str(TWINS_LIB)], capture_output=True, text=True,
                         check=True).stdout
    for twin in TWIN_NAMES:
        assert re.search(rf" T {twin}$", symtab, re.M), twin
        assert re.search(rf" T {twin}$", lib, re.M), twin
    trace = run_direct(env={"LD_TRACE_LOADED_OBJECTS": "1"})
    assert f"libcudart.so.13 => {EMULATOR_BUILD}/libcudart.so.13" in trace.stdout, trace.stdout
    assert f"libnccl.so.2 => {EMULATOR_BUILD}/libnccl.so.2" in trace.stdout, trace.stdout


@pytest.mark.skipif(Path("/dev/nvidia0").exists(), reason="this host has a GPU: the real runtime would work")
def test_without_the_emulator_the_real_runtime_fails_with_a_clear_error(binary):
    trace = run_direct(env={"LD_TRACE_LOADED_OBJECTS": "1"}, emulated=False)
    if "not found" in trace.stdout:
        pytest.skip(f"the real CUDA runtime or NCCL is not on the library path:\n{trace.stdout}")
    proc = run_direct("--steps", "1", emulated=False)
    assert proc.returncode == 1, show(proc)
    assert re.search(r"mlp\[rank 0\]: error: mlp\.cu:\d+: cudaGetDeviceCount\(&ndev\) failed: cuda\w+", proc.stderr), \
        show(proc)


# ---- the math: one rank against numpy ------------------------------------------------


@pytest.fixture(scope="session")
def single_rank(binary, tmp_path_factory):
    out = tmp_path_factory.mktemp("single") / "params.bin"
    proc = run_direct("--steps", "40", "--log-every", "1", "--out", str(out))
    assert proc.returncode == 0, show(proc)
    return proc, np.fromfile(out, dtype=np.float32), reference_train(40, world=1)


def test_single_rank_kernels_match_the_numpy_reference_within_float_tolerance(single_rank):
    proc, params, (want, want_losses) = single_rank
    assert params.shape == (NPARAMS,)
    np.testing.assert_allclose(params, want, rtol=1e-5, atol=1e-6)
    got_losses = losses(proc.stdout)
    assert sorted(got_losses) == list(range(1, 41))
    np.testing.assert_allclose([got_losses[s] for s in range(1, 41)], want_losses, rtol=1e-6)


def test_single_rank_kernels_round_exactly_like_the_numpy_reference(single_rank):
    # Exact IEEE operations in the same order: the twins and numpy agree to
    # the bit (the Makefile turns FMA contraction off for this).
    proc, params, (want, _) = single_rank
    assert np.array_equal(params, want), f"max |diff| {np.abs(params - want).max()}"
    assert checksums(proc.stdout) == {0: fnv1a64(params.tobytes())}


@pytest.mark.skipif(shutil.which("strip") is None, reason="binutils' strip is not installed")
def test_a_stripped_binary_needs_and_finds_its_twins_in_a_jitckpt_simdev_kernels_library(single_rank, tmp_path):
    # Stripping removes the symbol table where the emulator finds the twins
    # linked into the program; build/libmlp_twins.so then supplies them (the
    # way a device proxy that lacks the program's code gets them).
    proc, _, _ = single_rank
    stripped = tmp_path / "mlp"
    shutil.copy2(BINARY, stripped)
    subprocess.run(["strip", str(stripped)], check=True)
    run = lambda env: subprocess.run([str(stripped), "--steps", "40", "--log-every", "0"], env=_env(env),
                                     capture_output=True, text=True, timeout=30)
    missing = run({})
    assert missing.returncode == 1, show(missing)
    assert "no host twin for kernel mlp_forward_hidden" in missing.stderr, show(missing)
    assert "launch of mlp_forward_hidden failed: cudaErrorInvalidDeviceFunction" in missing.stderr, show(missing)
    found = run({"JITCKPT_SIMDEV_KERNELS": str(TWINS_LIB)})
    assert found.returncode == 0, show(found)
    assert checksums(found.stdout) == checksums(proc.stdout)


# ---- data parallel under torchrun ------------------------------------------------------


# name: (world size, extra arguments); "4-again" repeats "4".
DP_JOBS = {"2": (2, []), "4": (4, []), "4-again": (4, [])}


@pytest.fixture(scope="session")
def dp_runs(binary, tmp_path_factory):
    """The torchrun jobs of DP_JOBS, all at once: (output, rank 0's final parameters, work dir) by name.

    They run concurrently to keep the suite short (each torchrun spends
    seconds importing torch); each picks its own MASTER_PORT.
    """
    started = {}
    for name, (world, extra) in DP_JOBS.items():
        work = tmp_path_factory.mktemp(f"dp{name}")
        args = ["--steps", str(STEPS), "--log-every", "20", "--out", str(work / "params.bin"),
                *(a.format(work=work) for a in extra)]
        proc = subprocess.Popen(torchrun_cmd(world, *args), env=_env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=work)
        started[name] = (proc, work)
    runs = {}
    try:
        for name, (proc, work) in started.items():
            out, err = proc.communicate(timeout=300)
            done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
            assert done.returncode == 0, f"job {name}: {show(done)}"
            runs[name] = (done, np.fromfile(work / "params.bin", dtype=np.float32), work)
    finally:
        for proc, _ in started.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return runs


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_all_ranks_end_with_identical_parameters_and_the_loss_falls(dp_runs, world):
    proc, params, _ = dp_runs[str(world)]
    sums = checksums(proc.stdout)
    assert sorted(sums) == list(range(world)), show(proc)
    assert len(set(sums.values())) == 1, sums
    assert sums[0] == fnv1a64(params.tobytes())          # rank 0's --out file is what it hashed
    curve = losses(proc.stdout)
    assert sorted(curve) == [1, *range(20, STEPS + 1, 20)], show(proc)
    assert curve[STEPS] < curve[1] / 10, curve
    assert curve[STEPS] < curve[STEPS // 2] < curve[1], curve


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_data_parallel_result_equals_the_numpy_reference(dp_runs, world):
    # The emulator's NCCL sums ranks in rank order, as reference_train does.
    _, params, _ = dp_runs[str(world)]
    want, _ = reference_train(STEPS, world=world)
    np.testing.assert_allclose(params, want, rtol=1e-5, atol=1e-6)
    assert np.array_equal(params, want), f"max |diff| {np.abs(params - want).max()}"


@pytest.mark.slow
def test_a_second_run_is_bit_identical(dp_runs):
    first, again = dp_runs["4"][0], dp_runs["4-again"][0]
    assert len(checksums(first.stdout)) == 4
    assert checksums(again.stdout) == checksums(first.stdout)


def launch_ranks(world: int, *args: str, env: dict[str, str] | None = None) -> list[subprocess.Popen]:
    """Starts the ranks without torchrun, with the environment torchrun would give them."""
    common = {"WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": str(_free_port() - 1), **(env or {})}
    return [subprocess.Popen([str(BINARY), *args],
                             env=_env({**common, "RANK": str(rank), "LOCAL_RANK": str(rank)}),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for rank in range(world)]


def finish(procs: list[subprocess.Popen], timeout: float = 60) -> list[subprocess.CompletedProcess]:
    results = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return results


def test_legacy_compute_stream_and_file_rendezvous_give_the_same_result(dp_runs, tmp_path):
    # Launched without torchrun: only the environment matters.
    rendezvous = tmp_path / "rendezvous"
    results = finish(launch_ranks(2, "--steps", str(STEPS), "--log-every", "20", "--compute-stream", "legacy",
                                  "--rendezvous-dir", str(rendezvous)))
    for proc in results:
        assert proc.returncode == 0, show(proc)
    assert "legacy compute stream" in results[0].stdout
    sums = {**checksums(results[0].stdout), **checksums(results[1].stdout)}
    assert sums == checksums(dp_runs["2"][0].stdout)
    assert list(rendezvous.iterdir()) == []              # rank 0 removed the id file once all had joined


# ---- rendezvous errors ------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_rendezvous_refuses_a_rank_of_another_job_with_a_clear_error(binary):
    port = _free_port()
    common = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port - 1),
              "TORCHELASTIC_RESTART_COUNT": "0"}
    args = [str(binary), "--steps", "1", "--rendezvous-timeout", "3"]
    rank0 = subprocess.Popen(args, env=_env({**common, "RANK": "0", "TORCHELASTIC_RUN_ID": "job-a"}),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        rank1 = run_direct(*args[1:], env={**common, "RANK": "1", "TORCHELASTIC_RUN_ID": "job-b"})
        out0, err0 = rank0.communicate(timeout=30)
    finally:
        rank0.kill()
    assert rank1.returncode == 1, show(rank1)
    assert "belongs to another job or attempt" in rank1.stderr and "run id job-b" in rank1.stderr, show(rank1)
    assert rank0.returncode == 1, err0
    assert "refused a peer claiming rank 1 of 2 from another job" in err0, err0
    assert "ranks 1 did not fetch the NCCL id" in err0, err0


def test_usage_errors_are_clear(binary, tmp_path):
    proc = run_direct("--steps", "1", env={"WORLD_SIZE": "2", "RANK": "1"})
    assert proc.returncode == 1 and "MASTER_ADDR is not set" in proc.stderr, show(proc)
    proc = run_direct("--rendezvous-dir", str(tmp_path), "--rendezvous-timeout", "0.3",
                      env={"WORLD_SIZE": "2", "RANK": "1"})
    assert proc.returncode == 1 and "did not appear within 0.3 s" in proc.stderr, show(proc)
    proc = run_direct("--stepz", "3")
    assert proc.returncode == 1 and "unknown option '--stepz'" in proc.stderr and "usage:" in proc.stderr
    proc = run_direct("--steps", "ten")
    assert proc.returncode == 1 and "bad value 'ten' for --steps" in proc.stderr


def test_a_dead_peer_becomes_a_clear_nccl_error_and_the_survivor_exits(binary, tmp_path):
    # Rank 1 hangs in its 5th all-reduce, then is killed: rank 0, stalled in
    # that all-reduce, sees ncclRemoteError from ncclCommGetAsyncError, aborts
    # its communicator and exits 1 instead of hanging forever.
    env = {"WORLD_SIZE": "2", "JITCKPT_SIMDEV_FAULT": "rank=1,op=ncclAllReduce,call=5,kind=hang"}
    args = [str(binary), "--steps", "50", "--stall-report", "0.5", "--rendezvous-dir", str(tmp_path / "rdv")]
    logs = [tmp_path / f"rank{r}.log" for r in range(2)]
    procs = []
    try:
        for rank in range(2):
            with logs[rank].open("w") as sink:
                procs.append(subprocess.Popen(args, env=_env({**env, "RANK": str(rank)}), stdout=sink,
                                              stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 30
        while "all-reduce of step 5 has not completed" not in logs[1].read_text():
            assert time.monotonic() < deadline and procs[1].poll() is None, logs[1].read_text()
            time.sleep(0.1)
        procs[1].kill()
        assert procs[0].wait(timeout=30) == 1, logs[0].read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    text = logs[0].read_text()
    assert re.search(r"mlp\[rank 0\]: error: NCCL reports remote process exited .*peer rank 1 .*exited.* "
                     r"aborting the communicator", text), text
    assert "final parameters checksum" not in text


# ---- an injected hang --------------------------------------------------------------------


def _proc_stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state, ppid, ...), or None if gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _descendants(pid: int) -> dict[int, str]:
    """Every live descendant of pid, with its start time (the workers run in sessions of their own)."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _proc_stat(int(entry.name))) is not None:
            children.setdefault(int(fields[1]), []).append((int(entry.name), fields[19]))
    found: dict[int, str] = {}
    todo = [pid]
    while todo:
        for child, start in children.get(todo.pop(), []):
            if child not in found:
                found[child] = start
                todo.append(child)
    return found


def _alive(pid: int, start: str) -> bool:
    """True while that very process (same pid and start time) exists and is not a zombie."""
    fields = _proc_stat(pid)
    return fields is not None and fields[19] == start and fields[0] != "Z"


@pytest.mark.slow
def test_a_hung_allreduce_on_one_rank_stalls_every_rank_and_the_job_never_finishes(binary, tmp_path):
    world = 4
    log = tmp_path / "job.log"
    env = _env({"JITCKPT_SIMDEV_FAULT": "rank=1,op=ncclAllReduce,call=5,kind=hang"})
    with log.open("w") as sink:
        # (the file rendezvous: MASTER_PORT + 1 of the TCP one can be taken on a busy machine)
        job = subprocess.Popen(torchrun_cmd(world, "--steps", "100", "--log-every", "1", "--stall-report", "1",
                                            "--rendezvous-dir", str(tmp_path / "rdv")),
                               env=env, stdout=sink, stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    workers: dict[int, str] = {}
    stalled = re.compile(r"mlp\[rank (\d)\]: stalled .* the all-reduce of step 5 has not completed")
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and job.poll() is None:
            workers.update(_descendants(job.pid))
            if len(set(stalled.findall(log.read_text()))) == world:
                break
            time.sleep(0.2)
        time.sleep(1.0)                                    # and they stay stuck
        text = log.read_text()
        assert job.poll() is None, f"the job ended (exit {job.returncode}):\n{text[-4000:]}"
        assert set(stalled.findall(text)) == {str(r) for r in range(world)}, text[-4000:]
        assert text.count("injecting fault kind=hang at ncclAllReduce call 5 (rank 1)") == 1, text[-4000:]
        assert max(losses(text)) == 4, text[-4000:]         # steps 1-4 completed, step 5 never does
        assert "final parameters checksum" not in text
    finally:
        workers.update(_descendants(job.pid))
        if job.poll() is None:
            job.send_signal(signal.SIGTERM)                # torchrun stops its workers
            try:
                job.wait(timeout=15)
            except subprocess.TimeoutExpired:
                job.kill()
                job.wait()
        for pid, start in workers.items():
            if _alive(pid, start):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid, start) for pid, start in workers.items()):
        time.sleep(0.1)
    assert len(workers) >= world
    assert not [pid for pid, start in workers.items() if _alive(pid, start)]
