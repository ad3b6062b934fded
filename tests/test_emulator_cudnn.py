"""Conformance tests of the emulated cuDNN 9 (``emulator/build/libcudnn.so.9``).

``make -C emulator`` builds it against NVIDIA's own cuDNN 9 headers (those of an
installed ``nvidia-cudnn-cu13``, else the copies ``scripts/setup.sh`` caches in
``~/.cache/jitckpt/cudnn-9/include``; ``CUDNN_INCLUDE`` overrides).
``tests/emulator_programs/cudnn_conv.c`` is a plain C program against the real
headers, linked with ``-lcudnn -lcudart`` and resolved through
``LD_LIBRARY_PATH`` (no rpath).  Per convolution (backend API: tensors,
convolution, operation, graph, heuristics, engine configuration, plan,
workspace, variant pack, execute) and per batch normalization (legacy API) it
prints a hash of the results, the largest difference from a long double host
reference, how many elements differ from the host's repetition of the
documented fixed-order computation (``emulator/README.md``, "cuDNN"), and how
many elements outside the output tensor changed; then the status of every
argument error it provokes.  Its ``train`` mode runs a tiny conv net (conv,
BatchNorm, conv) for a few steps and prints ``checksum <16 hex digits>``.
The assertions are here.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from emulator_library import (REQUIRES_GCC_CUDA_HEADERS_NCCL, assert_device_only_through_the_private_interface,
                              assert_exports_exactly, assert_soname_and_symlink, build_library, dyn_symbols,
                              gcc_program, infos, make_with, makefile_include, package_dir, results, run, statuses)
from native_toolchain import EMULATOR_BUILD

PROGRAM = Path(__file__).resolve().parent / "emulator_programs" / "cudnn_conv.c"

# Where emulator/Makefile finds cudnn.h and cudnn_graph.h: an installed nvidia-cudnn-cu13 first.
CUDNN_INCLUDE = makefile_include("CUDNN_INCLUDE", "cudnn-9", probe=("cudnn.h", "cudnn_graph.h"),
                                 package="nvidia.cudnn")

pytestmark = [
    *REQUIRES_GCC_CUDA_HEADERS_NCCL,
    pytest.mark.skipif(CUDNN_INCLUDE is None,
                       reason="cudnn.h not found: run scripts/setup.sh (it caches cuDNN's headers in "
                              "~/.cache/jitckpt/cudnn-9/include) or set CUDNN_INCLUDE=/path/to/include"),
]

# Exactly what the emulated libcudnn.so.9 exports (emulator/cudnn.map).
EXPORTED = {
    "cudnnCreate", "cudnnDestroy", "cudnnSetStream", "cudnnGetStream", "cudnnGetVersion",
    "cudnnGetCudartVersion", "cudnnGetProperty", "cudnnGetErrorString", "cudnnGetLastErrorString",
    "cudnnBackendCreateDescriptor", "cudnnBackendDestroyDescriptor", "cudnnBackendInitialize",
    "cudnnBackendFinalize", "cudnnBackendSetAttribute", "cudnnBackendGetAttribute", "cudnnBackendExecute",
    "cudnnCreateTensorDescriptor", "cudnnDestroyTensorDescriptor", "cudnnSetTensor4dDescriptor",
    "cudnnSetTensor4dDescriptorEx", "cudnnSetTensorNdDescriptor", "cudnnGetTensorNdDescriptor",
    "cudnnDeriveBNTensorDescriptor", "cudnnBatchNormalizationForwardTraining",
    "cudnnBatchNormalizationForwardTrainingEx", "cudnnBatchNormalizationForwardInference",
    "cudnnBatchNormalizationBackward", "cudnnBatchNormalizationBackwardEx",
    "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize",
    "cudnnGetBatchNormalizationBackwardExWorkspaceSize",
    "cudnnGetBatchNormalizationTrainingExReserveSpaceSize",
}

# cudnnStatus_t values (cudnn_graph.h).
SUCCESS, NOT_INITIALIZED = 0, 1001
BAD_PARAM, NULL_POINTER, MISALIGNED, NOT_FINALIZED, DUPLICATED, ATTRIBUTE_TYPE, DESCRIPTOR_TYPE = (
    2000, 2002, 2003, 2004, 2009, 2010, 2012)
NOT_SUPPORTED, NOT_SUPPORTED_DATA_TYPE = 3000, 3003

# The statuses the program's checks must return (emulator/README.md, "cuDNN").
EXPECTED_STATUS = {
    # backend descriptors
    "create_null_out": NULL_POINTER,
    "create_pointwise": NOT_SUPPORTED,
    "create_matmul_op": NOT_SUPPORTED,
    "initialize": NOT_SUPPORTED,
    "set_wrong_attribute_type": ATTRIBUTE_TYPE,
    "set_wrong_count": BAD_PARAM,
    "set_negative_count": BAD_PARAM,
    "set_null_array": NULL_POINTER,
    "set_too_many_dims": BAD_PARAM,
    "set_foreign_attribute": BAD_PARAM,
    "set_null_descriptor": BAD_PARAM,
    "get_before_finalize": NOT_INITIALIZED,
    "finalize_tensor_without_alignment": BAD_PARAM,
    "finalize_tensor_alignment_2_for_float": BAD_PARAM,
    "finalize_tensor": SUCCESS,
    "finalize_twice": BAD_PARAM,
    "set_after_finalize": NOT_INITIALIZED,
    "get_dims": SUCCESS,
    "get_dims_count_only": SUCCESS,
    "get_dims_requested_1": SUCCESS,
    "get_is_virtual": SUCCESS,
    "get_wrong_attribute_type": ATTRIBUTE_TYPE,
    "get_null_outputs": NULL_POINTER,
    "get_foreign_attribute": BAD_PARAM,
    "destroy": SUCCESS,
    "destroy_twice": BAD_PARAM,
    "destroy_null": BAD_PARAM,
    "finalize_tensor_zero_dim": BAD_PARAM,
    "conv_set_bad_mode": BAD_PARAM,
    "conv_finalize_without_dilations": BAD_PARAM,
    "conv_finalize_dilations_count_1": BAD_PARAM,
    "conv_finalize_zero_stride": BAD_PARAM,
    "op_set_x_to_conv_desc": DESCRIPTOR_TYPE,
    "op_set_alpha_int64": ATTRIBUTE_TYPE,
    "op_set_bwd_attribute": BAD_PARAM,
    "op_finalize_without_beta": BAD_PARAM,
    "op_finalize_wrong_output_size": BAD_PARAM,
    "op_finalize_unfinalized_tensor": NOT_FINALIZED,
    "op_finalize_destroyed_tensor": BAD_PARAM,
    "op_finalize_duplicate_uid": DUPLICATED,
    "op_get_alpha_double": SUCCESS,
    "op_get_x": SUCCESS,
    "graph_finalize_two_ops": NOT_SUPPORTED,
    "graph_set_ops_tensor": DESCRIPTOR_TYPE,
    "graph_set_bad_handle": BAD_PARAM,
    "graph_finalize_without_ops": BAD_PARAM,
    "graph_get_global_count_int32": ATTRIBUTE_TYPE,
    "engine_finalize_index_1": NOT_SUPPORTED,
    "engine_finalize_index_0": SUCCESS,
    "cfg_set_zero_knobs": SUCCESS,
    "cfg_finalize": SUCCESS,
    "cfg_get_intermediate_info": NOT_SUPPORTED,
    "cfg_finalize_unknown_knob": NOT_SUPPORTED,
    "layout_info_finalize": NOT_SUPPORTED,
    "layout_info_set": BAD_PARAM,
    "heur_finalize_without_mode": BAD_PARAM,
    "heur_finalize": SUCCESS,
    "heur_results_into_engine": DESCRIPTOR_TYPE,
    "plan_finalize_without_cfg": BAD_PARAM,
    "plan_finalize_without_handle": SUCCESS,       # deprecated attribute: optional
    "plan_get_workspace_int32": ATTRIBUTE_TYPE,
    "plan_get_json": NOT_SUPPORTED,
    "plan_get_run_only_uids": SUCCESS,
    "plan_get_engine_config": SUCCESS,
    "plan_set_after_finalize": NOT_INITIALIZED,
    # variant packs and execution
    "execute_unfinalized_pack": NOT_FINALIZED,
    "pack_finalize_count_mismatch": BAD_PARAM,
    "pack_finalize_duplicate_uids": DUPLICATED,
    "pack_finalize_without_workspace": BAD_PARAM,
    "execute_null_handle": BAD_PARAM,
    "execute_pack_as_plan": DESCRIPTOR_TYPE,
    "execute_ok": SUCCESS,
    "execute_missing_uid": BAD_PARAM,
    "execute_host_memory": BAD_PARAM,
    "execute_misaligned": MISALIGNED,
    "execute_output_too_small": BAD_PARAM,
    "execute_null_data_pointer": NULL_POINTER,
    "execute_null_workspace": NULL_POINTER,
    "execute_workspace_too_small": BAD_PARAM,
    # unsupported problems: the operation is valid, no engine computes it
    "half_op_finalize": SUCCESS,
    "half_engine_finalize": NOT_SUPPORTED_DATA_TYPE,
    "grouped_op_finalize": SUCCESS,
    "grouped_engine_finalize": NOT_SUPPORTED,
    # legacy tensor descriptors
    "tensor_set_nd_3_dims": NOT_SUPPORTED,
    "tensor_set_nd_zero_dim": BAD_PARAM,
    "tensor_set_nd_bad_type": BAD_PARAM,
    "tensor_set_4d_vect_c": NOT_SUPPORTED,
    "tensor_set_4d_negative": BAD_PARAM,
    "tensor_set_null": BAD_PARAM,
    "tensor_set_4d_nhwc": SUCCESS,
    "tensor_get_nd": SUCCESS,
    "tensor_set_4d_ex": SUCCESS,
    "tensor_get_nd_2": SUCCESS,
    "derive_spatial": SUCCESS,
    "derive_per_activation": SUCCESS,
    "derive_bad_mode": BAD_PARAM,
    "tensor_destroy": SUCCESS,
    "tensor_destroy_twice": BAD_PARAM,
    "tensor_destroy_null": SUCCESS,
    # batch normalization
    "bn_train_ok": SUCCESS,
    "bn_train_bad_handle": BAD_PARAM,
    "bn_train_bad_mode": BAD_PARAM,
    "bn_train_null_alpha": BAD_PARAM,
    "bn_train_null_x": BAD_PARAM,
    "bn_train_one_running_null": BAD_PARAM,
    "bn_train_one_save_null": BAD_PARAM,
    "bn_train_negative_epsilon": BAD_PARAM,
    "bn_train_per_activation_with_spatial_params": BAD_PARAM,
    "bn_train_host_memory_x": BAD_PARAM,
    "bn_train_double_params_for_float_x": BAD_PARAM,
    "bn_train_6d_x": BAD_PARAM,
    "bn_train_half_x": NOT_SUPPORTED,
    "bn_train_unset_descriptor": BAD_PARAM,
    "bn_train_ex_activation": NOT_SUPPORTED,
    "bn_infer_null_mean": BAD_PARAM,
    "bn_backward_one_saved_null": BAD_PARAM,
    "bn_backward_null_dscale": BAD_PARAM,
    "bn_backward_ex_add_activation": NOT_SUPPORTED,
    "bn_workspace_size": SUCCESS,
    "bn_workspace_size_null_out": BAD_PARAM,
    "bn_backward_workspace_size": SUCCESS,
    "bn_reserve_size": SUCCESS,
    "bn_reserve_size_activation": NOT_SUPPORTED,
    # handles and versions
    "create_null": BAD_PARAM,
    "create_second": SUCCESS,
    "get_stream_default": SUCCESS,
    "set_stream": SUCCESS,
    "get_stream": SUCCESS,
    "get_stream_null_out": BAD_PARAM,
    "destroy_second": SUCCESS,
    "destroy_second_again": BAD_PARAM,
    "set_stream_destroyed_handle": BAD_PARAM,
    "get_property_major": SUCCESS,
    "get_property_minor": SUCCESS,
    "get_property_patch": SUCCESS,
    "get_property_bad_type": BAD_PARAM,
    "get_property_null": BAD_PARAM,
}

# Cases that compute the same problem on the same data in different ways
# (stream, layout, a plan run twice, SPATIAL or SPATIAL_PERSISTENT, the plain or
# the Ex entry point): the same bits, since the summation order is the logical
# one.  For double data the saved inverse variance is exactly the recomputed one.
SAME_BITS = [
    {"f32_fwd", "f32_fwd_default_stream", "f32_fwd_channels_last", "f32_fwd_padded_strides", "f32_fwd_twice"},
    {"f32_bwd_data", "f32_bwd_data_channels_last"},
    {"f32_bwd_filter", "f32_bwd_filter_padded_strides"},
    {"bn_f32_train_spatial", "bn_f32_train_spatial_persistent", "bn_f32_train_ex", "bn_f32_train_channels_last"},
    {"bn_f32_backward_saved", "bn_f32_backward_ex_saved"},
    {"bn_f64_backward_saved", "bn_f64_backward_recomputed"},
]


@pytest.fixture(scope="module")
def emulator() -> Path:
    return build_library("libcudnn.so.9")


@pytest.fixture(scope="module")
def program(emulator: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """cudnn_conv.c built with gcc against the real headers, linked -lcudnn -lcudart (no rpath)."""
    return gcc_program(PROGRAM, tmp_path_factory.mktemp("cudnn") / "cudnn_conv", CUDNN_INCLUDE,
                       ["-lcudnn", "-lcudart"])


@pytest.fixture(scope="module")
def runs(program: Path) -> list[str]:
    """The program's output from two separate runs."""
    return [run(program, timeout=120).stdout for _ in range(2)]


