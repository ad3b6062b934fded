"""Conformance tests of the emulated cuBLASLt (``emulator/build/libcublasLt.so.13``).

``make -C emulator`` builds it against NVIDIA's own ``cublasLt.h`` (cached by
``scripts/setup.sh`` in ``~/.cache/jitckpt/cublas-13/include`` next to
``cublas_api.h``; ``CUBLAS_INCLUDE`` overrides).
``tests/emulator_programs/cublaslt_gemm.c`` is a plain C program against the
real ``cublasLt.h``, linked with the emulator's libcublasLt, libcublas and
libcudart.  Per matmul case it prints a hash of the m x n results, the largest
difference from a long double host reference, how many elements differ from
the host's repetition of the documented fixed-order computation
(``emulator/README.md``, "cuBLASLt"), and how many padding elements changed;
then the status of every argument error it provokes.  Its ``train`` mode runs
a short training loop and prints ``checksum <16 hex digits>``.  The assertions
are here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from emulator_library import (REQUIRES_GCC_CUDA_HEADERS_NCCL, assert_device_only_through_the_private_interface,
                              assert_exports_exactly, assert_soname_and_symlink, build_library, gcc_program, infos,
                              make_with, makefile_include, results, run, statuses)

PROGRAM = Path(__file__).resolve().parent / "emulator_programs" / "cublaslt_gemm.c"

# Where emulator/Makefile finds cublas_api.h; it builds libcublasLt only with cublasLt.h beside it (the program
# also includes cublas_v2.h).
CUBLAS_INCLUDE = makefile_include("CUBLAS_INCLUDE", "cublas-13", probe=("cublas_api.h",),
                                  needs=("cublasLt.h", "cublas_v2.h"))

pytestmark = [
    *REQUIRES_GCC_CUDA_HEADERS_NCCL,
    pytest.mark.skipif(CUBLAS_INCLUDE is None,
                       reason="cublasLt.h not found: run scripts/setup.sh (it caches the cuBLAS headers in "
                              "~/.cache/jitckpt/cublas-13/include) or set CUBLAS_INCLUDE=/path/to/include"),
]

# Exactly what the emulated libcublasLt.so.13 exports (emulator/cublasLt.map).
EXPORTED = {
    "cublasLtCreate", "cublasLtDestroy", "cublasLtGetVersion", "cublasLtGetCudartVersion",
    "cublasLtGetStatusName", "cublasLtGetStatusString",
    "cublasLtMatmulDescCreate", "cublasLtMatmulDescDestroy",
    "cublasLtMatmulDescSetAttribute", "cublasLtMatmulDescGetAttribute",
    "cublasLtMatrixLayoutCreate", "cublasLtMatrixLayoutDestroy",
    "cublasLtMatrixLayoutSetAttribute", "cublasLtMatrixLayoutGetAttribute",
    "cublasLtMatmulPreferenceCreate", "cublasLtMatmulPreferenceDestroy",
    "cublasLtMatmulPreferenceSetAttribute", "cublasLtMatmulPreferenceGetAttribute",
    "cublasLtMatmulAlgoGetHeuristic", "cublasLtMatmul",
}

SUCCESS, NOT_INITIALIZED, INVALID_VALUE, NOT_SUPPORTED = 0, 1, 7, 15

# Problems that both cublasLtMatmul and the heuristic must refuse, with the status
# (the heuristic then returns no algorithm).
REFUSED_BY_BOTH = {
    "row_order": NOT_SUPPORTED,
    "dims_mismatch": INVALID_VALUE,
    "lda_below_rows": INVALID_VALUE,
    "batch_mismatch": INVALID_VALUE,
    "f16_A": NOT_SUPPORTED,
    "mixed_32f_64f": NOT_SUPPORTED,
    "compute_64f_data_32f": NOT_SUPPORTED,
    "pointer_mode_device_vector": NOT_SUPPORTED,
    "transc_T": NOT_SUPPORTED,
    "bad_transa": INVALID_VALUE,
    "epilogue_relu_aux": NOT_SUPPORTED,
    "epilogue_dgelu_bgrad": NOT_SUPPORTED,
    "bias_type_16f": NOT_SUPPORTED,
    "a_scale_pointer": INVALID_VALUE,     # documented: INVALID_VALUE for types without scaling
}

# The statuses the program's other checks must return (emulator/README.md, "cuBLASLt").
EXPECTED_STATUS = {
    "desc_set_transa": SUCCESS,
    "desc_set_transa_wrong_size": INVALID_VALUE,
    "desc_set_unknown_attribute": INVALID_VALUE,
    "desc_set_null_buf": INVALID_VALUE,
    "desc_set_null_desc": INVALID_VALUE,
    "desc_get_transa": SUCCESS,
    "desc_get_size_query_bias_pointer": SUCCESS,
    "desc_get_size_query_epilogue": SUCCESS,
    "desc_get_size_query_null_written": INVALID_VALUE,
    "desc_get_wrong_size": INVALID_VALUE,
    "desc_get_unknown_attribute": INVALID_VALUE,
    "desc_get_default_epilogue": SUCCESS,
    "desc_set_fast_accum": SUCCESS,
    "desc_set_sm_count_target": SUCCESS,
    "layout_get_rows": SUCCESS,
    "layout_set_rows_wrong_size": INVALID_VALUE,
    "layout_set_unknown_attribute": INVALID_VALUE,
    "layout_get_size_query_batch_count": SUCCESS,
    "pref_set_max_workspace": SUCCESS,
    "pref_set_max_workspace_wrong_size": INVALID_VALUE,
    "pref_set_unknown_attribute": INVALID_VALUE,
    "pref_set_min_alignment_a": SUCCESS,
    "pref_get_max_workspace": SUCCESS,
    "heuristic_valid": SUCCESS,
    "heuristic_cublas_handle": SUCCESS,
    "heuristic_null_handle": NOT_INITIALIZED,
    "heuristic_requested_zero": INVALID_VALUE,
    "heuristic_impl_mask_hmma_only": NOT_SUPPORTED,
    "matmul_valid": SUCCESS,
    "matmul_null_handle": NOT_INITIALIZED,
    "matmul_null_desc": INVALID_VALUE,
    "matmul_null_Bdesc": INVALID_VALUE,
    "matmul_null_alpha": INVALID_VALUE,
    "matmul_bad_algo": INVALID_VALUE,
    "matmul_host_memory_A": INVALID_VALUE,
    "matmul_D_past_end": INVALID_VALUE,
    "matmul_in_place_ld_mismatch": INVALID_VALUE,
    "matmul_cublas_handle": SUCCESS,
    "matmul_device_mode_host_alpha": INVALID_VALUE,
    "matmul_bias_null_pointer": INVALID_VALUE,
    "matmul_bias": SUCCESS,
    "matmul_valid_again": SUCCESS,
    "lt_create": SUCCESS,
    "lt_destroy": SUCCESS,
    "lt_destroy_twice": NOT_INITIALIZED,
    "lt_destroy_null": NOT_INITIALIZED,
    "lt_destroy_cublas_handle": NOT_INITIALIZED,
    "lt_create_null": INVALID_VALUE,
    "desc_create_null": INVALID_VALUE,
    "layout_create_null": INVALID_VALUE,
    "pref_create_null": INVALID_VALUE,
    "cublas_handle_still_live": SUCCESS,
    **{f"{api}_{name}": status for name, status in REFUSED_BY_BOTH.items() for api in ("matmul", "heuristic")},
}

# Cases that compute the same product in different ways (Lt or cuBLAS handle,
# heuristic or NULL algo, stream 0 or a created stream, host or device scalars
# and their timing, Lt or cublasGemmEx, N or C, 32F or FAST_TF32): same bits.
SAME_BITS = [
    {"f32_NN", "f32_NN_algo_null", "f32_NN_cublas_handle", "f32_NN_legacy_stream", "f32_NN_device_scalars",
     "f32_NN_host_scalars_copied", "f32_NN_device_scalars_read_late", "cublas_gemmex_f32_NN"},
    {"f32_TN", "f32_CN"},
    {"f32_TT", "f32_TT_fast_tf32"},
]


@pytest.fixture(scope="module")
def emulator() -> Path:
    return build_library("libcublasLt.so.13")


@pytest.fixture(scope="module")
def program(emulator: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cublaslt_gemm.c built with gcc against the real headers and the emulator's libraries."""
    return gcc_program(PROGRAM, tmp_path_factory.mktemp("cublaslt") / "cublaslt_gemm", CUBLAS_INCLUDE,
                       ["-l:libcublasLt.so.13", "-l:libcublas.so.13", "-l:libcudart.so.13"])


