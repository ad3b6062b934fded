#!/usr/bin/env bash
# Install jitckpt, with its native parts, into a job image's Python: what docker/Dockerfile runs, and what
# tests/test_wheel.py runs outside Docker in a fresh virtual environment (no engine runs in CI).
#
#   PYTHON=/path/to/python bash scripts/install-image.sh
#
# 1. PyTorch: kept if this Python has it; else pip installs $JITCKPT_TORCH (default "torch", PyPI's
#    build with CUDA; JITCKPT_TORCH_INDEX_URL picks another index, e.g. PyTorch's CPU builds).
# 2. jitckpt as a wheel, built the way any admin would: `pip wheel .`, isolated.  The build asks pip
#    for the headers this machine lacks (the CUDA 13 runtime headers, NCCL's nccl.h: native_build.py),
#    so no CUDA toolkit or CUDA base image is needed; it fails with the reason if the native parts
#    cannot be built (JITCKPT_BUILD_NATIVE=0 builds a pure-Python jitckpt on purpose).
#    JITCKPT_WHEEL_DIR keeps the wheel (default: a temporary directory).
# 3. The wheel installed, then checked from outside the source tree: the installed jitckpt must find
#    its own CPU device emulator, interposition libraries and device proxy; says which headers they
#    were built against.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
PIP=("$PY" -m pip --disable-pip-version-check)
say() { printf '[install-image] %s\n' "$*"; }

if "$PY" -c 'import torch' 2>/dev/null; then
    say "torch $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null) is already installed"
else
    index=()
    if [[ -n ${JITCKPT_TORCH_INDEX_URL:-} ]]; then index=(--index-url "$JITCKPT_TORCH_INDEX_URL"); fi
    say "installing ${JITCKPT_TORCH:-torch}"
    "${PIP[@]}" install "${index[@]}" "${JITCKPT_TORCH:-torch}"
fi

wheels=${JITCKPT_WHEEL_DIR:-}
if [[ -z $wheels ]]; then
    wheels=$(mktemp -d)
    trap 'rm -rf "$wheels"' EXIT
fi
mkdir -p "$wheels"
say "building the jitckpt wheel (isolated: pip fetches the headers this machine lacks)"
"${PIP[@]}" wheel --no-deps --wheel-dir "$wheels" .
wheel=$(ls -t "$wheels"/jitckpt-*.whl | head -1)
say "installing $(basename "$wheel")"
# --force-reinstall --no-deps: this wheel even if a jitckpt of the same version is visible; then its dependencies
"${PIP[@]}" install --force-reinstall --no-deps "$wheel"
# with the rs extra: ISA-L (in pyeclib's wheels) for the memory tier's Reed-Solomon scheme
"${PIP[@]}" install "$wheel[rs]"

# The check runs outside the source tree, so that it imports the installed package.
(cd / && "$PY" - <<'EOF'
"""The installed jitckpt finds its own native parts, or was built without them on purpose."""
import sys

from jitckpt import native

info = native.build_info() or {}
if info.get("native") is False:
    print(f"[install-image] jitckpt installed without its native parts: {info.get('reason')}")
    sys.exit(0)
missing = [f"{part}/{name}" for part, names in native.FILES.items() for name in names
           if not (native.PACKAGE_BUILD / part / name).exists()]
if missing or not info:
    sys.exit(f"[install-image] error: the installed jitckpt ({native.PACKAGE_BUILD}) lacks "
             f"{', '.join(missing) or 'its build record'}")
cuda, nccl = info.get("cuda_headers", {}), info.get("nccl_header", {})
print(f"[install-image] jitckpt installed with its native parts in {native.PACKAGE_BUILD} (the CPU device "
      f"emulator, the interposition libraries, jitckpt-proxy), built against the CUDA {cuda.get('version')} "
      f"runtime headers ({cuda.get('how')}) and NCCL {nccl.get('version')}'s header ({nccl.get('how')})")
forwarded = info.get("forwarded", {})
print("[install-image] transparent mode forwards " + (", ".join(n for n, on in forwarded.items() if on) or "none")
      + " of NVIDIA's libraries" + ("".join(f"; {n}: not forwarded (its headers were not found at build time), its "
                                            "calls are refused" for n, on in forwarded.items() if not on)))
EOF
)