def cases(stdout: str) -> dict[str, dict]:
    """The CASE lines, by name."""
    return results("CASE", stdout)


# ---- the library ------------------------------------------------------------------


def test_soname_and_symlink(emulator):
    assert_soname_and_symlink(emulator / "libcudnn.so.9")


def test_exports_exactly_the_implemented_functions_in_node_libcudnn_so_9(emulator):
    """The real libcudnn.so.9 (9.28) defines one node named like its soname, holding all its functions."""
    assert_exports_exactly(emulator / "libcudnn.so.9", EXPORTED)


def test_every_export_is_a_function_of_the_real_library(emulator):
    """Against NVIDIA's libcudnn.so.9 where a CUDA PyTorch installed one: same names, same node."""
    package = package_dir("nvidia.cudnn")
    real = package / "lib" / "libcudnn.so.9" if package is not None else None
    if real is None or not real.exists():
        pytest.skip("NVIDIA's libcudnn.so.9 is not installed (nvidia-cudnn-cu13)")
    real_exports = {(name, version) for name, version, defined in dyn_symbols(real) if defined}
    assert {(name, "libcudnn.so.9") for name in EXPORTED} <= real_exports


def test_reaches_the_device_only_through_the_private_interface(emulator):
    """Like the real library (which imports no cuda* symbol) and the emulated cuBLAS."""
    assert_device_only_through_the_private_interface(emulator / "libcudnn.so.9",
                                                     ("cuda", "__cuda", "cublas", "cudnn"))


