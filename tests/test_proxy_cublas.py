"""cuBLAS through the device proxy (issue 19): forwarded at the library level, on the CPU device emulator.

Recovery: tests/proxy_programs/blas_train.cpp (3 ranks under torchrun, every computation a cuBLAS GEMM,
a created stream, a workspace, the optimizer's scalars in device memory) survives a hung all-reduce and a
sticky device error (a new proxy, the handles re-created, the replicas' memory, the minibatch replayed)
with final parameters bit-identical to a fault-free direct run, and replay validation at minibatch 5
finds the replayed cuBLAS calls faithful.

tests/emulator_programs/cublas_gemm.c (every GEMM variant the emulated
cuBLAS implements, both pointer modes, stream 0 and a created stream, and the
argument errors) must print the same bytes through ``jitckpt-proxy`` as
directly, and the same under ``jit-run --transparent --emulated-gpus 1``,
whose proxy loads the emulator's libcublas.so.13.  A cuBLAS handle is a
virtual handle: a proxy restart in the middle re-creates it under the same
id with its settings, and the program prints the same bytes.  Nothing here
says anything about a GPU.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from native_toolchain import (CUBLAS_INCLUDE, CUDA_HOME, REQUIRES_CUBLAS_HEADER, REQUIRES_CUBLASLT_HEADER,
                              REQUIRES_CUDA_TOOLCHAIN)
from test_emulator import emulator  # noqa: F401  (fixture)
from test_proxy import EMULATOR_BUILD, REMOTE_LIB, direct, env, proxy, remote, show  # noqa: F401
from test_proxy_recovery import CHECKSUM, assert_recovered, torchrun

pytestmark = [*REQUIRES_CUDA_TOOLCHAIN, REQUIRES_CUBLAS_HEADER]

SOURCE = REPO / "tests" / "emulator_programs" / "cublas_gemm.c"
TRAIN_SOURCE = REPO / "tests" / "proxy_programs" / "blas_train.cpp"
MLP_DIR = REPO / "examples" / "cuda_mlp"


@pytest.fixture(scope="module")
def gemm_program(proxy, tmp_path_factory) -> Path:  # noqa: F811
    """The test program, linked against the emulated libcublas.so.13 and libcudart.so.13."""
    assert (EMULATOR_BUILD / "libcublas.so.13").exists(), "make -C emulator built no libcublas.so.13"
    out = tmp_path_factory.mktemp("cublas") / "cublas_gemm"
    subprocess.run(["gcc", "-O1", "-ffp-contract=off", "-I", str(CUDA_HOME / "include"), "-I", str(CUBLAS_INCLUDE),
                    "-o", str(out), str(SOURCE), "-L", str(EMULATOR_BUILD), "-l:libcublas.so.13", "-l:libcudart.so.13",
                    "-lm"], check=True)
    return out


def test_the_remote_library_exports_every_cublas_function_the_emulator_implements(proxy):  # noqa: F811
    def defined(lib: Path) -> dict[str, str]:
        out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                             check=True).stdout
        return {line.split()[2].split("@")[0]: line.split()[2] for line in out.splitlines() if len(line.split()) == 3}

    emulated = {n for n in defined(EMULATOR_BUILD / "libcublas.so.13") if n.startswith("cublas")}
    exported = defined(REMOTE_LIB)
    assert emulated and not emulated - set(exported), sorted(emulated - set(exported))
    # under the real library's version node, so that a program built against libcublas.so.13 binds to them
    assert exported["cublasSgemm_v2"] == "cublasSgemm_v2@@libcublas.so.13"
    # and every other function of the header too, as a refusal (nothing reaches a cuBLAS in the worker)
    assert "cublasHgemm" in exported


@REQUIRES_CUBLASLT_HEADER
def test_the_remote_library_exports_cublaslt_under_its_own_version_node(proxy):  # noqa: F811
    """Every cuBLASLt function the emulator implements, and every other one of cublasLt.h as a refusal, under
    libcublasLt.so.13's node: PyTorch's references (cublasLtMatmul@libcublasLt.so.13) bind to the worker's."""
    def defined(lib: Path) -> dict[str, str]:
        out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True,
                             check=True).stdout
        return {line.split()[2].split("@")[0]: line.split()[2] for line in out.splitlines() if len(line.split()) == 3}

    emulated = {n for n in defined(EMULATOR_BUILD / "libcublasLt.so.13") if n.startswith("cublasLt")}
    exported = defined(REMOTE_LIB)
    assert emulated and not emulated - set(exported), sorted(emulated - set(exported))
    for name in ("cublasLtMatmul", "cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmulDescCreate",
                 "cublasLtMatrixTransform", "cublasLtGetVersion"):
        assert exported[name] == f"{name}@@libcublasLt.so.13", exported.get(name)


