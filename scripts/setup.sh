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

# ---- headers from NVIDIA's wheels, cached once, never installed ----
# cache_headers SPEC WHEEL_DIR_IN_ZIP DEST NAME...: the named headers of the wheel SPEC (downloaded to a temporary
# directory, whose libraries are never needed here) into DEST; 1 if they could not be had.
cache_headers() {
    local spec=$1 inzip=$2 dest=$3 wheel_dir rc=0
    shift 3
    wheel_dir=$(mktemp -d)
    "$PY" -m pip download --quiet --disable-pip-version-check --no-deps "$spec" -d "$wheel_dir" &&
    "$PY" -c 'import glob, os, sys, zipfile
wheel, = glob.glob(os.path.join(sys.argv[1], "*.whl"))
os.makedirs(sys.argv[3], exist_ok=True)
with zipfile.ZipFile(wheel) as z:
    for name in sys.argv[4:]:
        data = z.read(sys.argv[2] + "/" + name)
        tmp = os.path.join(sys.argv[3], "." + name + ".tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(sys.argv[3], name))' "$wheel_dir" "$inzip" "$dest" "$@" || rc=1
    rm -rf "$wheel_dir"
    return $rc
}
# an nvidia/cu13 package already installed (a CUDA PyTorch's) that has the header: nothing to cache
have_cu13_header() {
    "$PY" -c 'import nvidia.cu13, os, sys
sys.exit(not any(os.path.isfile(os.path.join(p, "include", sys.argv[1])) for p in nvidia.cu13.__path__))' "$1" 2>/dev/null
}
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/jitckpt

# cuBLAS (issue 19: transparent mode forwards cuBLAS and cuBLASLt; the emulator implements part of them): the
# headers of nvidia-cublas (444 MB), where interpose/, proxy_server/ and emulator/ look (Makefiles: CUBLAS_INCLUDE).
if [ ! -f "$CACHE/cublas-13/include/cublasLt.h" ] && ! have_cu13_header cublasLt.h; then
    say "caching cuBLAS's headers (cublas_api.h, cublas_v2.h, cublasLt.h of nvidia-cublas 13) in $CACHE/cublas-13/include"
    if ! cache_headers "nvidia-cublas>=13,<14" nvidia/cu13/include "$CACHE/cublas-13/include" \
            cublas_api.h cublas_v2.h cublasLt.h; then
        say "warning: could not cache cuBLAS's headers; cuBLAS is then neither forwarded nor emulated, and its"
        say "         tests are skipped"
    fi
fi
# cuDNN (issue 19: forwarded and emulated as cuBLAS is): the headers of nvidia-cudnn-cu13 (517 MB)
# (Makefiles: CUDNN_INCLUDE).
CUDNN_HEADERS="cudnn.h cudnn_version.h cudnn_graph.h cudnn_ops.h cudnn_cnn.h cudnn_adv.h cudnn_backend.h
               cudnn_subquadratic_ops.h cudnn_gnn_ops.h"
if [ ! -f "$CACHE/cudnn-9/include/cudnn_gnn_ops.h" ] && ! "$PY" -c 'import nvidia.cudnn, os, sys
sys.exit(not any(os.path.isfile(os.path.join(p, "include", "cudnn_graph.h")) for p in nvidia.cudnn.__path__))' 2>/dev/null; then
    say "caching cuDNN's headers (cudnn*.h of nvidia-cudnn-cu13 9) in $CACHE/cudnn-9/include"
    # shellcheck disable=SC2086
    if ! cache_headers "nvidia-cudnn-cu13>=9,<10" nvidia/cudnn/include "$CACHE/cudnn-9/include" $CUDNN_HEADERS; then
        say "warning: could not cache cuDNN's headers; cuDNN is then neither forwarded nor emulated, and its"
        say "         tests are skipped"
    fi
fi
if ! "$PY" -c 'import jitckpt, pytest, xdist, pytest_timeout, elftools, matplotlib, cffi, xxhash, transformers, lightning, pytorch_lightning, pyeclib' 2>/dev/null || ! command -v jit-run >/dev/null; then
    say "installing jitckpt (editable, with test, plot, frameworks and rs extras); this also builds the native parts"
    # An isolated build, as any install: it uses the toolkit's CUDA headers and the nccl.h of the
    # nvidia-nccl-cu13 installed above, and fetches header wheels only for what is missing (native_build.py)
    "$PY" -m pip install --quiet --disable-pip-version-check -e ".[test,plot,frameworks,rs]"
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
NCCL_OLDEST=2.27.7
if [ ! -f "$CACHE/nccl-$NCCL_OLDEST/include/nccl.h" ]; then
    say "caching nccl.h of NCCL $NCCL_OLDEST (the oldest the native parts build against) in $CACHE/nccl-$NCCL_OLDEST/include"
    if ! cache_headers "nvidia-nccl-cu13==$NCCL_OLDEST" nvidia/nccl/include "$CACHE/nccl-$NCCL_OLDEST/include" nccl.h; then
        say "warning: could not cache NCCL $NCCL_OLDEST's nccl.h; tests/test_native_nccl_versions.py will fail"
    fi
fi
# ---- byte code, once ----
# Environments that set PYTHONDONTWRITEBYTECODE (CI's does) would compile jitckpt in every process
# that imports it: the launcher, each agent and each worker, ~0.15 s of CPU each, thousands of
# times in a test run.  Compiled once here; Python still checks each file's time stamp.
PYTHONDONTWRITEBYTECODE= "$PY" -m compileall -q jitckpt examples tests >/dev/null ||
    say "warning: could not compile jitckpt's byte code (every process will compile it again)"
say "done"