def test_status_names_are_generated_from_the_header(emulator):
    """build/gen/cudnn_status.inc holds every cudnnStatus_t value of cudnn_graph.h, by its current name."""
    header = (CUDNN_INCLUDE / "cudnn_graph.h").read_text(errors="replace")
    body = re.search(r"typedef\s+enum\s*\{((?:(?!typedef).)*?)\}\s*cudnnStatus_t\s*;", header, re.S).group(1)
    current = dict(re.findall(r"^\s*(CUDNN_STATUS_\w+)\s*=\s*(\d+)", body, re.M))
    table = dict((name, value) for value, name in
                 re.findall(r'\{ (\d+), "(\w+)"', (EMULATOR_BUILD / "gen" / "cudnn_status.inc").read_text()))
    assert len(current) >= 40
    assert {name: value for name, value in current.items()} == {n: table[n] for n in current}
    assert table["CUDNN_STATUS_INVALID_VALUE"] == "2001"    # only a deprecated name has this value


def test_make_skips_libcudnn_with_a_note_without_the_headers(emulator, tmp_path):
    stdout = make_with("CUDNN_INCLUDE", tmp_path)
    assert "skipping libcudnn.so.9: cudnn.h/cudnn_graph.h not found" in stdout
    assert "scripts/setup.sh" in stdout


