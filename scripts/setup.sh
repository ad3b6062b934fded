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

# ---- cuBLAS's headers (issue 19: transparent mode forwards cuBLAS; the emulator implements part of it) ----
# Only cublas_api.h, cublas_v2.h and cublasLt.h of the nvidia-cublas wheel (444 MB, whose libraries are never needed
# here), cached once where interpose/, proxy_server/ and emulator/ look (their Makefiles: CUBLAS_INCLUDE).
CUBLAS_INCLUDE_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/jitckpt/cublas-13/include
if [ ! -f "$CUBLAS_INCLUDE_CACHE/cublasLt.h" ] && ! "$PY" -c 'import nvidia.cu13, os, sys
sys.exit(not any(os.path.isfile(os.path.join(p, "include", "cublasLt.h")) for p in nvidia.cu13.__path__))' 2>/dev/null; then
    say "caching cuBLAS's headers (cublas_api.h, cublas_v2.h, cublasLt.h of nvidia-cublas 13) in $CUBLAS_INCLUDE_CACHE"
    wheel_dir=$(mktemp -d)
    if ! { "$PY" -m pip download --quiet --disable-pip-version-check --no-deps "nvidia-cublas>=13,<14" \
               -d "$wheel_dir" &&
           "$PY" -c 'import glob, os, sys, zipfile
wheel, = glob.glob(os.path.join(sys.argv[1], "*.whl"))
os.makedirs(sys.argv[2], exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    for name in ("cublas_api.h", "cublas_v2.h", "cublasLt.h"):
        data = z.read("nvidia/cu13/include/" + name)
        tmp = os.path.join(sys.argv[2], "." + name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(sys.argv[2], name))' "$wheel_dir" "$CUBLAS_INCLUDE_CACHE"; }; then
        say "warning: could not cache cuBLAS's headers; cuBLAS is then neither forwarded nor emulated, and its"
        say "         tests are skipped"
    fi
    rm -rf "$wheel_dir"
fi
if ! "$PY" -c 'import jitckpt, pytest, xdist, pytest_timeout, elftools, matplotlib, cffi, xxhash, transformers, lightning, pytorch_lightning' 2>/dev/null || ! command -v jit-run >/dev/null; then
    say "installing jitckpt (editable, with test, plot and frameworks extras); this also builds the native parts"
    # An isolated build, as any install: it uses the toolkit's CUDA headers and the nccl.h of the
    # nvidia-nccl-cu13 installed above, and fetches header wheels only for what is missing (native_build.py)
    "$PY" -m pip install --quiet --disable-pip-version-check -e ".[test,plot,frameworks]"
fi
if command -v nvcc >/dev/null && [ -d /usr/local/cuda/include ]; then
    # up to date after the install; rebuilds only what changed in a working tree
    for dir in emulator interpose; do
        if [ -f "$dir/Makefile" ]; then make -s -C "$dir" -j2; fi
    done
else
    say "warning: CUDA 13 toolkit not found (nvcc, /usr/local/cuda/include): the tests that build CUDA programs"
    say "         with nvcc will be skipped. Install the CUDA toolkit to run them."
fi

# ---- the oldest NCCL header the native parts build against (tests/test_native_nccl_versions.py) ----
# Only nvidia/nccl/include/nccl.h of the nvidia-nccl-cu13 2.27.7 wheel, cached once; never installed.
NCCL_OLDEST=2.27.7
NCCL_OLDEST_INCLUDE=${XDG_CACHE_HOME:-$HOME/.cache}/jitckpt/nccl-$NCCL_OLDEST/include
if [ ! -f "$NCCL_OLDEST_INCLUDE/nccl.h" ]; then
    say "caching nccl.h of NCCL $NCCL_OLDEST (the oldest the native parts build against) in $NCCL_OLDEST_INCLUDE"
    wheel_dir=$(mktemp -d)
    if ! { "$PY" -m pip download --quiet --disable-pip-version-check --no-deps "nvidia-nccl-cu13==$NCCL_OLDEST" \
               -d "$wheel_dir" &&
           "$PY" -c 'import glob, os, sys, zipfile
wheel, = glob.glob(os.path.join(sys.argv[1], "*.whl"))
os.makedirs(sys.argv[2], exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    data = z.read("nvidia/nccl/include/nccl.h")
tmp = os.path.join(sys.argv[2], ".nccl.h.tmp")
with open(tmp, "wb") as f:
    f.write(data)
os.replace(tmp, os.path.join(sys.argv[2], "nccl.h"))' "$wheel_dir" "$NCCL_OLDEST_INCLUDE"; }; then
        say "warning: could not cache NCCL $NCCL_OLDEST's nccl.h; tests/test_native_nccl_versions.py will fail"
    fi
    rm -rf "$wheel_dir"
fi
say "done"