@pytest.fixture(scope="module")
def runs(program: Path) -> list[str]:
    """The program's output from two separate runs."""
    return [run(program).stdout for _ in range(2)]


def cases(stdout: str) -> dict[str, dict]:
    """The CASE lines, by name."""
    return results("CASE", stdout)


# ---- the library ------------------------------------------------------------------


def test_soname_and_symlink(emulator):
    assert_soname_and_symlink(emulator / "libcublasLt.so.13")


def test_exports_exactly_the_implemented_functions_in_node_libcublasLt_so_13(emulator):
    assert_exports_exactly(emulator / "libcublasLt.so.13", EXPORTED)


def test_reaches_the_device_only_through_the_private_interface(emulator):
    """Like the emulated cuBLAS: no cuda* import, and no dependency on libcublas."""
    assert_device_only_through_the_private_interface(emulator / "libcublasLt.so.13", ("cuda", "__cuda", "cublas"))


def test_make_skips_libcublaslt_with_a_note_without_the_header(emulator, tmp_path):
    """cublas_api.h present, cublasLt.h absent: libcublas builds, libcublasLt is skipped with a note."""
    (tmp_path / "cublas_api.h").symlink_to(CUBLAS_INCLUDE / "cublas_api.h")
    (tmp_path / "cublas_v2.h").symlink_to(CUBLAS_INCLUDE / "cublas_v2.h")
    stdout = make_with("CUBLAS_INCLUDE", tmp_path)
    assert "skipping libcublasLt.so.13: cublasLt.h not found" in stdout
    assert "scripts/setup.sh" in stdout
    assert "skipping libcublas.so.13" not in stdout