def test_program_links_without_rpath(program):
    """The same binary must run on NVIDIA's libraries or through a device proxy."""
    out = subprocess.run(["readelf", "-d", str(program)], capture_output=True, text=True, check=True).stdout
    assert "RPATH" not in out and "RUNPATH" not in out
    needed = re.findall(r"Shared library: \[(\S+)\]", out)
    assert "libcudnn.so.9" in needed and "libcudart.so.13" in needed
    imports = {name for name, _, defined in dyn_symbols(program) if not defined}
    assert not [n for n in imports if n.startswith(("cuda", "__cuda")) and n not in {
        "cudaMalloc", "cudaFree", "cudaMemcpy", "cudaMemset", "cudaStreamCreate", "cudaStreamDestroy",
        "cudaDeviceSynchronize", "cudaGetErrorName"}], imports


# ---- results ----------------------------------------------------------------------


def test_every_case_matches_the_references(runs):
    found = cases(runs[0])
    assert len(found) == 41, sorted(found)
    for name, v in found.items():
        tolerance = 1e-13 if "f64" in name else 1e-5
        # maxdiff is NaN if a NaN in a beta = 0 output survived (it must never be read).
        assert v["maxdiff"] <= tolerance, (name, v)
        assert v["exact"] == 0, f"{name}: {v['exact']} elements differ from the fixed-order computation"
        assert v["pad"] == 0, f"{name}: {v['pad']} elements outside the output tensor changed"


