"""Conformance tests of the emulated cuBLAS (``emulator/build/libcublas.so.13``).

``make -C emulator`` builds it against NVIDIA's own ``cublas_api.h`` (cached by
``scripts/setup.sh`` in ``~/.cache/jitckpt/cublas-13/include``; ``CUBLAS_INCLUDE``
overrides).  ``tests/emulator_programs/cublas_gemm.c`` is a plain C program
against the real ``cublas_v2.h``, linked with the emulator's libcublas and
libcudart; it runs every implemented GEMM variant and prints, per variant, a
hash of the result bytes, the largest difference from a host reference in
long double, and how many elements differ from the documented fixed-order
sum (``emulator/README.md``, "cuBLAS"), then the status of every argument
error it provokes.  The assertions are here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from emulator_library import (REQUIRES_GCC_CUDA_HEADERS_NCCL, assert_device_only_through_the_private_interface,
                              assert_exports_exactly, assert_soname_and_symlink, build_library, gcc_program, infos,
                              make_with, makefile_include, results, run, statuses)

PROGRAM = Path(__file__).resolve().parent / "emulator_programs" / "cublas_gemm.c"

# Where emulator/Makefile finds cublas_api.h (the program also includes cublas_v2.h, beside it).
CUBLAS_INCLUDE = makefile_include("CUBLAS_INCLUDE", "cublas-13", probe=("cublas_api.h",), needs=("cublas_v2.h",))

pytestmark = [
    *REQUIRES_GCC_CUDA_HEADERS_NCCL,
    pytest.mark.skipif(CUBLAS_INCLUDE is None,
                       reason="cublas_api.h not found: run scripts/setup.sh (it caches the cuBLAS headers in "
                              "~/.cache/jitckpt/cublas-13/include) or set CUBLAS_INCLUDE=/path/to/include"),
]

# Exactly what the emulated libcublas.so.13 exports (emulator/cublas.map).
EXPORTED = {
    "cublasCreate_v2", "cublasDestroy_v2", "cublasGetVersion_v2",
    "cublasSetStream_v2", "cublasGetStream_v2",
    "cublasSetMathMode", "cublasGetMathMode", "cublasSetWorkspace_v2",
    "cublasSetPointerMode_v2", "cublasGetPointerMode_v2",
    "cublasGetStatusName", "cublasGetStatusString",
    "cublasSgemm_v2", "cublasDgemm_v2", "cublasSgemmStridedBatched", "cublasDgemmStridedBatched",
    "cublasGemmEx", "cublasGemmStridedBatchedEx",
}

SUCCESS, NOT_INITIALIZED, INVALID_VALUE, NOT_SUPPORTED = 0, 1, 7, 15

# The statuses the program's argument errors must return (emulator/README.md, "cuBLAS").
EXPECTED_STATUS = {
    "valid_sgemm": SUCCESS,
    "null_handle": NOT_INITIALIZED,
    "destroyed_handle": NOT_INITIALIZED,
    "destroyed_handle_set_stream": NOT_INITIALIZED,
    "destroy_twice": NOT_INITIALIZED,
    "create_null": INVALID_VALUE,
    "negative_m": INVALID_VALUE,
    "negative_n": INVALID_VALUE,
    "negative_k": INVALID_VALUE,
    "lda_below_m_N": INVALID_VALUE,
    "lda_5_N_m4_k6": SUCCESS,            # N: lda >= max(1, m)
    "lda_5_T_m4_k6": INVALID_VALUE,      # T: lda >= max(1, k)
    "ldb_below_k_N": INVALID_VALUE,
    "ldb_below_n_T": INVALID_VALUE,
    "ldc_below_m": INVALID_VALUE,
    "lda_zero_m0": INVALID_VALUE,        # max(1, 0)
    "bad_transa": INVALID_VALUE,         # CUBLAS_OP_CONJG
    "bad_transb": INVALID_VALUE,
    "null_alpha": INVALID_VALUE,
    "m_zero_null_matrices": SUCCESS,     # nothing to do, nothing read
    "host_memory_A": INVALID_VALUE,      # not emulated device memory
    "A_past_end": INVALID_VALUE,         # runs past its allocation
    "C_past_end": INVALID_VALUE,
    "negative_batch": INVALID_VALUE,
    "batch_past_end": INVALID_VALUE,
    "batch_zero": SUCCESS,
    "device_mode_host_alpha": INVALID_VALUE,
    "ex_valid_32f": SUCCESS,
    "ex_r16f": NOT_SUPPORTED,
    "ex_bf16_in_32f_out": NOT_SUPPORTED,
    "ex_mixed_32f_64f": NOT_SUPPORTED,
    "ex_32f_compute_64f": NOT_SUPPORTED,
    "ex_64f_compute_32f": NOT_SUPPORTED,
    "ex_compute_32i": NOT_SUPPORTED,
    "ex_complex_32f": NOT_SUPPORTED,
    "ex_bad_algo": INVALID_VALUE,
    "ex_null_handle": NOT_INITIALIZED,
    "ex_batched_r16f": NOT_SUPPORTED,
    "ex_batched_negative_batch": INVALID_VALUE,
    "dgemm_batched_lda_small": INVALID_VALUE,
    "get_version": SUCCESS,
    "get_version_null": INVALID_VALUE,
    "set_stream": SUCCESS,
    "get_stream": SUCCESS,
    "get_stream_null": INVALID_VALUE,
    "set_pointer_mode_device": SUCCESS,
    "get_pointer_mode": SUCCESS,
    "set_pointer_mode_bad": INVALID_VALUE,
    "set_pointer_mode_host": SUCCESS,
    "set_math_mode_tf32": SUCCESS,
    "get_math_mode": SUCCESS,
    "set_math_mode_bad": INVALID_VALUE,
    "set_math_mode_default": SUCCESS,
    "set_workspace": SUCCESS,
    "get_math_mode_null_handle": NOT_INITIALIZED,
}

# Variants the program runs on the same inputs in different ways (stream 0 or
# a created stream, host or device scalars, typed or Ex entry point, C or T):
# their results must be the same bits.
SAME_BITS = [
    {"sgemm_NN", "sgemm_NN_legacy", "sgemm_NN_device_scalars", "gemmex_32f_NN",
     "sgemm_host_scalars_copied", "sgemm_device_scalars_read_late", "sgemm_NN_captured"},
    {"dgemm_batched_TN", "dgemm_batched_TN_captured"},
    {"sgemm_TN", "sgemm_CN"},
    {"sgemm_TT", "gemmex_32f_fast_tf32_TT"},
    {"dgemm_TT", "dgemm_TT_legacy_device_scalars"},
    {"dgemm_NT", "gemmex_64f_NT"},
    {"dgemm_TN", "gemmex_64f_TN_device_scalars"},
]


@pytest.fixture(scope="module")
def emulator() -> Path:
    return build_library("libcublas.so.13")


@pytest.fixture(scope="module")
def program(emulator: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cublas_gemm.c built with gcc against the real headers and the emulator's libraries."""
    return gcc_program(PROGRAM, tmp_path_factory.mktemp("cublas") / "cublas_gemm", CUBLAS_INCLUDE,
                       ["-l:libcublas.so.13", "-l:libcudart.so.13"], werror=False)


