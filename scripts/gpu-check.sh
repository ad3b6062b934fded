#!/usr/bin/env bash
# The checks only a GPU can answer (README, "What is verified where").  Run it
# on a machine with an NVIDIA GPU and a CUDA build of PyTorch; elsewhere it
# says "no GPU" and exits 0, so it is safe anywhere.
#
#   bash scripts/gpu-check.sh            # every check that this machine can run
#
# User-level mode (issue 11): examples/train_mlp.py with --device cuda, the
# ranks' tensors on the GPU (CUDA streams, the autograd device threads,
# asynchronous copies); a fault-free plain-torchrun reference, then jit-run
# with a rank killed (SIGKILL, backward) and a rank frozen (SIGSTOP, in the
# all-reduce); each must end with the reference's final parameters, bit for
# bit, having redone one minibatch.
#   - gloo over CUDA tensors, 3 ranks sharing the GPU(s);
#   - NCCL, one GPU per rank, when there are at least 2 GPUs.
# Prints one PASS/FAIL line per check and a summary; exits 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: no GPU (nvidia-smi finds none): nothing to check here"
    exit 0
fi
echo "gpu-check: $(nvidia-smi -L | head -8 | tr '\n' ';')"
echo "gpu-check: $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n)"
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu-check: FAIL torch here has no CUDA ($("$PY" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1)):" \
         "install a CUDA 13 build of torch and jitckpt (scripts/setup.sh installs the CPU build)"
    exit 1
fi
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export CUBLAS_WORKSPACE_CONFIG=:4096:8   # deterministic cuBLAS: bit-for-bit comparisons
WORK=$(mktemp -d /tmp/jitckpt-gpu-check.XXXXXX)
FAILED=0
STEPS=(--steps 24 --accum 2 --log-every 1000)

sha_of() { grep -o 'final parameters sha256 [0-9a-f]*' "$1" | tail -1 | awk '{print $4}'; }

check() {  # check NAME NPROC FAULT TRAIN_ARGS...
    local name=$1 nproc=$2 fault=$3; shift 3
    local ref_log="$WORK/$name-reference.log" log="$WORK/$name.log" started ref sha
    started=$(date +%s.%N)
    "$PY" -m torch.distributed.run --standalone --nproc_per_node "$nproc" examples/train_mlp.py \
        "${STEPS[@]}" "$@" >"$ref_log" 2>&1
    ref=$(sha_of "$ref_log")
    rm -rf "$WORK/$name-ckpt"
    "$PY" -m jitckpt --checkpoint-dir "$WORK/$name-ckpt" --hang-timeout 10 --save-grace 60 \
        --report "$WORK/$name-report.json" --fault "$fault" \
        torchrun --standalone --nproc_per_node "$nproc" --max-restarts 2 examples/train_mlp.py \
        "${STEPS[@]}" "$@" >"$log" 2>&1
    local code=$?
    sha=$(sha_of "$log")
    local seconds
    seconds=$("$PY" -c "import time; print(f'{time.time() - $started:.0f}')")
    if [[ $code -eq 0 && -n "$ref" && "$sha" == "$ref" ]]; then
        echo "PASS $name: bit-exact after '$fault' (${seconds}s; $(grep -o 'minibatches redone: [0-9]*' "$log" | head -1))"
    else
        echo "FAIL $name: exit $code, reference ${ref:-none}, got ${sha:-none} (logs: $ref_log, $log)"
        tail -20 "$log" | sed 's/^/    /'
        FAILED=1
    fi
}

echo "== user-level mode, gloo over CUDA tensors, 3 ranks on $GPUS GPU(s)"
check gloo-cuda-kill 3 "rank=1,step=5,phase=backward,kind=kill" --device cuda --backend gloo
check gloo-cuda-hang 3 "rank=2,step=7,phase=allreduce,kind=hang" --device cuda --backend gloo
if [[ $GPUS -ge 2 ]]; then
    N=$(( GPUS < 4 ? GPUS : 4 ))
    echo "== user-level mode, NCCL, $N ranks, one GPU each"
    check nccl-kill "$N" "rank=1,step=5,phase=backward,kind=kill" --device cuda --backend nccl
    check nccl-hang "$N" "rank=$((N - 1)),step=7,phase=allreduce,kind=hang" --device cuda --backend nccl
else
    echo "== NCCL: skipped (needs 2 or more GPUs, one per rank; this machine has $GPUS)"
fi

if [[ $FAILED -ne 0 ]]; then
    echo "gpu-check: some checks FAILED (work files in $WORK)"
    exit 1
fi
echo "gpu-check: all checks passed (work files in $WORK)"
