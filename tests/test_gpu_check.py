"""scripts/gpu-check.sh runs anywhere: on a machine without a GPU it says so and exits 0 (CI never has one)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from conftest import REPO


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi: run the script itself")
def test_gpu_check_says_no_gpu_and_succeeds_without_one():
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no GPU" in proc.stdout


def test_gpu_check_transparent_part_runs_on_the_emulator(tmp_path):
    """GPU_CHECK_EMULATOR=1: the transparent part's logic (build, direct vs ``jit-run --transparent``, checksums,
    the restart time) on the CPU device emulator, asked for with ``--emulated-gpus``, so the script cannot go
    stale while no GPU machine runs it."""
    import os

    env = dict(os.environ, GPU_CHECK_EMULATOR="1", GPU_CHECK_MLP_STEPS="300", GPU_CHECK_RESTART_AT="400",
               GPU_CHECK_TIMING_PAIRS="1", TMPDIR=str(tmp_path))
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), "transparent"], capture_output=True,
                          text=True, timeout=600, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "FAIL" not in out, out[-4000:]
    assert out.count("PASS") >= 2, out[-4000:]
    assert "restart" in out
    # the user's command line, not the proxy started by hand: jit-run said what its proxies load
    assert "PASS transparent-proxy: checksum" in out and "through jit-run --transparent" in out, out[-4000:]
    assert "PyTorch jobs: skipped (no CUDA torch" in out, out[-4000:]  # the part after it, on the emulator
    assert re.search(r"proxy: CUDA runtime \S+/emulator/build/libcudart\.so\.13, NCCL \S+/emulator/build/libnccl\.so\.2 "
                     r"\(both the CPU device emulator: --emulated-gpus 1\)", out), out[-4000:]


def test_gpu_check_pytorch_part_is_skipped_without_cuda_torch(tmp_path):
    """The PyTorch part (transparent mode, item 5) needs a CUDA torch: on the emulator it says it is skipped, one
    line, and fails nothing."""
    import os

    env = dict(os.environ, GPU_CHECK_EMULATOR="1", TMPDIR=str(tmp_path))
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), "pytorch"], capture_output=True,
                          text=True, timeout=60, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    assert "FAIL" not in out and "PASS" not in out, out
    assert out.count("PyTorch jobs") == 1 and "PyTorch jobs: skipped (no CUDA torch" in out, out


# Stand-ins for a GPU host, to check the PyTorch part's logic here: nvidia-smi, make (the proxy's build), and a
# python3 whose torch has CUDA and whose runs print what the scripts, torchrun and jit-run print.
FAKE_PYTHON = r"""#!/bin/bash
if [[ $1 == -c ]]; then [[ $2 == *is_available* ]] && exit 0; echo 2.11.0+cu130; exit 0; fi
mode=direct; [[ $2 == jitckpt ]] && mode=jit
script=""; steps=300; every=1000000; args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    [[ ${args[i]} == *.py ]] && script=${args[i]}
    [[ ${args[i]} == --steps ]] && steps=${args[i+1]}
    [[ ${args[i]} == --log-every ]] && every=${args[i+1]}
done
name=$(basename "$script" .py)
sha=$(printf '%s' "$name" | sha256sum | cut -c1-64)
if [[ $mode == jit ]]; then
    echo "[jit-run] proxy: CUDA runtime /cuda/lib64/libcudart.so.13 (the one libtorch_cuda.so loads: ld.so.cache), NCCL /n/libnccl.so.2 (same)"
    if [[ $name == ${FAKE_STOP:-none} ]]; then
        echo "jitckpt remote[42]: stopping the job: libcudnn.so.9 opened the CUDA driver (dlopen(\"libcuda.so.1\"))" >&2
        echo "  exitcode  : 77 (pid: 42)" >&2
        exit 1
    fi
fi
calls=0
for ((s = 0; s < steps; s++)); do
    c=300; ((s == 0)) && c=50000
    [[ -n ${JITCKPT_REMOTE_LOG_TRACE:-} ]] && echo "jitckpt remote[1]: call log: minibatch $s ended: $c calls, 9 bytes" >&2
    old=$calls; calls=$((calls + c))
    if [[ -n ${JITCKPT_REMOTE_RESTART_AT:-} ]] && ((old < JITCKPT_REMOTE_RESTART_AT && JITCKPT_REMOTE_RESTART_AT <= calls)); then
        echo "jitckpt remote[1]: device proxy restarted (driver suspect): pid 5 replaced by pid 6; 3 allocations (4194304 bytes), 1 streams, 0 events, 1 communicators re-created at the same addresses and ids, contents copied back (12 ms)" >&2
    fi
    (((s + 1) % every == 0)) && echo "step $((s + 1))/$steps loss 1.0"
done
echo "final parameters sha256 $sha"
echo "$name: $((steps - 5)) steps in $([[ $mode == jit ]] && echo 1.02 || echo 1.00) s (3.4 ms/step, after 5 warm-up steps)"
"""


def _fake_gpu_host(tmp_path, **env_vars):
    import os

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in {"nvidia-smi": "#!/bin/bash\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-x)'\n",
                       "make": "#!/bin/bash\nexit 0\n", "python3": FAKE_PYTHON}.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", PYTHON=str(bin_dir / "python3"),
               TMPDIR=str(tmp_path), **env_vars)
    env.pop("GPU_CHECK_EMULATOR", None)
    proc = subprocess.run(["bash", str(REPO / "scripts" / "gpu-check.sh"), "pytorch"], capture_output=True,
                          text=True, timeout=120, env=env)
    return proc.returncode, proc.stdout + proc.stderr


def test_gpu_check_pytorch_part_logic_with_stand_ins(tmp_path):
    """Checksums compared, the time ratio printed, the restart placed at the middle step from the call log trace
    and found between two steps' lines, the note about NCCL across ranks."""
    code, out = _fake_gpu_host(tmp_path)
    assert code == 0, out
    for name in ("train_mlp", "tiny_gpt", "conv_bn"):
        assert f"PASS pytorch-{name}: sha256 " in out, out
        assert f"PASS pytorch-{name}-restart: proxy restarted before call 94850 (between steps 150 and 180 of 300) in 12 ms" in out, out
    assert out.count("(ratio 1.020, goal < 1.03)") == 3, out
    assert "NCCL across ranks stays unverified on GPU" in out, out


def test_gpu_check_pytorch_part_fails_when_transparent_mode_stops_the_job(tmp_path):
    """A run that transparent mode stops (status 77, a cuDNN library reaching the driver) is a FAIL that quotes
    the line, never a PASS."""
    code, out = _fake_gpu_host(tmp_path, FAKE_STOP="tiny_gpt")
    assert code == 1, out
    assert re.search(r'FAIL pytorch-tiny_gpt: jit-run --transparent stopped the run \(exit 1; .*\): '
                     r'"jitckpt remote\[42\]: stopping the job: libcudnn\.so\.9 opened the CUDA driver', out), out
    assert "PASS pytorch-tiny_gpt" not in out and "(the worker exited with status 77" in out, out
    assert "PASS pytorch-conv_bn: " in out, out