# ---- results ----------------------------------------------------------------------


def test_every_case_matches_the_reference_and_the_fixed_summation_order(runs):
    found = cases(runs[0])
    assert len(found) == 27, sorted(found)
    for name, v in found.items():
        tolerance = 1e-9 if name.startswith("f64") else 1e-3
        # maxdiff is NaN if a NaN in C survived a beta = 0 matmul: the comparison fails.
        assert v["maxdiff"] <= tolerance, (name, v)
        assert v["exact"] == 0, f"{name}: {v['exact']} elements differ from the fixed-order computation"
        assert v["pad"] == 0, f"{name}: {v['pad']} elements outside the m x n matrices changed"


def test_results_are_bit_identical_across_runs(runs):
    first, second = ({n: v["hash"] for n, v in cases(out).items()} for out in runs)
    assert first == second


def test_same_inputs_give_the_same_bits_on_any_handle_stream_pointer_mode_and_entry_point(runs):
    """Includes the timing cases: host scalars are copied at the call (the
    program overwrites alpha right after it, while the stream is busy), device
    scalars are read when the job runs (a stream-ordered copy queued before the
    matmul sets alpha).  cublasGemmEx of the emulated cuBLAS gives the same bits
    as cublasLtMatmul with the DEFAULT epilogue: one summation order."""
    found = cases(runs[0])
    for group in SAME_BITS:
        assert len({found[name]["hash"] for name in group}) == 1, {name: found[name]["hash"] for name in group}


def test_epilogues_change_the_result(runs):
    found = cases(runs[0])
    hashes = [found[n]["hash"] for n in ("f32_NN", "f32_NN_bias", "f32_TN_relu", "f32_NT_relu_bias",
                                         "f32_NN_gelu", "f32_TT_gelu_bias")]
    assert len(set(hashes)) == len(hashes)


# ---- statuses, attributes, handles ---------------------------------------------------------


def test_argument_errors_return_the_documented_statuses(runs):
    assert statuses(runs[0]) == EXPECTED_STATUS


def test_refused_problems_get_no_algorithm_from_the_heuristic(runs):
    info = infos(runs[0])
    for name in REFUSED_BY_BOTH:
        assert info[f"heuristic_{name}_count"] == "0", name
    assert info["heuristic_impl_mask_hmma_only_count"] == "0"


def test_attributes_heuristic_and_names(runs):
    info = infos(runs[0])
    assert info["desc_transa"] == "1 4"                  # CUBLAS_OP_T, 4 bytes written
    assert info["desc_bias_pointer_size"] == "8"         # sizeInBytes 0: the size needed
    assert info["desc_epilogue_size"] == "4"
    assert info["desc_default_epilogue"] == "1"          # CUBLASLT_EPILOGUE_DEFAULT
    assert info["desc_scale_type"] == "0"                # CUDA_R_32F, from cublasLtMatmulDescCreate
    assert info["layout_rows"] == "8 8"
    assert info["layout_batch_count_size"] == "4"
    assert info["layout_default_batch_count"] == "1"
    assert info["pref_max_workspace"] == "4194304 8"
    # one algorithm, no workspace, state SUCCESS, wavesCount 1.0
    assert info["heuristic_result"] == "1 0 0 1"
    assert 130000 <= int(info["version"]) < 140000
    assert 13000 <= int(info["cudart_version"]) < 14000
    assert info["status_name_7"] == "CUBLAS_STATUS_INVALID_VALUE"
    assert info["status_name_15"] == "CUBLAS_STATUS_NOT_SUPPORTED"
    assert info["status_string_1"] == "the library was not initialized"


# ---- the training loop ------------------------------------------------------------------


def test_train_checksum_is_deterministic_and_matches_the_host_loop(program):
    outs = [run(program, "train").stdout for _ in range(2)]
    sums = [re.findall(r"^checksum ([0-9a-f]{16})$", out, re.M) for out in outs]
    assert all(len(s) == 1 for s in sums), outs
    assert sums[0] == sums[1]
    # the same loop computed on the host, in the emulator's order, gives the same bytes
    assert re.findall(r"^reference_checksum ([0-9a-f]{16})$", outs[0], re.M) == sums[0]
    info = infos(outs[0])
    assert float(info["loss_last"]) < float(info["loss_first"])  # it does train
