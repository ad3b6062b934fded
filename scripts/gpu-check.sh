#!/usr/bin/env bash
# The checks only a GPU can answer (README, "What is verified where").  Run it
# on a machine with an NVIDIA GPU; elsewhere it says "no GPU" and exits 0, so
# it is safe anywhere.
#
#   bash scripts/gpu-check.sh                    # every check that this machine can run
#   bash scripts/gpu-check.sh user               # only the user-level part
#   bash scripts/gpu-check.sh transparent        # only the transparent part (cuda_mlp, then PyTorch)
#   bash scripts/gpu-check.sh pytorch            # only the transparent part's PyTorch jobs
#   bash scripts/gpu-check.sh save-stream        # only the JIT save's side-stream check (part of user)
#   GPU_CHECK_EMULATOR=1 bash scripts/gpu-check.sh   # the transparent part on the CPU device
#                                                # emulator, no GPU needed: checks this script itself
#
# User-level mode (issue 11; needs a CUDA build of PyTorch): examples/train_mlp.py
# with --device cuda, the ranks' tensors on the GPU (CUDA streams, the autograd
# device threads, asynchronous copies); a fault-free plain-torchrun reference,
# then jit-run with a rank killed (SIGKILL, backward) and a rank frozen
# (SIGSTOP, in the all-reduce); each must end with the reference's final
# parameters, bit for bit, having redone one minibatch.
#   - gloo over CUDA tensors, 3 ranks sharing the GPU(s);
#   - NCCL, one GPU per rank, when there are at least 2 GPUs; and there (issue 18)
#     the scripts beyond DDP, each fault placed by the script itself: one
#     that all-reduces its own gradients (killed, and frozen, between its
#     all-reduces and optimizer.step()), one that exchanges them with
#     batch_isend_irecv (frozen there), FSDP2 and ZeRO (SIGKILL, and SIGTERM
#     as a preemption), HSDP with 4 or more GPUs.  Unverified: no machine with
#     two GPUs has run this part yet.
#
# Transparent mode (issue 12; needs nvcc 13 and the nvidia-nccl-cu13 wheel, not
# torch): examples/cuda_mlp built against the real CUDA runtime, 1 rank,
#   - directly (the reference checksum and per-step time);
#   - as a user runs it: `jit-run --transparent torchrun --standalone
#     --nproc_per_node 1 --no-python examples/cuda_mlp/build/mlp ...`, with no
#     option naming a library: the proxy must load the runtime and NCCL the
#     program itself loads (jit-run's "proxy: CUDA runtime ..." line must not
#     name the CPU device emulator), every CUDA/NCCL call forwarded through
#     the shared-memory ring: same final checksum, and its per-step time
#     against the direct run's;
#   - the same with JITCKPT_PROXY_GPU_VMM=1 (device memory through the
#     driver's VMM API at fixed addresses; needed for a restart on a GPU);
#   - the same with a driver-suspect proxy restart injected mid-run
#     (JITCKPT_REMOTE_RESTART_AT=N in the worker's environment): the restart
#     must happen (its duration is printed) and the run must still end with
#     the direct run's checksum;
#   - with 2 or more GPUs: 2 ranks (NCCL), directly and through
#     `jit-run --transparent torchrun --nproc_per_node 2 ...`, same checksums.
# With GPU_CHECK_EMULATOR=1 the same commands run with `--emulated-gpus N`
# (and the direct runs with the emulator on LD_LIBRARY_PATH), and the proxy's
# line must name the emulator.
# Transparent mode, PyTorch jobs (the issue "Transparent mode runs an unmodified CUDA PyTorch job on a
# real GPU", item 5; needs a CUDA build of torch): examples/train_mlp.py, examples/tiny_gpt.py (embedding,
# attention through scaled_dot_product_attention, AdamW) and examples/conv_bn.py (Conv2d + BatchNorm2d,
# SGD), deterministic settings, 1 rank, --device cuda --backend nccl:
#   - directly (`torchrun --standalone --nproc_per_node 1 SCRIPT ...`) and as a user runs it
#     (`python3 -m jitckpt --transparent torchrun --standalone --nproc_per_node 1 SCRIPT ...`), interleaved,
#     GPU_CHECK_PT_PAIRS pairs: the same final parameters (sha256) both ways, and the per-step time ratio
#     transparent/direct from each script's timing line (goal: under 1.03);
#   - once more through jit-run with a driver-suspect proxy restart mid-run (JITCKPT_PROXY_GPU_VMM=1
#     JITCKPT_REMOTE_RESTART_AT=N; N placed at the middle step from the first transparent run's call log,
#     JITCKPT_REMOTE_LOG_TRACE=1): it must happen between two training steps' log lines and the run must
#     end with the direct checksum; its duration and the bytes copied are printed.
#   A transparent run that stops (a library call or a driver entry point not forwarded: the worker exits
#   with status 77 and a line naming the library; or jit-run refuses before the start, status 2) is a
#   FAIL quoting that line, never a PASS.  On the emulator (GPU_CHECK_EMULATOR=1) it prints one line,
#   skipped (no CUDA torch), and fails nothing.  Knobs: GPU_CHECK_PT_STEPS (300), GPU_CHECK_PT_PAIRS (2),
#   GPU_CHECK_PT_TIMEOUT (120 s per run), GPU_CHECK_PT_BUDGET (420 s for all its runs: a run that would
#   start past it is not started, a FAIL), GPU_CHECK_PT_BACKEND (nccl), GPU_CHECK_PT_RESTART_AT (the
#   restart's call number, instead of the estimate).  NCCL across ranks stays unverified on a machine
#   with one GPU.
# Knobs (environment): GPU_CHECK_MLP_STEPS (default 5000), GPU_CHECK_MLP_BATCH
# (32), GPU_CHECK_RESTART_AT (1500: the worker's Nth CUDA call, of about
# 25 per step), GPU_CHECK_TIMING_PAIRS (3: interleaved direct/proxy runs for
# the per-step times), GPU_CHECK_TIMEOUT (300 s per run).  If the program does
# not find libcudart.so.13 by itself, $CUDA_HOME/lib64 is put on
# LD_LIBRARY_PATH, as a user would.
#
# Prints one PASS/FAIL line per check and a summary; exits 1 if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
EMULATOR_MODE=${GPU_CHECK_EMULATOR:-0}

