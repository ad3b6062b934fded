#!/usr/bin/env python3
"""Generate the emulated cuBLAS's table of cublasStatus_t names and descriptions,
the one table of libcublas (cublasGetStatusName/String) and libcublasLt
(cublasLtGetStatusName/String: cuBLASLt shares cublasStatus_t and its strings).

Reads ``typedef enum { ... } cublasStatus_t;`` from the real ``cublas_api.h``,
so that names and values are exactly NVIDIA's, as gen_cudnn_status.py reads
cudnnStatus_t (whose parsing and output it uses).  The header documents no
status, so the descriptions are those cublasGetStatusString returns, by name,
below; a status the header has and this list lacks is described by its name.
A value the header does not define is "CUBLAS_STATUS_UNKNOWN", "unknown error".
Usage:

    gen_cublas_status.py cublas_api.h OUT.inc
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = True  # make runs it in the source tree: no tools/__pycache__
from gen_cudnn_status import c_string, current_names, enum_entries, write_table  # noqa: E402

# What cublasGetStatusString says for each status.
DESCRIPTIONS = {
    "CUBLAS_STATUS_SUCCESS": "success",
    "CUBLAS_STATUS_NOT_INITIALIZED": "the library was not initialized",
    "CUBLAS_STATUS_ALLOC_FAILED": "the resource allocation failed",
    "CUBLAS_STATUS_INVALID_VALUE": "an invalid numeric value was used as an argument",
    "CUBLAS_STATUS_ARCH_MISMATCH": "an absent device architectural feature is required",
    "CUBLAS_STATUS_MAPPING_ERROR": "an access to GPU memory space failed",
    "CUBLAS_STATUS_EXECUTION_FAILED": "the GPU program failed to execute",
    "CUBLAS_STATUS_INTERNAL_ERROR": "an internal operation failed",
    "CUBLAS_STATUS_NOT_SUPPORTED": "the functionality requested is not supported",
    "CUBLAS_STATUS_LICENSE_ERROR": "the functionality requested requires some license",
}


def main() -> int:
    header, out = sys.argv[1], sys.argv[2]
    entries = enum_entries(header, "cublasStatus_t", "CUBLAS_STATUS_")
    names = {name: number for number, name, _, _ in entries}
    if len(entries) < 10 or names.get("CUBLAS_STATUS_SUCCESS") != 0 or "CUBLAS_STATUS_INVALID_VALUE" not in names:
        sys.exit(f"{header}: only {len(entries)} cublasStatus_t values parsed; header format changed?")
    rows = {number: (name, c_string(DESCRIPTIONS.get(name, name)))
            for number, (name, _) in current_names(entries).items()}
    write_table(out, "gen_cublas_status.py", "cublas_api.h", "cublasStatus_t", rows,
                "CUBLAS_STATUS_UNKNOWN", "unknown error")
    return 0


if __name__ == "__main__":
    sys.exit(main())
