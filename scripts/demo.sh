#!/usr/bin/env bash
# The demo: a 4-rank CPU DDP job (gloo) under jit-run, rank 2 killed mid-run in
# its backward pass; the healthy ranks save just in time, torchrun restarts the
# job, and the recovery report is printed.  Then the same job without any
# failure, to show that the recovered run ends with bit-for-bit the same
# parameters.  The failure comes half-way through DEMO_STEPS (default 600);
# the report says how many restarted workers were warm (standbys that had
# already imported torch; on a small machine the failure can come first).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PY=${PYTHON:-python3}
work=$(mktemp -d /tmp/jitckpt-demo.XXXXXX)
steps=${DEMO_STEPS:-600}

echo
echo "=== 1/2: jit-run, rank 2 killed in the backward pass of minibatch $((steps / 2)) ==="
jit-run --checkpoint-dir "$work/checkpoints" --hang-timeout 10 \
    --fault "rank=2,step=$((steps / 2)),phase=backward,kind=kill" \
    torchrun --standalone --nproc_per_node 4 --max-restarts 3 \
    examples/train_mlp.py --steps "$steps" --log-every 50 2>&1 | tee "$work/jit.log" | grep -E 'recovery report|^\[jit|^\[jitckpt rank [0-9]\] (JIT|resum)|^step |final parameters|^=|^  |^---|^outcome|^summary|^no failures'

echo
echo "=== 2/2: the same job with no failure (plain torchrun) ==="
"$PY" -m torch.distributed.run --standalone --nproc_per_node 4 examples/train_mlp.py --steps "$steps" --log-every 50 2>&1 \
    | tee "$work/plain.log" | grep -E '^step |final parameters' \
    || true  # plain torchrun can abort in teardown after printing its result (torch 2.13; tests/test_shutdown.py)

a=$(grep -o 'final parameters sha256 [0-9a-f]*' "$work/jit.log" | tail -1 | awk '{print $4}')
b=$(grep -o 'final parameters sha256 [0-9a-f]*' "$work/plain.log" | tail -1 | awk '{print $4}')
echo
if [ -n "$a" ] && [ "$a" = "$b" ]; then
    echo "recovered run == fault-free run, bit for bit (sha256 $a)"
    echo "report: $work/checkpoints/jitckpt-report.json"
else
    echo "MISMATCH: recovered $a vs fault-free $b (logs in $work)" >&2
    exit 1
fi
