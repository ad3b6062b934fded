#!/usr/bin/env bash
# Set up this checkout on a fresh machine: the CPU build of PyTorch (from local
# disk; never a multi-GB CUDA build), jitckpt itself in editable mode with its
# test and plot extras, NCCL's header (for the CPU device emulator) and the
# native parts.  Safe to run again: it only installs what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
say() { printf '[setup] %s\n' "$*"; }

if ! "$PY" -c 'import torch' 2>/dev/null; then
    say "installing torch==2.13.0 (CPU build)"
    "$PY" -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
fi
if ! "$PY" -c 'import nvidia.nccl' 2>/dev/null; then
    say "installing nvidia-nccl-cu13 (nccl.h and libnccl.so.2 for the CPU device emulator)"
    "$PY" -m pip install --quiet --disable-pip-version-check nvidia-nccl-cu13
fi
if ! "$PY" -c 'import jitckpt, pytest, elftools, matplotlib, cffi, xxhash, transformers, lightning, pytorch_lightning' 2>/dev/null || ! command -v jit-run >/dev/null; then
    say "installing jitckpt (editable, with test, plot and frameworks extras); this also builds the native parts"
    "$PY" -m pip install --quiet --disable-pip-version-check "setuptools>=64" wheel
    # --no-build-isolation: the native build needs nccl.h from the nvidia-nccl-cu13 installed above
    "$PY" -m pip install --quiet --disable-pip-version-check --no-build-isolation -e ".[test,plot,frameworks]"
fi
if command -v nvcc >/dev/null && [ -d /usr/local/cuda/include ]; then
    # up to date after the install; rebuilds only what changed in a working tree
    for dir in emulator interpose; do
        if [ -f "$dir/Makefile" ]; then make -s -C "$dir" -j2; fi
    done
else
    say "warning: CUDA 13 toolkit not found (nvcc, /usr/local/cuda/include): the CPU device emulator is not built"
    say "         and its tests will be skipped. Install the CUDA toolkit to build it."
fi
say "done"