def test_results_are_bit_identical_across_runs(runs):
    first, second = ({n: v["hash"] for n, v in cases(out).items()} for out in runs)
    assert first == second


def test_same_problem_gives_the_same_bits_on_any_stream_layout_mode_and_entry_point(runs):
    found = cases(runs[0])
    for group in SAME_BITS:
        assert len({found[name]["hash"] for name in group}) == 1, {name: found[name]["hash"] for name in group}


def test_different_problems_give_different_results(runs):
    found = cases(runs[0])
    grouped = {name for group in SAME_BITS for name in group}
    representatives = [n for n in found if n not in grouped] + [sorted(group)[0] for group in SAME_BITS]
    hashes = [found[n]["hash"] for n in representatives]
    assert len(set(hashes)) == len(hashes)


def test_the_chain_reports_what_cudnn_frontend_reads(runs):
    info = infos(runs[0])
    # global count, heuristic results, engine index, numerical notes, behavior notes, knobs, layout infos
    assert info["fwd_chain"] == "1 1 0 0 0 0 3"
    assert info["bwd_filter_chain"] == "1 1 0 0 0 0 3"
    assert info["fwd_workspace"] == "0 0"
    # backward filter accumulates in a workspace of K*C*R*S elements (4*3*3*3 floats), which it really writes
    assert info["bwd_filter_workspace"] == "432 432"
    assert info["workspace_bytes_written"] == "yes"
    assert info["bwd_filter_plan_workspace"] == "432"
    assert info["half_heuristic_results"] == "0"
    assert info["grouped_heuristic_results"] == "0"
    assert info["bn_train_ex_sizes"] == "0 0"
    assert info["bn_backward_ex_workspace"] == "0"


# ---- statuses, attributes, handles ---------------------------------------------------------