@pytest.mark.parametrize("what", ["gemm", "errors"])
def test_every_gemm_and_error_prints_the_same_through_the_proxy(gemm_program, tmp_path, what):
    want = direct(gemm_program, what)
    assert want.returncode == 0 and "DONE" in want.stdout, show(want)
    got = remote(gemm_program, what, tmp_path=tmp_path)
    assert got.returncode == 0, show(got)
    assert got.stdout == want.stdout, show(got)
    assert "is not supported in transparent mode" not in got.stderr, got.stderr
    if what == "gemm":  # bit-exact results: every variant's hash, pointer modes and streams included
        assert want.stdout.count("VARIANT ") >= 20 and " exact=0 pad=0" in want.stdout


@pytest.mark.parametrize("call", [25, 100, 220])
def test_a_proxy_restart_re_creates_the_cublas_handles_and_their_settings(gemm_program, tmp_path, call):
    """A driver-suspect restart before the program's Nth call (JITCKPT_REMOTE_RESTART_AT): the new proxy gets
    every handle back under its old id, with its stream, pointer mode, math mode and workspace
    (interpose/remote/blas.c); the program sees nothing and prints the same bytes."""
    want = direct(gemm_program, "all")
    got = remote(gemm_program, "all", tmp_path=tmp_path, extra={"JITCKPT_REMOTE_RESTART_AT": str(call)})
    assert got.returncode == 0 and got.stdout == want.stdout, show(got)
    assert "device proxy restarted (driver suspect)" in got.stderr and "refused" not in got.stderr, got.stderr