PARTS=("$@")
[[ ${#PARTS[@]} -eq 0 ]] && PARTS=(user transparent)
for part in "${PARTS[@]}"; do
    case $part in
        user|transparent|pytorch|save-stream) ;;
        *) echo "gpu-check: unknown part '$part' (user, transparent, pytorch, save-stream)" >&2; exit 2 ;;
    esac
done
wants() { local p; for p in "${PARTS[@]}"; do [[ $p == "$1" ]] && return 0; done; return 1; }

if [[ $EMULATOR_MODE == 1 ]]; then
    echo "gpu-check: GPU_CHECK_EMULATOR=1: the transparent part on the CPU device emulator (emulator/build), not on a GPU"
    if wants user; then
        echo "gpu-check: the user-level part needs a GPU: skipped"
    fi
    if wants pytorch && ! wants transparent; then PARTS=(pytorch); else PARTS=(transparent); fi
elif ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu-check: no GPU (nvidia-smi finds none): nothing to check here" \
         "(GPU_CHECK_EMULATOR=1 runs the transparent part's logic on the CPU emulator)"
    exit 0
else
    echo "gpu-check: $(nvidia-smi -L | head -8 | tr '\n' ';')"
fi
echo "gpu-check: $(date -u '+%Y-%m-%d %H:%M UTC'), $(uname -n)"
WORK=$(mktemp -d /tmp/jitckpt-gpu-check.XXXXXX)
FAILED=0

# ---- user-level mode (issue 11) -------------------------------------------------------------

sha_of() { grep -o 'final parameters sha256 [0-9a-f]*' "$1" | tail -1 | awk '{print $4}'; }

check() {  # check NAME NPROC FAULT TRAIN_ARGS...: examples/train_mlp.py
    check_script "$1" "$2" examples/train_mlp.py "$3" "${STEPS[@]}" "${@:4}"
}

check_script() {  # check_script NAME NPROC SCRIPT FAULT ARGS...: the reference run without FAULT's script options
    local name=$1 nproc=$2 script=$3 fault=$4; shift 4
    local ref_log="$WORK/$name-reference.log" log="$WORK/$name.log" started ref sha args=() a skip=0
    for a in "$@"; do  # the reference drops the script's own fault options (--die X, --fault X)
        if (( skip )); then skip=0; continue; fi
        if [[ $a == --die || $a == --fault ]]; then skip=1; continue; fi
        args+=("$a")
    done
    started=$(date +%s.%N)
    "$PY" -m torch.distributed.run --standalone --nproc_per_node "$nproc" "$script" \
        "${args[@]}" >"$ref_log" 2>&1
    ref=$(sha_of "$ref_log")
    rm -rf "$WORK/$name-ckpt"
    "$PY" -m jitckpt --checkpoint-dir "$WORK/$name-ckpt" --hang-timeout 10 --save-grace 60 \
        --report "$WORK/$name-report.json" ${fault:+--fault "$fault"} \
        torchrun --standalone --nproc_per_node "$nproc" --max-restarts 2 "$script" \
        "$@" >"$log" 2>&1
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

save_stream_check() {  # issue 18, defect 4: the JIT save's copies never wait behind a blocked training stream
    local log="$WORK/save-stream.log"
    PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" "$PY" - >"$log" 2>&1 <<'PYEOF'
"""The training stream is blocked (a kernel spinning seconds stands for the hung NCCL collective) with an update
queued behind it; a thread then copies the parameters to the host, as a JIT save does: on the default stream
(before: it waits for the spin and sees the update) and inside jitckpt's save stream (after)."""
import threading, time
import torch
from jitckpt.worker import save

torch.cuda.set_device(0)
param = torch.randn(1 << 22, device="cuda")
param.add_(0.0)                                   # load the kernel now: a first launch (lazy loading) synchronises
start_state = param.cpu()
save.note_minibatch_start()                       # the previous optimizer step is done
torch.cuda._sleep(12_000_000_000)               # the hang, on the training stream: 12e9 cycles, 5-8 s
param.add_(1.0)                                   # this minibatch's update, queued behind it

def copy(side: bool, out: dict) -> None:
    began = time.monotonic()
    if side:
        with save.off_the_blocked_stream():
            out["host"] = param.cpu()
    else:
        out["host"] = param.cpu()
    out["seconds"] = time.monotonic() - began

for side in (True, False):
    out: dict = {}
    worker = threading.Thread(target=copy, args=(side, out))
    worker.start()
    worker.join()
    same = torch.equal(out["host"], start_state)
    print(f"{'side stream' if side else 'default stream'}: copied in {out['seconds']:.2f}s, "
          f"{'start-of-minibatch state' if same else 'the queued update included'}")
    if side:
        ok = out["seconds"] < 1.0 and same
print("RESULT", "ok" if ok else "bad")
PYEOF
    if grep -q "RESULT ok" "$log"; then
        echo "PASS save-stream: $(grep 'side stream' "$log" | head -1); $(grep 'default stream' "$log" | head -1)"
    else
        echo "FAIL save-stream: (log $log)"; tail -20 "$log" | sed 's/^/    /'
        FAILED=1
    fi
}

user_level_part() {
    if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
        echo "FAIL user-level: torch here has no CUDA ($("$PY" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1)):" \
             "install a CUDA 13 build of torch and jitckpt (scripts/setup.sh installs the CPU build)"
        FAILED=1
        return
    fi
    GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
    export CUBLAS_WORKSPACE_CONFIG=:4096:8   # deterministic cuBLAS: bit-for-bit comparisons
    STEPS=(--steps 24 --accum 2 --log-every 1000)
    save_stream_check

    echo "== user-level mode, gloo over CUDA tensors, 3 ranks on $GPUS GPU(s)"
    check gloo-cuda-kill 3 "rank=1,step=5,phase=backward,kind=kill" --device cuda --backend gloo
    check gloo-cuda-hang 3 "rank=2,step=7,phase=allreduce,kind=hang" --device cuda --backend gloo
    if [[ $GPUS -ge 2 ]]; then
        N=$(( GPUS < 4 ? GPUS : 4 ))
        echo "== user-level mode, NCCL, $N ranks, one GPU each"
        check nccl-kill "$N" "rank=1,step=5,phase=backward,kind=kill" --device cuda --backend nccl
        check nccl-hang "$N" "rank=$((N - 1)),step=7,phase=allreduce,kind=hang" --device cuda --backend nccl
        echo "== user-level mode beyond DDP, NCCL, $N ranks (issue 18; faults placed by the scripts)"
        local clip=tests/user_programs/clip_and_die.py gpu=(--device cuda --backend nccl)
        check_script nccl-manual-kill "$N" $clip "" "${STEPS[@]}" "${gpu[@]}" --grad-sync manual --die "$((N - 1)):5:kill"
        check_script nccl-manual-freeze "$N" $clip "" "${STEPS[@]}" "${gpu[@]}" --grad-sync manual --die "1:9:stop"
        check_script nccl-p2p-freeze "$N" $clip "" "${STEPS[@]}" "${gpu[@]}" --grad-sync p2p --die "1:9:stop"
        local sharded=tests/sharded_programs/train_sharded.py mode
        for mode in fsdp zero; do
            check_script "nccl-$mode-kill" "$N" $sharded "" --mode $mode --steps 10 "${gpu[@]}" --fault 1:5:KILL
            check_script "nccl-$mode-sigterm" "$N" $sharded "" --mode $mode --steps 10 "${gpu[@]}" --fault 0:4:TERM
        done
        if [[ $N -ge 4 ]]; then
            check_script nccl-hsdp-kill 4 $sharded "" --mode hsdp --steps 10 "${gpu[@]}" --fault 1:5:KILL
        fi
    else
        echo "== NCCL: skipped (needs 2 or more GPUs, one per rank; this machine has $GPUS)"
    fi
}

# ---- transparent mode (issue 12) ------------------------------------------------------------

MLP=examples/cuda_mlp/build/mlp
T_STEPS=${GPU_CHECK_MLP_STEPS:-5000}
T_BATCH=${GPU_CHECK_MLP_BATCH:-32}
T_RESTART_AT=${GPU_CHECK_RESTART_AT:-1500}
T_PAIRS=${GPU_CHECK_TIMING_PAIRS:-3}
T_TIMEOUT=${GPU_CHECK_TIMEOUT:-300}

checksum_of() { grep -o 'final parameters checksum [0-9a-f]*' "$1" | tail -1 | awk '{print $4}'; }
rank_checksum_of() {  # rank_checksum_of RANK LOG: one rank's, from a log that holds every rank's output
    grep -o "\[rank $1\] final parameters checksum [0-9a-f]*" "$2" | tail -1 | awk '{print $6}'
}
# "mlp: 3000 steps in 0.62 s, ..." -> milliseconds per step (mlp times its training loop, start-up
# excluded, and prints seconds with 2 decimals: +-10 ms over the run, hence GPU_CHECK_MLP_STEPS)
ms_per_step_of() {
    grep -o 'mlp: [0-9]* steps in [0-9.]* s' "$1" | tail -1 | awk '{ if ($2 > 0) printf "%.3g", 1000 * $5 / $2 }'
}
# t_run LOG VAR=VALUE... -- COMMAND...: one run of COMMAND in the transparent part's environment.
t_run() {
    local log=$1; shift
    local vars=()
    while [[ $1 != -- ]]; do vars+=("$1"); shift; done
    shift
    env -u LD_PRELOAD -u JITCKPT_PROXY_SOCKET -u JITCKPT_PROXY_CUDART -u JITCKPT_PROXY_NCCL \
        -u JITCKPT_PROXY_PRELOAD -u JITCKPT_PROXY_GPU_VMM -u JITCKPT_REMOTE_RESTART_AT -u JITCKPT_REMOTE_SYNC \
        -u JITCKPT_PROXY_NO_SUPERVISOR "${T_ENV[@]}" "${vars[@]}" \
        timeout -k 10 "$T_TIMEOUT" "$@" >"$log" 2>&1
}

t_direct() { t_run "$1" "${T_DIRECT_ENV[@]}" RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 -- "$MLP" "${T_ARGS[@]}"; }
# t_jit LOG NPROC VAR=VALUE... [-- MLP ARGS...]: the user's command line, jit-run --transparent over torchrun.
t_jit() {
    local log=$1 nproc=$2; shift 2
    local vars=() extra=()
    while [[ $# -gt 0 && $1 != -- ]]; do vars+=("$1"); shift; done
    [[ $# -gt 0 ]] && { shift; extra=("$@"); }
    local emulated=()
    [[ $EMULATOR_MODE == 1 ]] && emulated=(--emulated-gpus "$nproc")
    t_run "$log" "${vars[@]}" -- "$PY" -m jitckpt --transparent "${emulated[@]}" \
        torchrun --standalone --nproc_per_node "$nproc" --no-python "$MLP" "${T_ARGS[@]}" "${extra[@]}"
}
t_proxy() { local log=$1; shift; t_jit "$log" 1 "$@"; }  # t_proxy LOG VAR=VALUE...

# jit-run's one line about what the proxies load, into T_LIBRARIES; status 1 (the check failed, with
# the reason) when it is missing or names the wrong kind: the emulator on a GPU host, or not it in emulator mode.
t_libraries() {  # t_libraries NAME LOG
    local line
    line=$(grep -m1 '^\[jit-run\] proxy: CUDA runtime ' "$2")
    if [[ -z $line ]]; then
        t_fail "$1" "jit-run did not say which CUDA runtime the proxies load" "$2"
        return 1
    fi
    if [[ $EMULATOR_MODE == 1 && $line != *"CPU device emulator"* ]]; then
        t_fail "$1" "emulator mode, but the proxies did not load the emulator: ${line#\[jit-run\] }" "$2"
        return 1
    fi
    if [[ $EMULATOR_MODE != 1 && $line == *emulator* ]]; then
        t_fail "$1" "the proxies loaded the CPU device emulator on a GPU host: ${line#\[jit-run\] }" "$2"
        return 1
    fi
    T_LIBRARIES=${line#\[jit-run\] }
}

t_fail() {  # t_fail NAME MESSAGE LOG
    echo "FAIL $1: $2 (log: $3)"
    tail -15 "$3" | sed 's/^/    /'
    FAILED=1
}

# The proxy's lines about device memory placement (the VMM path, fixed addresses), if any.
t_memory_lines() { grep -E 'VMM|fixed addresses|address range' "$1" | sort -u | head -3 | sed 's/^/    /'; }

transparent_part() {
    echo "== transparent mode: examples/cuda_mlp, 1 rank, directly and through the device proxy"
    if ! make -C proxy_server -j2 >"$WORK/t-build.log" 2>&1 || ! make -C examples/cuda_mlp >>"$WORK/t-build.log" 2>&1; then
        t_fail transparent-build "make -C proxy_server / make -C examples/cuda_mlp failed" "$WORK/t-build.log"
        return
    fi
    # (the proxy's build does not build the emulator)
    if [[ $EMULATOR_MODE == 1 ]] && ! make -C emulator -j2 >>"$WORK/t-build.log" 2>&1; then
        t_fail transparent-build "make -C emulator failed" "$WORK/t-build.log"
        return
    fi
    if [[ $EMULATOR_MODE != 1 && ${LD_LIBRARY_PATH:-} == */emulator/* ]]; then
        LD_LIBRARY_PATH=$(printf '%s' "$LD_LIBRARY_PATH" | tr ':' '\n' | grep -v '/emulator/' | paste -sd: -)
        echo "   (the CPU emulator removed from LD_LIBRARY_PATH: this part runs the real runtime)"
    fi
    T_ENV=()          # every run's, direct or through jit-run
    T_DIRECT_ENV=()   # the direct runs' besides
    if [[ $EMULATOR_MODE == 1 ]]; then
        echo "   (emulator mode: the direct runs with the emulator on LD_LIBRARY_PATH, jit-run with --emulated-gpus)"
        T_ENV+=("JITCKPT_SIMDEV_KERNELS=$PWD/examples/cuda_mlp/build/libmlp_twins.so")
        T_DIRECT_ENV+=("LD_LIBRARY_PATH=$PWD/emulator/build")
    elif ! ldd "$MLP" | grep -q 'libcudart.so.13 => /'; then
        # The program must find its runtime by itself (and jit-run then finds the same file for the proxy).
        local lib=${CUDA_HOME:-/usr/local/cuda}/lib64
        if [[ ! -e $lib/libcudart.so.13 ]]; then
            echo "FAIL transparent: $MLP does not find libcudart.so.13, nor is it in $lib (set CUDA_HOME or LD_LIBRARY_PATH)"
            FAILED=1
            return
        fi
        T_ENV+=("LD_LIBRARY_PATH=$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
        echo "   ($MLP does not find libcudart.so.13 by itself: LD_LIBRARY_PATH=$lib first)"
    fi
    T_ARGS=(--steps "$T_STEPS" --batch "$T_BATCH" --log-every 0)
    echo "   mlp ${T_ARGS[*]}; $T_PAIRS interleaved direct/proxy pairs for the per-step times"

    # Direct and proxy runs, interleaved; every one must end with the first direct run's checksum.
    local i ref="" d_times=() p_times=() bad=0 sum t
    for (( i = 1; i <= T_PAIRS; i++ )); do
        t_direct "$WORK/t-direct-$i.log"
        local code=$?
        sum=$(checksum_of "$WORK/t-direct-$i.log")
        t=$(ms_per_step_of "$WORK/t-direct-$i.log")
        if [[ $code -ne 0 || -z $sum || -z $t ]]; then
            t_fail transparent-direct "mlp directly: exit $code" "$WORK/t-direct-$i.log"
            return
        fi
        [[ -z $ref ]] && ref=$sum
        if [[ $sum != "$ref" ]]; then
            t_fail transparent-direct "two direct runs differ: $ref, then $sum" "$WORK/t-direct-$i.log"
            return
        fi
        d_times+=("$t")

        t_proxy "$WORK/t-proxy-$i.log"
        code=$?
        sum=$(checksum_of "$WORK/t-proxy-$i.log")
        t=$(ms_per_step_of "$WORK/t-proxy-$i.log")
        if ! t_libraries transparent-proxy "$WORK/t-proxy-$i.log"; then
            bad=1
            break
        fi
        if [[ $code -ne 0 || $sum != "$ref" || -z $t ]]; then
            t_fail transparent-proxy "through the proxy: exit $code, checksum ${sum:-none}, direct $ref" \
                "$WORK/t-proxy-$i.log"
            bad=1
            break
        fi
        p_times+=("$t")
    done
    if [[ $bad -eq 0 ]]; then
        local dm pm
        dm=$(printf '%s\n' "${d_times[@]}" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}')
        pm=$(printf '%s\n' "${p_times[@]}" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}')
        echo "PASS transparent-proxy: checksum $ref through jit-run --transparent, as directly ($T_PAIRS runs each)"
        echo "   $T_LIBRARIES"
        echo "   per-step time (ms), median of $T_PAIRS: direct $dm, through the proxy $pm" \
             "(ratio $(awk -v a="$dm" -v b="$pm" 'BEGIN { if (a > 0) printf "%.2f", b / a; else print "?" }'));" \
             "each run: direct ${d_times[*]}; proxy ${p_times[*]}"
        t_memory_lines "$WORK/t-proxy-1.log"
    fi
    [[ -z $ref ]] && return

    # Device memory through the driver's VMM API (fixed addresses), no restart.
    local log=$WORK/t-proxy-vmm.log
    t_proxy "$log" JITCKPT_PROXY_GPU_VMM=1
    local code=$?
    sum=$(checksum_of "$log")
    if [[ $code -eq 0 && $sum == "$ref" ]]; then
        echo "PASS transparent-proxy-vmm: checksum $sum with JITCKPT_PROXY_GPU_VMM=1 ($(ms_per_step_of "$log") ms/step)"
        t_memory_lines "$log"
    else
        t_fail transparent-proxy-vmm "JITCKPT_PROXY_GPU_VMM=1: exit $code, checksum ${sum:-none}, direct $ref" "$log"
    fi

    # A driver-suspect restart of the proxy mid-run.
    log=$WORK/t-proxy-restart.log
    t_proxy "$log" JITCKPT_PROXY_GPU_VMM=1 "JITCKPT_REMOTE_RESTART_AT=$T_RESTART_AT"
    code=$?
    sum=$(checksum_of "$log")
    local restarted ms
    restarted=$(grep -o 'device proxy restarted (driver suspect).*' "$log" | head -1)
    ms=$(sed -n 's/.*device proxy restarted (driver suspect).*(\([0-9.]*\) ms)$/\1/p' "$log" | head -1)
    if [[ $code -eq 0 && -n $restarted && $sum == "$ref" ]]; then
        echo "PASS transparent-restart: proxy restarted before CUDA call $T_RESTART_AT in ${ms:-?} ms," \
             "checksum $sum as directly ($(ms_per_step_of "$log") ms/step over the run, restart included)"
        echo "   ${restarted}"
    elif [[ -z $restarted ]]; then
        t_fail transparent-restart "no restart happened (exit $code, checksum ${sum:-none}; refused, or the run has fewer than $T_RESTART_AT CUDA calls)" "$log"
        grep -E 'refused|VMM|fixed addresses' "$log" | head -5 | sed 's/^/    /'
    else
        t_fail transparent-restart "restarted in ${ms:-?} ms, then: exit $code, checksum ${sum:-none}, direct $ref" "$log"
    fi

    # Two ranks, one GPU each, NCCL through the proxies (a proxy per rank), against the same directly.
    local gpus
    if [[ $EMULATOR_MODE == 1 ]]; then gpus=2; else gpus=$(nvidia-smi -L | grep -c '^GPU'); fi
    if [[ $gpus -lt 2 ]]; then
        echo "== transparent mode, 2 ranks: skipped (needs 2 GPUs, one per rank; this machine has $gpus)"
        return
    fi
    echo "== transparent mode: examples/cuda_mlp, 2 ranks (NCCL), directly and through a proxy per rank"
    local rank pids want="" got
    mkdir -p "$WORK/t2-direct-rv" "$WORK/t2-proxy-rv"
    pids=()
    for rank in 0 1; do
        t_run "$WORK/t2-direct-$rank.log" "${T_DIRECT_ENV[@]}" RANK=$rank WORLD_SIZE=2 LOCAL_RANK=$rank -- \
            "$MLP" "${T_ARGS[@]}" --rendezvous-dir "$WORK/t2-direct-rv" &
        pids+=($!)
    done
    code=0
    for pid in "${pids[@]}"; do wait "$pid" || code=$?; done
    want="$(checksum_of "$WORK/t2-direct-0.log") $(checksum_of "$WORK/t2-direct-1.log")"
    if [[ $code -ne 0 || $want != [0-9a-f]*" "[0-9a-f]* || ${want% *} != "${want#* }" ]]; then
        t_fail transparent-2ranks-direct "exit $code, checksums of ranks 0 and 1: ${want:-none}" "$WORK/t2-direct-0.log"
        return
    fi
    t_jit "$WORK/t2-proxy.log" 2 -- --rendezvous-dir "$WORK/t2-proxy-rv"
    code=$?
    got="$(rank_checksum_of 0 "$WORK/t2-proxy.log") $(rank_checksum_of 1 "$WORK/t2-proxy.log")"
    t_libraries transparent-2ranks "$WORK/t2-proxy.log" || return
    if [[ $code -ne 0 || $got != [0-9a-f]*" "[0-9a-f]* ]]; then
        t_fail transparent-2ranks-proxy "exit $code, checksums of ranks 0 and 1: ${got:-none}" "$WORK/t2-proxy.log"
        return
    fi
    if [[ $got == "$want" ]]; then
        echo "PASS transparent-2ranks: both ranks ${got% *} through the proxies, as directly" \
             "(ms/step: direct $(ms_per_step_of "$WORK/t2-direct-0.log"), proxies $(ms_per_step_of "$WORK/t2-proxy.log"))"
    else
        t_fail transparent-2ranks "through the proxies ${got}, directly ${want}" "$WORK/t2-proxy.log"
    fi
}

# ---- transparent mode, PyTorch jobs (item 5 of "Transparent mode runs an unmodified CUDA PyTorch job") ----

PT_SCRIPTS=(examples/train_mlp.py examples/tiny_gpt.py examples/conv_bn.py)
PT_STEPS=${GPU_CHECK_PT_STEPS:-300}
PT_PAIRS=${GPU_CHECK_PT_PAIRS:-2}
PT_TIMEOUT=${GPU_CHECK_PT_TIMEOUT:-120}
PT_BUDGET=${GPU_CHECK_PT_BUDGET:-420}
PT_BACKEND=${GPU_CHECK_PT_BACKEND:-nccl}

# pt_args SCRIPT: the script's arguments; train_mlp.py needs --deterministic (the other two always are).
pt_args() {
    PT_ARGS=(--device cuda --backend "$PT_BACKEND" --steps "$PT_STEPS" --log-every "${PT_LOG_EVERY:-1000000}")
    [[ $1 == *train_mlp.py ]] && PT_ARGS+=(--deterministic)
}
# pt_run LOG VAR=VALUE... -- COMMAND...: one run, its own timeout, within the part's budget (status 124 past it).
pt_run() {
    local log=$1; shift
    local vars=() left=$(( PT_DEADLINE - SECONDS ))
    while [[ $1 != -- ]]; do vars+=("$1"); shift; done
    shift
    if (( left < 15 )); then
        echo "(not started: the part's budget of ${PT_BUDGET}s is spent)" >"$log"
        return 124
    fi
    (( left > PT_TIMEOUT )) && left=$PT_TIMEOUT
    env -u LD_PRELOAD -u JITCKPT_PROXY_SOCKET -u JITCKPT_PROXY_CUDART -u JITCKPT_PROXY_NCCL \
        -u JITCKPT_PROXY_PRELOAD -u JITCKPT_PROXY_GPU_VMM -u JITCKPT_REMOTE_RESTART_AT -u JITCKPT_REMOTE_SYNC \
        -u JITCKPT_REMOTE_LOG_TRACE -u JITCKPT_PROXY_NO_SUPERVISOR -u JITCKPT_ACTIVE -u JITCKPT_FAULT \
        PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" CUBLAS_WORKSPACE_CONFIG=:4096:8 "${vars[@]}" \
        timeout -k 10 "$left" "$@" >"$log" 2>&1
}
pt_direct() {  # pt_direct LOG SCRIPT
    pt_args "$2"
    pt_run "$1" -- "$PY" -m torch.distributed.run --standalone --nproc_per_node 1 "$2" "${PT_ARGS[@]}"
}
pt_jit() {  # pt_jit LOG SCRIPT VAR=VALUE...: the user's command line
    local log=$1 script=$2; shift 2
    pt_args "$script"
    pt_run "$log" "$@" -- "$PY" -m jitckpt --transparent torchrun --standalone --nproc_per_node 1 "$script" "${PT_ARGS[@]}"
}
# "tiny_gpt: 295 steps in 1.2345 s (...)" -> milliseconds per step
pt_ms_of() {
    grep -o "$2: [0-9]* steps in [0-9.]* s" "$1" | tail -1 | awk '{ if ($2 > 0) printf "%.4g", 1000 * $5 / $2 }'
}
# Why a run stopped, as one line to quote: the remote library's stop (status 77), a function refused by
# name, jit-run's refusal before the start (status 2), the budget, else the last error-looking line.
pt_reason() {
    local line="" pattern
    for pattern in 'stopping the job|is not supported in transparent mode' \
                   '^\[jit-run\] .*(refus|cannot|not built|no CUDA|[Ee]rror)' 'not started: the part'; do
        line=$(grep -m1 -E "$pattern" "$1")
        [[ -n $line ]] && break
    done
    [[ -z $line ]] && line=$(grep -E '[A-Za-z]*Error|exitcode' "$1" | grep -v -E '^\s*(File|warnings)' | tail -1)
    [[ -z $line ]] && line=$(grep -v '^\s*$' "$1" | tail -1)
    printf '%s' "$line" | cut -c1-400
}
pt_fail() {  # pt_fail NAME MESSAGE LOG [noquote]: FAIL with the telling line quoted, then the log's tail
    local why=""
    [[ ${4:-} != noquote ]] && why=$(pt_reason "$3")
    echo "FAIL $1: $2${why:+: \"$why\"} (log: $3)"
    grep -q 'exitcode *: *77' "$3" && echo "    (the worker exited with status 77: transparent mode stopped the job)"
    grep -v 'call log: minibatch [0-9]* ended' "$3" | tail -12 | sed 's/^/    /'
    FAILED=1
}
median_of() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
# The call number to restart the proxy before, from a JITCKPT_REMOTE_LOG_TRACE=1 run's "call log: minibatch K
# ended: C calls" lines: every call of minibatches 0 .. STEPS/2-1 (0 holds the set-up) and half of the next.
pt_restart_at() {  # pt_restart_at LOG
    grep -o 'call log: minibatch [0-9]* ended: [0-9]* calls' "$1" |
        awk -v mid=$(( PT_STEPS / 2 )) '{k = $4; c = $6} k < mid {n += c} k == mid {half = int(c / 2)}
                                        END {if (n > 0 && half > 0) print n + half}'
}

pt_script() {  # pt_script SCRIPT: the direct/transparent pairs, then the restart run
    local script=$1 name i code sum ref="" d_times=() p_times=() t log at
    name=$(basename "$script" .py)
    for (( i = 1; i <= PT_PAIRS; i++ )); do
        log=$WORK/pt-$name-direct-$i.log
        pt_direct "$log" "$script"
        code=$?
        sum=$(sha_of "$log")
        t=$(pt_ms_of "$log" "$name")
        if [[ $code -ne 0 || -z $sum || -z $t ]]; then
            pt_fail "pytorch-$name-direct" "the script directly: exit $code" "$log"
            return
        fi
        [[ -z $ref ]] && ref=$sum
        if [[ $sum != "$ref" ]]; then
            pt_fail "pytorch-$name-direct" "two direct runs differ: ${ref:0:16}, then ${sum:0:16} (not deterministic)" "$log"
            return
        fi
        d_times+=("$t")

        log=$WORK/pt-$name-transparent-$i.log
        if [[ $i -eq 1 ]]; then pt_jit "$log" "$script" JITCKPT_REMOTE_LOG_TRACE=1; else pt_jit "$log" "$script"; fi
        code=$?
        sum=$(sha_of "$log")
        t=$(pt_ms_of "$log" "$name")
        if [[ $code -ne 0 || -z $sum ]]; then
            pt_fail "pytorch-$name" "jit-run --transparent stopped the run (exit $code; directly: ${ref:0:16}, ${d_times[0]} ms/step; no restart run)" "$log"
            return
        fi
        t_libraries "pytorch-$name" "$log" || return
        if [[ $sum != "$ref" ]]; then
            pt_fail "pytorch-$name" "through jit-run --transparent: checksum ${sum:0:16}, directly ${ref:0:16}" "$log" noquote
            return
        fi
        p_times+=("$t")
    done
    local dm pm
    dm=$(median_of "${d_times[@]}")
    pm=$(median_of "${p_times[@]}")
    echo "PASS pytorch-$name: sha256 ${ref:0:16}... through jit-run --transparent, as directly ($PT_PAIRS runs each)"
    echo "   $T_LIBRARIES"
    echo "   per-step time (ms), median of $PT_PAIRS: direct $dm, transparent $pm" \
         "(ratio $(awk -v a="$dm" -v b="$pm" 'BEGIN { if (a > 0) printf "%.3f", b / a; else print "?" }'), goal < 1.03);" \
         "each run: direct ${d_times[*]}; transparent ${p_times[*]}"

    # A driver-suspect restart of the proxy at the middle step.
    at=${GPU_CHECK_PT_RESTART_AT:-$(pt_restart_at "$WORK/pt-$name-transparent-1.log")}
    log=$WORK/pt-$name-restart.log
    if [[ -z $at ]]; then
        echo "FAIL pytorch-$name-restart: no call number to restart at (the first transparent run's call log trace" \
             "has no per-minibatch counts; set GPU_CHECK_PT_RESTART_AT) (log: $WORK/pt-$name-transparent-1.log)"
        grep -m3 'call log' "$WORK/pt-$name-transparent-1.log" | sed 's/^/    /'
        FAILED=1
        return
    fi
    PT_LOG_EVERY=$(( PT_STEPS >= 10 ? PT_STEPS / 10 : 1 )) pt_jit "$log" "$script" \
        JITCKPT_PROXY_GPU_VMM=1 "JITCKPT_REMOTE_RESTART_AT=$at"
    code=$?
    sum=$(sha_of "$log")
    local restarted line_no before after
    restarted=$(grep -m1 -o 'device proxy restarted (driver suspect).*' "$log")
    line_no=$(grep -n -m1 'device proxy restarted (driver suspect)' "$log" | cut -d: -f1)
    if [[ -n $line_no ]]; then
        before=$(head -n "$line_no" "$log" | grep -o '^step [0-9]*/' | tail -1 | tr -dc 0-9)
        after=$(tail -n +"$line_no" "$log" | grep -o '^step [0-9]*/' | head -1 | tr -dc 0-9)
    fi
    if [[ -z $restarted ]]; then
        if [[ $code -ne 0 || -z $sum ]]; then
            pt_fail "pytorch-$name-restart" "JITCKPT_REMOTE_RESTART_AT=$at: exit $code, no restart" "$log"
        else
            pt_fail "pytorch-$name-restart" "no restart happened before call $at (refused, or fewer calls; checksum ${sum:0:16})" "$log" noquote
            grep -E 'refused|VMM|fixed addresses' "$log" | head -5 | sed 's/^/    /'
        fi
    elif [[ $code -ne 0 || $sum != "$ref" ]]; then
        pt_fail "pytorch-$name-restart" "restarted, then: exit $code, checksum ${sum:0:16}, direct ${ref:0:16}" "$log"
    elif [[ -z $before || -z $after ]]; then
        pt_fail "pytorch-$name-restart" "checksum as directly, but the restart (call $at) was not between two training steps' lines (step ${before:-none} before it, ${after:-none} after)" "$log" noquote
    else
        echo "PASS pytorch-$name-restart: proxy restarted before call $at (between steps $before and $after of $PT_STEPS)" \
             "in $(sed -n 's/.*device proxy restarted (driver suspect).*(\([0-9.]*\) ms)$/\1/p' "$log" | head -1) ms," \
             "sha256 as directly"
        echo "   ${restarted}"
    fi
}

pytorch_transparent_part() {
    if [[ $EMULATOR_MODE == 1 ]]; then
        echo "== transparent mode, PyTorch jobs: skipped (no CUDA torch: PyTorch's kernels need a GPU, the CPU device emulator runs none)"
        return
    fi
    echo "== transparent mode, PyTorch jobs: ${PT_SCRIPTS[*]}, 1 rank, directly and through jit-run --transparent"
    if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
        echo "FAIL pytorch: skipped, no CUDA torch here ($("$PY" -c 'import torch; print(torch.__version__)' 2>&1 | tail -1)) on a GPU host:" \
             "install a CUDA 13 build of torch and jitckpt"
        FAILED=1
        return
    fi
    if ! make -C proxy_server -j2 >"$WORK/pt-build.log" 2>&1; then
        t_fail pytorch-build "make -C proxy_server failed" "$WORK/pt-build.log"
        return
    fi
    if [[ ${LD_LIBRARY_PATH:-} == */emulator/* ]]; then
        LD_LIBRARY_PATH=$(printf '%s' "$LD_LIBRARY_PATH" | tr ':' '\n' | grep -v '/emulator/' | paste -sd: -)
    fi
    echo "   $PT_STEPS steps, --device cuda --backend $PT_BACKEND, $PT_PAIRS interleaved direct/transparent pairs each," \
         "then a proxy restart mid-run; ${PT_TIMEOUT}s per run, ${PT_BUDGET}s for the part"
    PT_DEADLINE=$(( SECONDS + PT_BUDGET ))
    local script started=$SECONDS
    for script in "${PT_SCRIPTS[@]}"; do
        pt_script "$script"
    done
    echo "   (the PyTorch part took $(( SECONDS - started ))s)"
    echo "   NCCL across ranks stays unverified on GPU here: this machine has" \
         "$(nvidia-smi -L | grep -c '^GPU') GPU(s) and the PyTorch part runs 1 rank (NCCL with one rank, through the proxy)"
}

wants user && user_level_part
wants save-stream && ! wants user && save_stream_check
wants transparent && transparent_part
{ wants transparent || wants pytorch; } && pytorch_transparent_part

if [[ $FAILED -ne 0 ]]; then
    echo "gpu-check: some checks FAILED (work files in $WORK)"
    exit 1
fi
echo "gpu-check: all checks passed (work files in $WORK)"