def test_argument_errors_return_the_documented_statuses(runs):
    assert statuses(runs[0]) == EXPECTED_STATUS


def test_attributes_descriptors_and_names(runs):
    info = infos(runs[0])
    assert info["create_pointwise_out"] == "NULL"
    assert info["tensor_dims"] == "4 2 3 6 6"
    assert info["tensor_dims_count"] == "4"
    assert info["tensor_dims_requested_1"] == "4 -7"      # the count the attribute has; one element written
    assert info["tensor_is_virtual"] == "0"
    assert info["op_alpha"] == "1"                        # set as FLOAT, read as DOUBLE
    assert info["op_x_uid"] == str(ord("x"))              # the operation's X, copied into a new descriptor
    assert info["plan_run_only_uids"] == "0"
    assert info["tensor_nhwc"] == "0 4 2 3 4 5 60 1 15 3"
    assert info["tensor_ex"] == "1 4 2 3 100 30"
    assert info["derived_spatial"] == "1 4 1 3 1 1 3 1 1 1"
    assert info["derived_per_activation"] == "1 4 1 3 4 5 60 20 5 1"
    assert info["bn_workspace_size"] == info["bn_backward_workspace_size"] == info["bn_reserve_size"] == "0"
    assert info["default_stream_is_null"] == "1"
    assert info["stream_round_trip"] == "1"
    header = (CUDNN_INCLUDE / "cudnn_version.h").read_text()
    major, minor, patch = (re.search(rf"#define CUDNN_{k}\s+(\d+)", header).group(1)
                           for k in ("MAJOR", "MINOR", "PATCHLEVEL"))
    assert (info["property_major"], info["property_minor"], info["property_patch"]) == (major, minor, patch)
    assert info["version"] == info["header_version"] == str(int(major) * 10000 + int(minor) * 100 + int(patch))
    assert 13000 <= int(info["cudart_version"]) < 14000
    assert info["error_string_0"] == "CUDNN_STATUS_SUCCESS"
    assert info["error_string_1001"] == "CUDNN_STATUS_NOT_INITIALIZED"
    assert info["error_string_2000"] == "CUDNN_STATUS_BAD_PARAM"
    assert info["error_string_2001"] == "CUDNN_STATUS_INVALID_VALUE"
    assert info["error_string_2002"] == "CUDNN_STATUS_BAD_PARAM_NULL_POINTER"
    assert info["error_string_2010"] == "CUDNN_STATUS_BAD_PARAM_ATTRIBUTE_TYPE"
    assert info["error_string_3000"] == "CUDNN_STATUS_NOT_SUPPORTED"
    assert info["error_string_3003"] == "CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE"
    # CUDNN_STATUS_ALLOC_FAILED is a deprecated alias of this value: the current name wins
    assert info["error_string_4003"] == "CUDNN_STATUS_INTERNAL_ERROR_HOST_ALLOCATION_FAILED"
    assert info["error_string_5000"] == "CUDNN_STATUS_EXECUTION_FAILED"
    assert info["error_string_12345"] == "CUDNN_UNKNOWN_STATUS_FOUND"
    assert info["last_error_mentions_cudnnSetStream"] == "1"
    assert info["last_error_truncated_length"] == "3"


# ---- the training loop ------------------------------------------------------------------


def test_train_is_deterministic_and_matches_the_host_loop(program):
    outs = [run(program, "train", timeout=120).stdout for _ in range(2)]
    # nothing the program prints varies from run to run
    assert outs[0] == outs[1]
    sums = re.findall(r"^checksum ([0-9a-f]{16})$", outs[0], re.M)
    assert len(sums) == 1
    # the same loop computed on the host, in the emulator's documented order, gives the same bytes
    assert re.findall(r"^reference_checksum ([0-9a-f]{16})$", outs[0], re.M) == sums
    losses = [float(x) for x in re.findall(r"^step \d+ loss (\S+)$", outs[0], re.M)]
    assert len(losses) == 6
    assert losses[-1] < losses[0]     # it does train