def test_jit_run_transparent_forwards_cublas_to_the_emulators_library(gemm_program):
    want = direct(gemm_program, "all")
    e = env()
    e.pop("LD_LIBRARY_PATH", None)  # --emulated-gpus says what the proxy loads
    e["LD_LIBRARY_PATH"] = str(EMULATOR_BUILD)  # (the program itself is linked against the emulator)
    got = subprocess.run([sys.executable, "-m", "jitckpt", "--transparent", "--emulated-gpus", "1",
                          str(gemm_program), "all"], env=e, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert got.returncode == 0, show(got)
    assert got.stdout == want.stdout, show(got)
    assert f"cuBLAS {EMULATOR_BUILD / 'libcublas.so.13'}" in got.stderr, got.stderr
    doctor = subprocess.run([sys.executable, "-m", "jitckpt", "doctor", "--json", str(gemm_program)], env=e,
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    transparent = json.loads(doctor.stdout)["verdict"]["transparent"]
    assert transparent["status"] == "ok", transparent
    assert any(c.startswith("cuBLAS is forwarded to the device proxy: ") for c in transparent["caveats"]), transparent


# ---- cuBLASLt: descriptors kept in the worker, each call carrying its own (interpose/remote/blaslt.c) ----

LT_SOURCE = REPO / "tests" / "emulator_programs" / "cublaslt_gemm.c"


@pytest.fixture(scope="module")
def lt_program(proxy, tmp_path_factory) -> Path:  # noqa: F811
    """tests/emulator_programs/cublaslt_gemm.c, linked against the emulated cuBLASLt, cuBLAS and runtime."""
    assert (EMULATOR_BUILD / "libcublasLt.so.13").exists(), "make -C emulator built no libcublasLt.so.13"
    out = tmp_path_factory.mktemp("cublaslt") / "cublaslt_gemm"
    subprocess.run(["gcc", "-O1", "-ffp-contract=off", "-I", str(CUDA_HOME / "include"), "-I", str(CUBLAS_INCLUDE),
                    "-o", str(out), str(LT_SOURCE), "-L", str(EMULATOR_BUILD), "-l:libcublasLt.so.13",
                    "-l:libcublas.so.13", "-l:libcudart.so.13", "-lm"], check=True)
    return out


@REQUIRES_CUBLASLT_HEADER
@pytest.mark.parametrize("what", ["matmul", "errors", "train"])
def test_every_cublaslt_case_and_error_prints_the_same_through_the_proxy(lt_program, tmp_path, what):
    """27 matmul cases (transposes, the bias/ReLU/GELU epilogues, strided batches, device scalars, in place, a
    cuBLAS handle as the cuBLASLt handle), 78 statuses (wrong attribute sizes, unknown attributes, ROW order, the
    heuristic's answer, defaults read back) and a 25-step training loop: the same bytes through the proxy."""
    want = direct(lt_program, what)
    assert want.returncode == 0 and "DONE" in want.stdout, show(want)
    got = remote(lt_program, what, tmp_path=tmp_path)
    assert got.returncode == 0, show(got)
    assert got.stdout == want.stdout, show(got)
    assert "is not supported in transparent mode" not in got.stderr, got.stderr
    if what == "matmul":
        assert want.stdout.count("CASE ") >= 27 and " exact=0 pad=0" in want.stdout
    if what == "train":
        assert re.search(r"checksum [0-9a-f]{16}", want.stdout), want.stdout


@REQUIRES_CUBLASLT_HEADER
@pytest.mark.parametrize("call", [15, 60, 140])
def test_a_proxy_restart_in_the_middle_of_cublaslt_work_changes_nothing(lt_program, tmp_path, call):
    """A restart before the program's Nth call: no descriptor lives in the proxy, the handles come back under
    their ids (blas.c), and the program prints the same bytes."""
    want = direct(lt_program, "all")
    got = remote(lt_program, "all", tmp_path=tmp_path, extra={"JITCKPT_REMOTE_RESTART_AT": str(call)})
    assert got.returncode == 0 and got.stdout == want.stdout, show(got)
    assert "device proxy restarted (driver suspect)" in got.stderr and "refused" not in got.stderr, got.stderr


@REQUIRES_CUBLASLT_HEADER
def test_jit_run_transparent_forwards_cublaslt_and_doctor_says_so(lt_program):
    want = direct(lt_program, "train")
    e = env()
    e["LD_LIBRARY_PATH"] = str(EMULATOR_BUILD)  # (the program itself is linked against the emulator)
    got = subprocess.run([sys.executable, "-m", "jitckpt", "--transparent", "--emulated-gpus", "1",
                          str(lt_program), "train"], env=e, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert got.returncode == 0, show(got)
    assert got.stdout == want.stdout, show(got)
    assert f"cuBLASLt {EMULATOR_BUILD / 'libcublasLt.so.13'}" in got.stderr, got.stderr
    doctor = subprocess.run([sys.executable, "-m", "jitckpt", "doctor", "--json", str(lt_program)], env=e,
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    transparent = json.loads(doctor.stdout)["verdict"]["transparent"]
    assert transparent["status"] == "ok", transparent
    note = next(c for c in transparent["caveats"] if c.startswith("cuBLAS is forwarded to the device proxy: "))
    assert "cublasLt" in note or "of the" in note, note
    assert not any("cublasLt" in c and "refused" in c for c in transparent["caveats"]), transparent


# ---- transparent recovery of a cuBLAS training program -----------------------------------------------


@pytest.fixture(scope="module")
def blas_train(proxy, tmp_path_factory) -> Path:  # noqa: F811
    from native_toolchain import NCCL_WHEEL

    out = tmp_path_factory.mktemp("blas-train") / "blas_train"
    subprocess.run(["g++", "-O1", "-std=c++17", "-ffp-contract=off", "-I", str(CUDA_HOME / "include"), "-I",
                    str(CUBLAS_INCLUDE), "-I", str(NCCL_WHEEL / "include"), "-I", str(MLP_DIR), "-o", str(out),
                    str(TRAIN_SOURCE), str(MLP_DIR / "rendezvous.cpp"), "-L", str(EMULATOR_BUILD),
                    "-l:libcublasLt.so.13", "-l:libcublas.so.13", "-l:libnccl.so.2", "-l:libcudart.so.13", "-ldl"],
                   check=True)
    return out


_REFERENCES: dict[str, str] = {}


def blas_reference(blas_train: Path, tmp_path: Path, lt: str, extra: dict[str, str] | None = None) -> str:
    """The final checksum of a fault-free direct run (no proxy, no jitckpt), once per variant."""
    key = json.dumps([lt, extra or {}], sort_keys=True)
    if key not in _REFERENCES:
        proc = torchrun(blas_train, tmp_path, through_proxy=False, extra={"BLAS_TRAIN_LT": lt, **(extra or {})})
        sums = set(CHECKSUM.findall(proc.stdout))
        assert proc.returncode == 0 and len(sums) == 3 and len({s for _, s in sums}) == 1, proc.stdout + proc.stderr
        _REFERENCES[key] = sums.pop()[1]
    return _REFERENCES[key]


# cuBLAS GEMMs only, and the forward GEMM through cuBLASLt as PyTorch calls it (descriptors made per call)
VARIANTS = [pytest.param("0", id="cublas"), pytest.param("1", id="cublaslt", marks=REQUIRES_CUBLASLT_HEADER)]


@pytest.mark.parametrize("lt", VARIANTS)
@pytest.mark.parametrize("fault,rank", [("hang", 1), ("sticky", 2)])
def test_a_cublas_program_is_recovered_underneath_bit_exact(blas_train, tmp_path, fault, rank, lt):
    reference = blas_reference(blas_train, tmp_path, lt)
    proc = torchrun(blas_train, tmp_path, True,
                    {"JITCKPT_SIMDEV_FAULT": f"rank={rank},op=ncclAllReduce,call=9,kind={fault}", "BLAS_TRAIN_LT": lt})
    out = assert_recovered(proc, reference, minibatch=7)
    # validation ran at minibatch 5 and found the replay (its cuBLAS calls included) faithful on every rank
    assert len(re.findall(r"replay validation at minibatch 5: the replay of \d+ calls reproduces", out)) == 3, out[-4000:]
    if fault == "sticky":  # a new proxy: the handle re-created, with its stream, workspace and modes
        assert re.search(r"rank 2: recovered in \d+ ms \(stop \d+, new proxy \d+, ", out), out[-4000:]
    assert "is not supported in transparent mode" not in out


def test_work_on_a_handle_made_after_thousands_of_others_is_still_held_back(blas_train, tmp_path):
    """5000 cuBLAS handles given the compute stream before the training handle: the proxy's table of handles'
    streams had room for 4096, so the training handle's GEMMs (the optimizer's included) were not held behind
    a frozen all-reduce, and the recovery met parameters the step had already changed.  The table now grows."""
    reference = blas_reference(blas_train, tmp_path, "0")
    proc = torchrun(blas_train, tmp_path, True, {"JITCKPT_SIMDEV_FAULT": "rank=1,op=ncclAllReduce,call=9,kind=hang",
                                                "BLAS_TRAIN_SPARE_HANDLES": "5000"})
    out = assert_recovered(proc, reference, minibatch=7)
    assert "handles with a stream are alive" not in out, out[-4000:]


def test_the_event_a_stream_waits_on_is_remembered_after_hundreds_recorded_since(blas_train, tmp_path):
    """600 events recorded on the NCCL stream after each all-reduce, after the one that the compute stream then
    waits on: the proxy's table of what events wait for held 512 and forgot its oldest entries, so the compute
    stream's optimizer GEMM was not held behind a frozen all-reduce.  Entries now go only once their collective
    has completed."""
    reference = blas_reference(blas_train, tmp_path, "0")
    proc = torchrun(blas_train, tmp_path, True, {"JITCKPT_SIMDEV_FAULT": "rank=1,op=ncclAllReduce,call=9,kind=hang",
                                                "TRAIN_SPARE_EVENTS": "600"})
    assert_recovered(proc, reference, minibatch=7)


def test_a_stream_of_another_device_is_waited_for_at_minibatch_boundaries(blas_train, tmp_path):
    """Each rank also holds a stream of a second device (as a program that touches two GPUs does).  An event of
    the current device cannot be recorded on it (cudaErrorInvalidResourceHandle), so the proxy's minibatch
    marker left that stream out without a word: a minibatch counted as done on the device while that device's
    work could still be running, and the call log dropped it.  The marker now records an event made on the
    stream's own device; a hang is recovered bit-exact, with replay validation."""
    two = {"JITCKPT_SIMDEV_DEVICES": "2"}
    reference = blas_reference(blas_train, tmp_path, "0", two)
    proc = torchrun(blas_train, tmp_path, True, {**two, "TRAIN_OTHER_DEVICE_STREAM": "1",
                                                 "JITCKPT_SIMDEV_FAULT": "rank=1,op=ncclAllReduce,call=9,kind=hang"})
    out = assert_recovered(proc, reference, minibatch=7)
    assert "no event could be recorded" not in out, out[-4000:]
    assert len(re.findall(r"replay validation at minibatch 5: the replay of \d+ calls reproduces", out)) == 3, out[-4000:]


def test_state_changed_in_place_is_saved_with_a_stream_of_another_device(blas_train, tmp_path):
    """The rewind save (state a minibatch changes in place, here a counter every forward pass adds 1 to) orders
    its copies after every stream's work with an event recorded on each stream.  An event of the current device
    cannot be recorded on a stream of a second device, so the save failed and the recovery refused the hang
    ("rewind" unusable) although nothing was wrong; each stream now gets an event of its own device."""
    two = {"JITCKPT_SIMDEV_DEVICES": "2", "BLAS_TRAIN_COUNTER": "1"}
    reference = blas_reference(blas_train, tmp_path, "0", two)
    proc = torchrun(blas_train, tmp_path, True, {**two, "TRAIN_OTHER_DEVICE_STREAM": "1",
                                                 "JITCKPT_SIMDEV_FAULT": "rank=1,op=ncclAllReduce,call=9,kind=hang"})
    out = assert_recovered(proc, reference)  # (resumed at 6 or 7: how far the device was behind the host)
    assert out.count("replay validation at minibatch 5: the minibatch changes 4 bytes in 1 range(s) of device "
                     "memory in place") == 3, out[-4000:]
    assert "no event could be recorded" not in out, out[-4000:]


def test_a_failure_before_the_first_replay_validation_stops_the_job_and_one_after_is_recovered(blas_train,
                                                                                                tmp_path):
    """A counter in device memory that each forward pass adds 1 to in place, through cuBLAS (as BatchNorm adds to
    ``num_batches_tracked``): no library call announces it.  A hang at minibatch 3, before replay validation
    (minibatch 5) has checked that a replay reproduces this program's minibatch, stops every rank with the
    reason (before: the recovery replayed the minibatch and added 1 twice; the job ended with other numbers
    than the fault-free run and exit status 0).  A hang at minibatch 7, after the validation learned the
    counter's bytes, is recovered bit-exact, and so is the early hang when the validation is at minibatch 1."""
    counter = {"BLAS_TRAIN_COUNTER": "1"}
    reference = blas_reference(blas_train, tmp_path, "0", counter)
    early = torchrun(blas_train, tmp_path, True,
                     {**counter, "JITCKPT_SIMDEV_FAULT": "rank=1,op=ncclAllReduce,call=4,kind=hang"})
    out = early.stdout + early.stderr
    assert early.returncode != 0 and "final parameters checksum" not in out, out[-4000:]
    assert "no replay validation has passed yet" in out and "exit status 75" in out, out[-4000:]
    late = torchrun(blas_train, tmp_path, True,
                    {**counter, "JITCKPT_SIMDEV_FAULT": "rank=1,op=ncclAllReduce,call=9,kind=hang"})
    out = assert_recovered(late, reference)  # (resumed at 6 or 7: how far the device was behind the host)
    assert out.count("replay validation at minibatch 5: the minibatch changes 4 bytes in 1 range(s) of device "
                     "memory in place") == 3, out[-4000:]
    # validated at minibatch 1 instead (JITCKPT_TRANSPARENT_VALIDATE_AT=1): a hang at minibatch 3 is recovered
    # bit-exact (call 6: the check's two replays of minibatch 1 made all-reduces 3 and 4)
    sooner = torchrun(blas_train, tmp_path, True, {**counter, "JITCKPT_TRANSPARENT_VALIDATE_AT": "1",
                                                  "JITCKPT_SIMDEV_FAULT": "rank=1,op=ncclAllReduce,call=6,kind=hang"})
    out = assert_recovered(sooner, reference)
    assert out.count("replay validation at minibatch 1: the minibatch changes 4 bytes") == 3, out[-4000:]


def test_a_rank_that_cannot_replay_the_validated_minibatch_moves_the_check_for_every_rank(blas_train, tmp_path):
    """Rank 0 times step 6 (minibatch 5, the one validated) with CUDA events it creates there, as a script that
    measures a step on rank 0 does: that minibatch cannot be replayed on rank 0.  The check replays the
    minibatch's all-reduce, so every rank checks or none does.  Before, ranks 1 and 2 replayed alone and their
    replayed all-reduce met rank 0's next real one.  Now every rank skips minibatch 5, checks minibatch 6, and a
    later hang is recovered bit-exact."""
    reference = blas_reference(blas_train, tmp_path, "0")
    proc = torchrun(blas_train, tmp_path, True, {"TRAIN_TIME_STEP": "0:6", "BLAS_TRAIN_LT": "0",
                                                  "JITCKPT_SIMDEV_FAULT": "rank=1,op=ncclAllReduce,call=9,kind=hang"})
    out = assert_recovered(proc, reference, minibatch=7)
    assert "[rank 0] step 6 took" in out, out[-4000:]
    skipped = re.findall(r"rank (\d): replay validation at minibatch 5 is skipped on every rank: rank 0 cannot take "
                         r"part \(the minibatch creates or destroys a stream, an event or a library handle there\); "
                         r"it is tried again at the next minibatch", out)
    assert sorted(skipped) == ["0", "1", "2"], out[-4000:]
    assert len(re.findall(r"replay validation at minibatch 6: the replay of \d+ calls reproduces", out)) == 3, out[-4000:]
    assert "FAILED" not in out, out[-4000:]


def test_a_rank_whose_recovery_is_off_keeps_the_other_ranks_from_checking_alone(blas_train, tmp_path):
    """Only rank 1 allocates managed memory, so only its recovery is off.  Before, ranks 0 and 2 checked
    minibatch 5 alone, their replayed all-reduce unanswered, and the job stopped.  Every rank skips the check,
    says why, and training ends with the fault-free run's parameters (the managed buffer is never used)."""
    reference = blas_reference(blas_train, tmp_path, "0")
    proc = torchrun(blas_train, tmp_path, True, {"BLAS_TRAIN_LT": "0"}, rank_1_env="BLAS_TRAIN_MANAGED=1")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert re.search(r"rank 1: the program allocated managed memory \(cudaMallocManaged\), which a replay cannot "
                     r"reset.*Transparent recovery is OFF", out), out[-4000:]
    skipped = re.findall(r"rank (\d): replay validation at minibatch 5 is skipped on every rank: rank 1 cannot take "
                         r"part \(its transparent recovery is off \(said above\)\); the next is at its usual time", out)
    assert sorted(skipped) == ["0", "2"], out[-4000:]
    assert "replay validation at minibatch 5: the replay" not in out and "FAILED" not in out, out[-4000:]
    assert dict(CHECKSUM.findall(proc.stdout)) == {"0": reference, "1": reference, "2": reference}, out[-4000:]
