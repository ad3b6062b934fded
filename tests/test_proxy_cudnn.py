"""cuDNN through the device proxy (issue 19): forwarded at the library level, on the CPU device emulator.

tests/emulator_programs/cudnn_conv.c (convolutions forward, backward-data and backward-filter through the
backend API as PyTorch builds them, BatchNorm through the legacy API, about 150 argument errors, and a small
training loop) prints the same bytes through ``jitckpt-proxy`` as directly, through proxy restarts at
several points (the backend descriptors re-created from the worker's history: interpose/remote/dnn.c), and
under ``jit-run --transparent --emulated-gpus 1``, whose proxy loads the emulator's libcudnn.so.9.

Recovery: tests/proxy_programs/dnn_train.cpp (3 ranks under torchrun: BatchNorm, three convolution plans
built in the first minibatch and kept, a variant pack per execution, a workspace, cuBLAS for the optimizer)
survives a hung all-reduce and a sticky device error with final parameters and running statistics
bit-identical to a fault-free direct run, and replay validation at minibatch 5 finds the replayed cuDNN
calls faithful.  Nothing here says anything about a GPU.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from native_toolchain import (CUBLAS_INCLUDE, CUDA_HOME, CUDNN_INCLUDE, REQUIRES_CUBLAS_HEADER, REQUIRES_CUDNN_HEADER,
                              REQUIRES_CUDA_TOOLCHAIN)
from test_emulator import emulator  # noqa: F401  (fixture)
from test_proxy import EMULATOR_BUILD, REMOTE_LIB, direct, env, proxy, remote, show  # noqa: F401
from test_proxy_recovery import CHECKSUM, STEPS, assert_recovered, torchrun

pytestmark = [*REQUIRES_CUDA_TOOLCHAIN, REQUIRES_CUDNN_HEADER]

SOURCE = REPO / "tests" / "emulator_programs" / "cudnn_conv.c"
TRAIN_SOURCE = REPO / "tests" / "proxy_programs" / "dnn_train.cpp"
MLP_DIR = REPO / "examples" / "cuda_mlp"


@pytest.fixture(scope="module")
def conv_program(proxy, tmp_path_factory) -> Path:  # noqa: F811
    """The test program, linked against the emulated libcudnn.so.9 and libcudart.so.13."""
    assert (EMULATOR_BUILD / "libcudnn.so.9").exists(), "make -C emulator built no libcudnn.so.9"
    out = tmp_path_factory.mktemp("cudnn") / "cudnn_conv"
    subprocess.run(["gcc", "-O1", "-ffp-contract=off", "-I", str(CUDA_HOME / "include"), "-I", str(CUDNN_INCLUDE),
                    "-o", str(out), str(SOURCE), "-L", str(EMULATOR_BUILD), "-l:libcudnn.so.9", "-l:libcudart.so.13",
                    "-lm"], check=True)
    return out


HOST_MEMORY = re.compile(r"^STATUS execute_host_memory (\d+)$", re.M)
HOST_MEMORY_REFUSAL = re.compile(r".*this call of cudnnBackendExecute is not supported in transparent mode.*host "
                                 r"memory.*\n")


def assert_same_output(want: subprocess.CompletedProcess, got: subprocess.CompletedProcess) -> None:
    """The same bytes, but for one documented difference: an execution whose variant pack names host memory
    is refused in transparent mode (the proxy cannot read the worker's memory; cuDNN would read the host
    address as a tensor given by value), CUDNN_STATUS_NOT_SUPPORTED with the reason on stderr, where the
    emulator's cuDNN answers BAD_PARAM."""
    direct_status = HOST_MEMORY.findall(want.stdout)
    if direct_status:
        assert HOST_MEMORY.findall(got.stdout) == ["3000"] * len(direct_status), show(got)
        assert "a variant pack names host memory" in got.stderr, got.stderr
    assert HOST_MEMORY.sub("", got.stdout) == HOST_MEMORY.sub("", want.stdout), show(got)


def defined(lib: Path) -> dict[str, str]:
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return {line.split()[2].split("@")[0]: line.split()[2] for line in out.splitlines() if len(line.split()) == 3}


def test_the_remote_library_exports_every_cudnn_function_under_libcudnns_node(proxy):  # noqa: F811
    """What the emulator implements is forwarded, and every other function of the headers is a refusal, all
    under libcudnn.so.9's node (as the real library's): a program's cudnnCreate@libcudnn.so.9 binds here."""
    emulated = {n for n in defined(EMULATOR_BUILD / "libcudnn.so.9") if n.startswith("cudnn")}
    exported = defined(REMOTE_LIB)
    assert emulated and not emulated - set(exported), sorted(emulated - set(exported))
    for name in ("cudnnCreate", "cudnnBackendExecute", "cudnnBatchNormalizationForwardTrainingEx",
                 "cudnnConvolutionForward", "cudnnRNNForward", "cudnnGetVersion"):
        assert exported[name] == f"{name}@@libcudnn.so.9", exported.get(name)