@pytest.fixture(scope="module")
def runs(program: Path) -> list[str]:
    """The program's output from two separate runs."""
    return [run(program).stdout for _ in range(2)]


def variants(stdout: str) -> dict[str, dict]:
    """The VARIANT lines, by name."""
    return results("VARIANT", stdout)


# ---- the library ------------------------------------------------------------------


def test_soname_and_symlink(emulator):
    assert_soname_and_symlink(emulator / "libcublas.so.13")


def test_exports_exactly_the_implemented_functions_in_node_libcublas_so_13(emulator):
    assert_exports_exactly(emulator / "libcublas.so.13", EXPORTED)


def test_reaches_the_device_only_through_the_private_interface(emulator):
    """Like the emulated NCCL: no cuda* import, so a runtime interposer sees none of cuBLAS's work."""
    assert_device_only_through_the_private_interface(emulator / "libcublas.so.13", ("cuda", "__cuda"))


def test_make_skips_libcublas_with_a_note_without_the_header(emulator, tmp_path):
    stdout = make_with("CUBLAS_INCLUDE", tmp_path)
    assert "skipping libcublas.so.13: cublas_api.h not found" in stdout
    assert "scripts/setup.sh" in stdout


# ---- results ----------------------------------------------------------------------


def test_every_gemm_variant_matches_the_reference_and_the_fixed_summation_order(runs):
    found = variants(runs[0])
    assert len(found) == 33, sorted(found)
    for name, v in found.items():
        tolerance = 1e-9 if name.startswith(("dgemm", "gemmex_64f", "gemmex_batched_64f")) else 1e-3
        # maxdiff is NaN if a NaN in C survived a beta = 0 GEMM: the comparison fails.
        assert v["maxdiff"] <= tolerance, (name, v)
        assert v["exact"] == 0, f"{name}: {v['exact']} elements differ from the fixed-order sum"
        assert v["pad"] == 0, f"{name}: {v['pad']} elements outside the m x n matrices changed"


def test_results_are_bit_identical_across_runs(runs):
    first, second = ({n: v["hash"] for n, v in variants(out).items()} for out in runs)
    assert first == second


def test_same_inputs_give_the_same_bits_on_any_stream_pointer_mode_and_entry_point(runs):
    """Includes the timing variants: host scalars are copied at the call (the
    program overwrites alpha right after it, while the stream is busy),
    device scalars are read when the job runs (a stream-ordered copy queued
    before the GEMM sets alpha), and a GEMM captured into a graph runs at the
    launch, not at the capture (the program checks that C is untouched before)."""
    found = variants(runs[0])
    for group in SAME_BITS:
        assert len({found[name]["hash"] for name in group}) == 1, {name: found[name]["hash"] for name in group}


# ---- statuses and settings ------------------------------------------------------------


def test_argument_errors_return_the_documented_statuses(runs):
    assert statuses(runs[0]) == EXPECTED_STATUS


def test_settings_and_names(runs):
    info = infos(runs[0])
    assert 130000 <= int(info["version"]) < 140000
    assert info["get_stream_matches"] == "1"
    assert info["pointer_mode"] == "1"       # CUBLAS_POINTER_MODE_DEVICE
    assert info["math_mode"] == "3"          # CUBLAS_TF32_TENSOR_OP_MATH, recorded
    assert info["status_name_7"] == "CUBLAS_STATUS_INVALID_VALUE"
    assert info["status_name_15"] == "CUBLAS_STATUS_NOT_SUPPORTED"
    assert info["status_string_1"] == "the library was not initialized"
