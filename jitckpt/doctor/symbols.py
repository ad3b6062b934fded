"""Categories of CUDA and NCCL symbol names: which API a name belongs to.

The lowest layer of the doctor: pure facts about names, nothing read from
disk.  ``categorize`` sorts a symbol into the CUDA runtime, the driver API,
NCCL, cuBLAS, cuDNN or another CUDA library; ``HIDDEN_ENTRY_POINTS`` are the
runtime functions nvcc emits into every program with device code.
"""

from __future__ import annotations

import re
from typing import Optional

#: The version node of every CUDA 13 runtime symbol (real library and emulator).
RUNTIME_VERSION_NODE = "libcudart.so.13"
#: The hidden entry points nvcc 13 emits into programs (DESIGN decision 5).
HIDDEN_ENTRY_POINTS: tuple[str, ...] = (
    "__cudaRegisterFatBinary",
    "__cudaRegisterFatBinaryEnd",
    "__cudaRegisterFunction",
    "__cudaRegisterVar",
    "__cudaRegisterManagedVar",
    "__cudaUnregisterFatBinary",
    "__cudaPushCallConfiguration",
    "__cudaPopCallConfiguration",
    "__cudaGetKernel",
    "__cudaLaunchKernel",
    "__cudaLaunchKernel_ptsz",
    "__cudaInitModule",
)

# Symbol categories
RUNTIME = "runtime"
DRIVER = "driver"
NCCL = "nccl"
CUBLAS = "cublas"
CUDNN = "cudnn"
CUDA_LIBRARY = "cuda-library"

CATEGORY_TITLES: dict[str, str] = {
    RUNTIME: "CUDA runtime",
    DRIVER: "CUDA driver API",
    NCCL: "NCCL",
    CUBLAS: "cuBLAS",
    CUDNN: "cuDNN",
    CUDA_LIBRARY: "other CUDA library",
}

_CATEGORY_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (CUDNN, re.compile(r"cudnn[A-Z]")),
    (CUBLAS, re.compile(r"cublas")),
    (RUNTIME, re.compile(r"(?:__)?cuda[A-Z]")),
    (NCCL, re.compile(r"p?nccl[A-Z]")),
    (CUDA_LIBRARY, re.compile(r"(?:cufft|cusparse|cusolver|curand|cuFile|nvrtc|nvJitLink)[A-Za-z_]")),
    (DRIVER, re.compile(r"cu[A-Z]")),
)


def categorize(name: str) -> Optional[str]:
    """The category of a symbol name (``RUNTIME``, ``DRIVER``, ...), or None if it is not CUDA/NCCL."""
    for category, pattern in _CATEGORY_PATTERNS:
        if pattern.match(name):
            return category
    return None