@pytest.mark.parametrize("what", ["conv", "bn", "errors", "train"])
def test_every_cudnn_case_and_error_prints_the_same_through_the_proxy(conv_program, tmp_path, what):
    """23 convolution cases (forward, backward-data, backward-filter; padding, strides, dilation, channels-last,
    alpha/beta, 1-D and 3-D), 18 BatchNorm cases, about 150 statuses of bad arguments (the variant pack's among
    them: the worker keeps it, the proxy's cuDNN answers what the worker does not) and a training loop: the
    same bytes through the proxy."""
    want = direct(conv_program, what)
    assert want.returncode == 0 and "DONE" in want.stdout, show(want)
    got = remote(conv_program, what, tmp_path=tmp_path)
    assert got.returncode == 0, show(got)
    assert_same_output(want, got)
    assert "is not supported in transparent mode" not in HOST_MEMORY_REFUSAL.sub("", got.stderr), got.stderr
    if what == "conv":
        assert want.stdout.count("CASE ") >= 20 and " exact=0 pad=0" in want.stdout
    if what == "errors":
        assert want.stdout.count("STATUS ") >= 100
    if what == "train":
        assert re.search(r"^checksum [0-9a-f]{16}$", want.stdout, re.M), want.stdout


@pytest.mark.parametrize("call", [40, 150, 400, 900])
def test_a_proxy_restart_re_creates_the_cudnn_handles_and_descriptors(conv_program, tmp_path, call):
    """A driver-suspect restart before the program's Nth call (JITCKPT_REMOTE_RESTART_AT): the new proxy gets
    every handle back with its stream and every live backend descriptor from the worker's history (finalized
    plans, the engine configurations the heuristics filled); the program prints the same bytes."""
    want = direct(conv_program, "all")
    got = remote(conv_program, "all", tmp_path=tmp_path, extra={"JITCKPT_REMOTE_RESTART_AT": str(call)})
    assert got.returncode == 0, show(got)
    assert_same_output(want, got)
    assert "device proxy restarted (driver suspect)" in got.stderr, got.stderr
    assert "is not supported in transparent mode" not in HOST_MEMORY_REFUSAL.sub("", got.stderr), got.stderr


def test_jit_run_transparent_forwards_cudnn_and_doctor_says_so(conv_program):
    want = direct(conv_program, "train")
    e = env()
    e["LD_LIBRARY_PATH"] = str(EMULATOR_BUILD)  # (the program itself is linked against the emulator)
    got = subprocess.run([sys.executable, "-m", "jitckpt", "--transparent", "--emulated-gpus", "1",
                          str(conv_program), "train"], env=e, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert got.returncode == 0, show(got)
    assert got.stdout == want.stdout, show(got)
    assert f"cuDNN {EMULATOR_BUILD / 'libcudnn.so.9'}" in got.stderr, got.stderr
    doctor = subprocess.run([sys.executable, "-m", "jitckpt", "doctor", "--json", str(conv_program)], env=e,
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    report = json.loads(doctor.stdout)
    transparent = report["verdict"]["transparent"]
    assert transparent["status"] == "ok", transparent
    assert any(c.startswith("cuDNN is forwarded to the device proxy: ") for c in transparent["caveats"]), transparent
    assert {"library": "cuDNN", "file": "libcudnn.so.9", "transparent": "forwarded",
            "pytorch_common_path": True} in report["libraries"], report["libraries"]
    text = subprocess.run([sys.executable, "-m", "jitckpt", "doctor", str(conv_program)], env=e,
                          capture_output=True, text=True, timeout=120, cwd=REPO).stdout
    assert re.search(r"^  cuDNN\s+forwarded\s+\(libcudnn\.so\.9\)$", text, re.M), text


# ---- transparent recovery of a cuDNN training program --------------------------------------------------


@pytest.fixture(scope="module")
def dnn_train(proxy, tmp_path_factory) -> Path:  # noqa: F811
    from native_toolchain import NCCL_WHEEL

    out = tmp_path_factory.mktemp("dnn-train") / "dnn_train"
    subprocess.run(["g++", "-O1", "-std=c++17", "-ffp-contract=off", "-I", str(CUDA_HOME / "include"), "-I",
                    str(CUBLAS_INCLUDE), "-I", str(CUDNN_INCLUDE), "-I", str(NCCL_WHEEL / "include"), "-I",
                    str(MLP_DIR), "-o", str(out), str(TRAIN_SOURCE), str(MLP_DIR / "rendezvous.cpp"), "-L",
                    str(EMULATOR_BUILD), "-l:libcudnn.so.9", "-l:libcublas.so.13", "-l:libnccl.so.2",
                    "-l:libcudart.so.13", "-ldl"], check=True)
    return out


def dnn_reference(dnn_train: Path, tmp_path: Path) -> str:
    """The final checksum of a fault-free direct run (no proxy, no jitckpt)."""
    proc = torchrun(dnn_train, tmp_path, through_proxy=False)
    sums = set(CHECKSUM.findall(proc.stdout))
    assert proc.returncode == 0 and len(sums) == 3 and len({s for _, s in sums}) == 1, proc.stdout + proc.stderr
    return sums.pop()[1]


@REQUIRES_CUBLAS_HEADER
@pytest.mark.parametrize("fault,rank,rebuild", [("hang", 1, "0"), ("sticky", 2, "0"), ("hang", 1, "1"),
                                                ("sticky", 2, "1")])
def test_a_cudnn_program_is_recovered_underneath_bit_exact(dnn_train, tmp_path, fault, rank, rebuild):
    """With DNN_TRAIN_REBUILD=1 every minibatch builds its plans and destroys them after use, and makes one
    failed execution it ignores: a replay still finds the plans (their destroys wait until the call log no
    longer holds the minibatch) and skips the failed call."""
    reference = dnn_reference(dnn_train, tmp_path)
    proc = torchrun(dnn_train, tmp_path, True, {"JITCKPT_SIMDEV_FAULT": f"rank={rank},op=ncclAllReduce,call=9,kind={fault}",
                                                "DNN_TRAIN_REBUILD": rebuild})
    out = assert_recovered(proc, reference, minibatch=7)
    # validation ran at minibatch 5 and found the replay (its cuDNN calls included) faithful on every rank
    assert len(re.findall(r"replay validation at minibatch 5: the replay of \d+ calls reproduces", out)) == 3, out[-4000:]
    if fault == "sticky":  # a new proxy: the handles and the plans re-created
        assert re.search(r"rank 2: recovered in \d+ ms \(stop \d+, new proxy \d+, ", out), out[-4000:]
    assert "is not supported in transparent mode" not in out


_running_references: dict[int, str] = {}


def running_reference(dnn_train: Path, tmp_path: Path, steps: int) -> str:
    """The final checksum of a fault-free direct run with running statistics (once per number of steps)."""
    if steps not in _running_references:
        proc = torchrun(dnn_train, tmp_path, False, {"DNN_TRAIN_RUNNING": "1"}, steps=steps)
        sums = set(CHECKSUM.findall(proc.stdout))
        assert proc.returncode == 0 and len({s for _, s in sums}) == 1, proc.stdout + proc.stderr
        _running_references[steps] = sums.pop()[1]
    return _running_references[steps]


@REQUIRES_CUBLAS_HEADER
@pytest.mark.parametrize("fault", ["rank=1,op=ncclAllReduce,call=9,kind=hang",
                                   "rank=2,op=ncclAllReduce,call=9,kind=sticky",
                                   "proxy-killed"])
def test_batchnorm_running_statistics_are_rewound_and_recovered_bit_exact(dnn_train, tmp_path, fault):
    """Running statistics (and a batch counter, as PyTorch's num_batches_tracked, updated by a cuBLAS call)
    are updated in place in the forward pass: the state a failure leaves already holds the update and a
    plain replay would make it twice.  Replay validation at minibatch 5 finds those bytes
    (the replay differs there), checks that rewinding them makes the replay faithful, and from then on the
    proxy saves them at every minibatch boundary; the recovery from a hang at minibatch 6 (run as a user
    types it: jit-run --transparent --emulated-gpus 3 --hang-timeout 2 torchrun ...) writes them back
    before its replay, and the job ends with parameters and running statistics bit-identical to a
    fault-free direct run.  The saves are in host memory, so a rank whose device memory is gone (the sticky
    error, rank 1's proxy killed with SIGKILL mid-run) takes the replica's memory and then its own counter
    (the program checks it: each rank counts by its own step).  Until validation has learned them, the
    worker says recovery waits for it."""
    killed = fault == "proxy-killed"
    steps = 40 if killed else STEPS
    reference = running_reference(dnn_train, tmp_path, steps)
    if "hang" in fault:  # what a user types: jit-run starts the proxies, the rendezvous helper, the timeout
        run = tmp_path / "jit-run"
        run.mkdir()
        e = env({"JITCKPT_PYTHON": sys.executable, "PYTHONPATH": str(REPO), "DNN_TRAIN_RUNNING": "1",
                 "JITCKPT_SIMDEV_FAULT": fault})
        e.pop("JITCKPT_HANG_TIMEOUT", None)
        proc = subprocess.run([sys.executable, "-m", "jitckpt", "--transparent", "--emulated-gpus", "3",
                               "--hang-timeout", "2", "torchrun", "--standalone", "--nproc_per_node", "3",
                               "--no-python", str(dnn_train), "--steps", str(steps), "--rendezvous-dir", str(run)],
                              env=e, capture_output=True, text=True, timeout=300, cwd=REPO)
    elif killed:  # slow all-reduces stretch the run, so that the kill (after step 10) lands mid-training
        proc = torchrun(dnn_train, tmp_path, True, {"DNN_TRAIN_RUNNING": "1",
                                                    "JITCKPT_SIMDEV_FAULT": "op=ncclAllReduce,kind=slow,delay_ms=150"},
                        steps=steps, kill_proxy_of=1)
    else:
        proc = torchrun(dnn_train, tmp_path, True, {"DNN_TRAIN_RUNNING": "1", "JITCKPT_SIMDEV_FAULT": fault})
    # (the emulator counts the validation's replayed all-reduces too: with the second replay that checks the
    # rewind, call 9 falls in minibatch 6)
    out = assert_recovered(proc, reference, minibatch=None if killed else 6)
    assert len(re.findall(r"rank \d: cudnnBatchNormalizationForwardTraining updates the running mean and variance "
                          r"in place during the forward pass: a replay would apply that twice\.  Transparent recovery "
                          r"waits until replay validation has learned", out)) == 3, out[-4000:]
    learned = re.findall(r"rank \d: replay validation at minibatch 5: the minibatch changes (\d+) bytes in (\d+) "
                         r"range\(s\) of device memory in place before its optimizer step", out)
    # the running mean and variance (2 channels: 16 bytes) and the batch counter (4 bytes), two allocations
    assert learned == [("20", "2")] * 3, out[-4000:]
    assert len(re.findall(r"rank \d: wrote back 20 bytes of state changed in place, as saved at minibatch "
                          + (r"\d+" if killed else "6") + "'s start", out)) == 3, out[-4000:]
    assert "replay validation FAILED" not in out and "Transparent recovery is OFF" not in out, out[-4000:]
    lost = "2" if "sticky" in fault else "1" if killed else None
    if lost:  # a new proxy and the replica's memory, then the rank's own statistics and counter
        assert re.search(rf"rank {lost}: recovered in \d+ ms \(stop \d+, new proxy \d+, .*replica copy \d+ ms for "
                         r"[1-9]\d* bytes", out), out[-4000:]


@REQUIRES_CUBLAS_HEADER
@pytest.mark.parametrize("fault,reason", [
    # before validation at minibatch 5 has learned the state changed in place
    ("rank=1,op=ncclAllReduce,call=5,kind=hang",
     r"rank \d changes device state in place before its optimizer step \(BatchNorm's running statistics\) that "
     r"replay validation has not learned yet"),
    # the program freed the memory of its batch counter (moved at minibatch 7): what was learned is gone
    ("rank=1,op=ncclAllReduce,call=12,kind=hang",
     r"rank \d changes device state in place before its optimizer step \(BatchNorm's running statistics\) that "
     r"replay validation has not learned yet"),
])
def test_batchnorm_running_statistics_that_cannot_be_rewound_stop_the_job(dnn_train, tmp_path, fault, reason):
    """Where the running statistics cannot be brought back exactly, every rank stops with exit status 75 and
    the reason (the job falls back to its checkpoints) instead of ending with statistics updated twice or
    copied from another rank."""
    moved = "call=12" in fault
    proc = torchrun(dnn_train, tmp_path, True, {"DNN_TRAIN_RUNNING": "1", "JITCKPT_SIMDEV_FAULT": fault,
                                                "DNN_TRAIN_MOVE_COUNTER_AT": "7" if moved else "0"})
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-4000:]
    if moved:
        assert len(re.findall(r"rank \d: the program freed device memory holding state it changes in place: a "
                              r"replay would apply that twice", out)) == 3, out[-4000:]
    assert re.search(r"transparent recovery is not possible: " + reason, out), out[-4000:]
    assert len(re.findall(r"exitcode\s*: 75", out)) >= 1, out[-4000:]
    assert "final parameters checksum" not in proc.stdout, out[-4000:]
