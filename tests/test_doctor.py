"""Tests of `jit-run doctor` (the jitckpt.doctor package) on real binaries.

The CUDA programs are compiled here with nvcc 13, once with ``-cudart shared``
and once with nvcc's default static runtime; the libraries analysed are the
real ``libcudart.so.13`` of the CUDA toolkit, the real ``libnccl.so.2`` of the
``nvidia-nccl-cu13`` wheel and the CPU device emulator's libraries. Small
stand-ins built with gcc play the parts this machine does not have (a
``libcuda.so.1`` driver, a ``libcublas.so.13``, a CUDA 12 runtime). Expected
imports come from ``nvcc``'s behaviour as recorded in emulator/README.md,
not from the code under test. Everything here is static analysis, so nothing
needs a GPU.

What jitckpt covers comes from a small coverage list written here in the
generator's format (``COVERAGE_FIXTURE``), so the verdicts do not depend on
whether ``make -C interpose`` has generated the real one; one test compares
doctor with the generated list when it is built.
"""

from __future__ import annotations

import glob
import importlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import jitckpt.native
from jitckpt import doctor
from jitckpt.doctor import coverage as doctor_coverage

REPO = Path(__file__).resolve().parent.parent
EMULATOR = REPO / "emulator"
EMULATOR_BUILD = EMULATOR / "build"

CUDA_PROGRAM = r"""
#include <cstdio>
#include <cuda_runtime.h>
__device__ int hits;
__global__ void add_one(float *x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { x[i] += 1.0f; atomicAdd(&hits, 1); }
}
int main() {
  float *d = nullptr;
  if (cudaMalloc(&d, 16 * sizeof(float)) != cudaSuccess) return 1;
  add_one<<<1, 16>>>(d, 16);
  cudaDeviceSynchronize();
  return cudaFree(d) == cudaSuccess ? 0 : 1;
}
"""

# A library that does its own CUDA work: built with nvcc's default (static) runtime.
CUDA_LIBRARY = r"""
#include <cuda_runtime.h>
__global__ void fill(float *x) { x[threadIdx.x] = 2.0f; }
extern "C" int worker_run(void) {
  float *d = nullptr;
  if (cudaMalloc(&d, 64 * sizeof(float)) != cudaSuccess) return 1;
  fill<<<1, 64>>>(d);
  return cudaFree(d);
}
"""

# What nvcc 13 -cudart shared imports for CUDA_PROGRAM (emulator/README.md, "ABI facts").
EXPECTED_SHARED_IMPORTS = {
    f"{name}@libcudart.so.13"
    for name in (
        "cudaMalloc", "cudaFree", "cudaDeviceSynchronize",
        "__cudaRegisterFatBinary", "__cudaRegisterFatBinaryEnd", "__cudaRegisterFunction",
        "__cudaRegisterVar", "__cudaUnregisterFatBinary", "__cudaPushCallConfiguration",
        "__cudaPopCallConfiguration", "__cudaGetKernel", "__cudaLaunchKernel", "__cudaInitModule",
    )
}
# The hidden entry points DESIGN decision 5 names.
DESIGN_HIDDEN = {"__cudaRegisterFatBinary", "__cudaRegisterFunction", "__cudaPushCallConfiguration",
                 "__cudaLaunchKernel", "__cudaGetKernel", "__cudaInitModule"}

# A coverage list in the format interpose/tools/gen_interpose.py writes. Every runtime name here is
# a real libcudart.so.13 function that the CPU device emulator implements; ncclCommSplit and
# cudaGraphLaunch are listed but not covered in transparent mode, cufftExecC2C belongs to a
# library doctor never judges.
FIXTURE_RUNTIME = sorted(set(doctor.HIDDEN_ENTRY_POINTS) | {
    "cudaMalloc", "cudaFree", "cudaDeviceSynchronize", "cudaStreamCreate", "cudaMemcpy", "cudaSetDevice",
    "cudaGetDevice", "cudaEventRecord"})
FIXTURE_NCCL = sorted(prefix + name for prefix in ("nccl", "pnccl") for name in (
    "AllReduce", "Broadcast", "CommInitRank", "CommDestroy", "GetUniqueId", "GroupStart", "GroupEnd"))
FIXTURE_WRAPPED = {"cudaEventRecord", "cudaStreamCreate", "ncclAllReduce", "ncclBroadcast"}
COVERAGE_FIXTURE: dict[str, Any] = {
    "generated_by": "tests/test_doctor.py (a fixture in interpose/tools/gen_interpose.py's format)",
    "runtime_version_node": "libcudart.so.13",
    "functions": {
        **{name: {"library": "cudart", "version": "libcudart.so.13", "transparent": True,
                  "passthrough": "wrapped" if name in FIXTURE_WRAPPED else "forwarded"} for name in FIXTURE_RUNTIME},
        **{name: {"library": "nccl", "version": None, "transparent": True,
                  "passthrough": "wrapped" if name in FIXTURE_WRAPPED else "forwarded"} for name in FIXTURE_NCCL},
        "cudaGraphLaunch": {"library": "cudart", "version": "libcudart.so.13", "passthrough": "forwarded",
                            "transparent": False},
        "ncclCommSplit": {"library": "nccl", "version": None, "passthrough": "forwarded", "transparent": False},
        "cufftExecC2C": {"library": "cufft", "version": None, "passthrough": "forwarded", "transparent": False},
    },
}
# The real lookup of the built list, before the autouse fixture below replaces it.
BUILT_COVERAGE = doctor_coverage.default_path


# --------------------------------------------------------------------------
# helpers and fixtures
# --------------------------------------------------------------------------


def run_doctor(*args: str) -> tuple[int, str, str]:
    """Run doctor.main in-process; returns (status, stdout, stderr)."""
    out = io.StringIO()
    err = io.StringIO()
    old_err = sys.stderr
    sys.stderr = err
    try:
        status = doctor.main(list(args), stdout=out)
    finally:
        sys.stderr = old_err
    return status, out.getvalue(), err.getvalue()


def doctor_json(path: Path | str, *extra: str) -> dict[str, Any]:
    status, out, err = run_doctor(str(path), "--json", *extra)
    assert status == 0, err
    return json.loads(out)


def imports_of(report: dict[str, Any], importer: str | None = None) -> dict[str, dict[str, Any]]:
    return {i["symbol"]: i for i in report["imports"] if importer is None or i["importer"] == importer}


def obj(report: dict[str, Any], name: str) -> dict[str, Any]:
    found = [o for o in report["objects"] if o["name"] == name]
    assert found, f"{name} not in {[o['name'] for o in report['objects']]}"
    return found[0]


def limit(report: dict[str, Any], key: str) -> dict[str, Any]:
    return next(l for l in report["limits"] if l["key"] == key)


def _parallel(commands: list[list[str]], cwd: Path) -> None:
    procs = [(cmd, subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
             for cmd in commands]
    for cmd, proc in procs:
        output, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{output}"


def _run(cmd: list[str], cwd: Path) -> None:
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stderr}"


@pytest.fixture(scope="session")
def coverage_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """COVERAGE_FIXTURE as a file."""
    path = tmp_path_factory.mktemp("coverage") / "coverage.json"
    path.write_text(json.dumps(COVERAGE_FIXTURE, indent=2))
    return path


@pytest.fixture(autouse=True)
def fixture_coverage(coverage_file: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Doctor reads COVERAGE_FIXTURE where it would read the built list (tests of the real lookup restore it)."""
    monkeypatch.setattr(doctor_coverage, "default_path", lambda: coverage_file)
    return coverage_file


@pytest.fixture
def built_coverage_lookup(monkeypatch: pytest.MonkeyPatch) -> None:
    """Undo fixture_coverage: doctor looks for the built list through jitckpt.native again."""
    monkeypatch.setattr(doctor_coverage, "default_path", BUILT_COVERAGE)


@pytest.fixture(scope="session")
def gcc() -> str:
    found = shutil.which("gcc")
    if found is None:
        pytest.skip("gcc is not installed")
    return found


@pytest.fixture(scope="session")
def cuda_builds(tmp_path_factory: pytest.TempPathFactory, gcc: str) -> dict[str, Path]:
    """The nvcc-built programs and libraries, compiled in parallel."""
    if shutil.which("nvcc") is None:
        pytest.skip("nvcc is not installed: the CUDA programs cannot be compiled")
    d = tmp_path_factory.mktemp("cuda")
    (d / "lib").mkdir()
    (d / "prog.cu").write_text(CUDA_PROGRAM)
    (d / "worker.cu").write_text(CUDA_LIBRARY)
    ext = "ext_demo.cpython-311-x86_64-linux-gnu.so"
    # Compile each source once; the runtime is chosen when linking (-cudart), which is quick.
    _parallel([["nvcc", "-c", "-o", "prog.o", "prog.cu"],
               ["nvcc", "-c", "-Xcompiler", "-fPIC", "-o", "worker.o", "worker.cu"]], d)
    _parallel([["nvcc", "-cudart", "shared", "-o", "prog_shared", "prog.o"],
               ["nvcc", "-o", "prog_static", "prog.o"],  # nvcc's default: -cudart static
               ["nvcc", "-shared", "-o", "lib/libworker.so", "worker.o"],
               ["nvcc", "-shared", "-cudart", "shared", "-o", ext, "worker.o"]], d)
    (d / "uses_worker.c").write_text(
        "int worker_run(void); int cudaDeviceSynchronize(void);\n"
        "int main(void) { worker_run(); return cudaDeviceSynchronize(); }\n")
    _run([gcc, "-o", "prog_uses_worker", "uses_worker.c", "-Llib", "-lworker", "-L/usr/local/cuda/lib64",
          "-lcudart", "-Wl,-rpath,$ORIGIN/lib"], d)
    return {"shared": d / "prog_shared", "static": d / "prog_static", "worker": d / "lib/libworker.so",
            "uses_worker": d / "prog_uses_worker", "extension": d / ext}


@pytest.fixture(scope="session")
def stand_ins(tmp_path_factory: pytest.TempPathFactory, gcc: str) -> dict[str, Path]:
    """gcc-built stand-ins for what this machine lacks: a driver, cuBLAS, a CUDA 12 runtime."""
    d = tmp_path_factory.mktemp("standins")
    lib = d / "lib"
    lib.mkdir()
    files = {
        "driver.c": "int cuInit(unsigned f) { return 0; }\nint cuMemAlloc_v2(void **p, unsigned long n) { return 0; }\n",
        "cublas.c": "int cublasCreate_v2(void **h) { return 0; }\nint cublasSgemm_v2(void) { return 0; }\n",
        "rt12.c": "int cudaMalloc(void **p, unsigned long n) { return 0; }\n",
        "rt12.map": "libcudart.so.12 { global: cuda*; local: *; };\n",
        "uses_driver.c": ("int cuInit(unsigned); int cuMemAlloc_v2(void **, unsigned long);\n"
                          "int cudaMalloc(void **, unsigned long);\n"
                          "int main(void) { void *p; cuInit(0); cuMemAlloc_v2(&p, 8); return cudaMalloc(&p, 8); }\n"),
        "uses_cublas.c": ("int cublasCreate_v2(void **); int cublasSgemm_v2(void); int cudaMalloc(void **, unsigned long);\n"
                          "int main(void) { void *h; cudaMalloc(&h, 8); cublasCreate_v2(&h); return cublasSgemm_v2(); }\n"),
        "uses_rt12.c": "int cudaMalloc(void **, unsigned long);\nint main(void) { void *p; return cudaMalloc(&p, 8); }\n",
    }
    for name, text in files.items():
        (d / name).write_text(text)
    rpath = "-Wl,-rpath,$ORIGIN/lib"
    _run([gcc, "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", "lib/libcuda.so.1", "driver.c"], d)
    _run([gcc, "-shared", "-fPIC", "-Wl,-soname,libcublas.so.13", "-o", "lib/libcublas.so.13", "cublas.c"], d)
    _run([gcc, "-shared", "-fPIC", "-Wl,-soname,libcudart.so.12", "-Wl,--version-script=rt12.map",
          "-o", "lib/libcudart.so.12", "rt12.c"], d)
    cudart = ["-L/usr/local/cuda/lib64", "-lcudart"]
    _run([gcc, "-o", "prog_driver", "uses_driver.c", "-Llib", "-l:libcuda.so.1", *cudart, rpath], d)
    _run([gcc, "-o", "prog_cublas", "uses_cublas.c", "-Llib", "-l:libcublas.so.13", *cudart, rpath], d)
    _run([gcc, "-o", "prog_cuda12", "uses_rt12.c", "-Llib", "-l:libcudart.so.12", rpath], d)
    # Stand-ins of PyTorch installations (never imported): torch/lib/libtorch_cuda.so of a CUDA 12
    # build needs libcudart.so.12 and imports cudaMalloc@libcudart.so.12, as the real one does; a
    # CUDA 13 build's needs the real libcudart.so.13; a CPU build has no libtorch_cuda.so at all.
    (d / "torch_cuda.c").write_text("int cudaMalloc(void **, unsigned long);\n"
                                    "int torch_cuda_alloc(void **p) { return cudaMalloc(p, 8); }\n")
    for build, link, cuda in (("torch12", ["-Llib", "-l:libcudart.so.12"], "'12.8'"),
                              ("torch13", cudart, "'13.0'"), ("torch_cpu", None, "None")):
        pkg = d / build / "torch"
        (pkg / "lib").mkdir(parents=True)
        (pkg / "__init__.py").write_text("raise ImportError('a stand-in: never imported')\n")
        (pkg / "version.py").write_text(f"__version__ = '2.13.0'\ncuda: Optional[str] = {cuda}\n")
        if link is not None:
            _run([gcc, "-shared", "-fPIC", "-o", str(pkg / "lib" / "libtorch_cuda.so"), "torch_cuda.c", *link], d)
    return {"driver": d / "prog_driver", "cublas": d / "prog_cublas", "cuda12": d / "prog_cuda12", "dir": d,
            "runtime12": lib / "libcudart.so.12", "torch12": d / "torch12" / "torch",
            "torch13": d / "torch13" / "torch", "torch_cpu": d / "torch_cpu" / "torch"}


@pytest.fixture(scope="session")
def emulator_build() -> Path:
    """The emulator's libraries, built first if emulator/build lacks them."""
    if not all((EMULATOR_BUILD / lib).is_file() for lib in ("libcudart.so.13", "libnccl.so.2")):
        proc = subprocess.run(["make", "-C", str(EMULATOR), "-j2"], capture_output=True, text=True)
        assert proc.returncode == 0, f"make -C emulator failed:\n{proc.stdout}\n{proc.stderr}"
    return EMULATOR_BUILD


@pytest.fixture(scope="session")
def nccl_wheel() -> Path:
    """The nvidia-nccl-cu13 wheel's package directory, installed with pip if missing."""
    try:
        module = importlib.import_module("nvidia.nccl")
    except ImportError:
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "nvidia-nccl-cu13"],
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            pytest.skip(f"nvidia-nccl-cu13 is not installed and pip could not install it: {proc.stderr[-500:]}")
        importlib.invalidate_caches()
        module = importlib.import_module("nvidia.nccl")
    root = Path(list(module.__path__)[0])
    assert (root / "lib" / "libnccl.so.2").is_file()
    return root


@pytest.fixture(scope="session")
def real_cudart() -> Path:
    found = sorted(glob.glob("/usr/local/cuda*/lib64/libcudart.so.13*")
                   + glob.glob("/usr/local/cuda*/targets/*/lib/libcudart.so.13*"))
    if not found:
        pytest.skip("the CUDA 13 toolkit's libcudart.so.13 is not under /usr/local/cuda")
    return Path(found[0])


# --------------------------------------------------------------------------
# nvcc-built programs
# --------------------------------------------------------------------------


def test_shared_cudart_program_lists_exact_imports_and_both_modes_ok(cuda_builds: dict[str, Path]) -> None:
    report = doctor_json(cuda_builds["shared"])
    found = imports_of(report)
    assert set(found) == EXPECTED_SHARED_IMPORTS
    assert all(i["status"] == "covered" and i["bound_to"] == "libcudart.so.13" for i in found.values())
    assert DESIGN_HIDDEN <= {i["name"] for i in found.values()}
    assert report["verdict"]["passthrough"]["status"] == "ok"
    assert report["verdict"]["transparent"]["status"] == "ok"
    assert not any(l["applies"] for l in report["limits"])

    status, text, _ = run_doctor(str(cuda_builds["shared"]))
    assert status == 0
    assert "cudaMalloc@libcudart.so.13" in text and "__cudaRegisterFatBinary@libcudart.so.13" in text
    assert text.rstrip().splitlines()[-1] == "verdict: passthrough mode OK; transparent mode OK"


def test_shared_program_binds_to_the_emulator_through_ld_library_path(
        cuda_builds: dict[str, Path], emulator_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LD_LIBRARY_PATH", str(emulator_build))
    report = doctor_json(cuda_builds["shared"])
    runtime = obj(report, "libcudart.so.13")
    assert Path(runtime["path"]).resolve() == (emulator_build / "libcudart.so.13").resolve()
    assert runtime["found_via"] == "LD_LIBRARY_PATH"
    assert runtime["role"] == doctor.ROLE_EMULATED_RUNTIME
    assert report["verdict"]["transparent"]["status"] == "ok"


def test_static_cudart_program_cannot_be_interposed(cuda_builds: dict[str, Path]) -> None:
    report = doctor_json(cuda_builds["static"])
    assert not [i for i in report["imports"] if i["category"] == "runtime"]
    assert any("__cudaRegisterFatBinary" in e for e in obj(report, "prog_static")["static_runtime"])
    assert limit(report, "static-cudart")["applies"]
    for mode in ("passthrough", "transparent"):
        verdict = report["verdict"][mode]
        assert verdict["status"] == "not supported"
        assert any("rebuild with -cudart shared" in r["reason"] for r in verdict["reasons"])
    status, text, _ = run_doctor(str(cuda_builds["static"]))
    last = text.rstrip().splitlines()[-1]
    assert last.startswith("verdict: passthrough mode NOT SUPPORTED, transparent mode NOT SUPPORTED")
    assert "rebuild with -cudart shared" in last


def test_dependency_with_static_runtime_is_refused_in_transparent_mode_when_called(cuda_builds: dict[str, Path]) -> None:
    report = doctor_json(cuda_builds["uses_worker"])
    worker = obj(report, "libworker.so")
    assert worker["found_via"] == "DT_RUNPATH of prog_uses_worker"  # $ORIGIN/lib expanded
    assert worker["static_runtime"]
    assert limit(report, "static-runtime-libraries")["applies"]
    assert report["verdict"]["passthrough"]["status"] == "ok"
    assert any("libworker.so" in c for c in report["verdict"]["passthrough"]["caveats"])
    # Refused when called, not when loaded (issue 19): the job stops at the library's first call that
    # opens the CUDA driver (tests/test_transparent_bypass.py runs that).
    transparent = report["verdict"]["transparent"]
    assert transparent["status"] == "ok"
    assert any(c.startswith("refused when called: libworker.so has its own static CUDA runtime")
               for c in transparent["caveats"]), transparent


def test_python_extension_module(cuda_builds: dict[str, Path]) -> None:
    report = doctor_json(cuda_builds["extension"])
    assert report["kind"] == "Python extension module"
    found = imports_of(report)
    assert {"cudaMalloc@libcudart.so.13", "cudaFree@libcudart.so.13", "__cudaRegisterFatBinary@libcudart.so.13",
            "__cudaLaunchKernel@libcudart.so.13"} <= set(found)
    assert report["verdict"]["transparent"]["status"] == "ok"
    assert any("Python interpreter" in n for n in report["notes"])


# --------------------------------------------------------------------------
# the libraries themselves
# --------------------------------------------------------------------------


def test_real_libcudart_is_reported_as_the_runtime_itself(real_cudart: Path) -> None:
    report = doctor_json(real_cudart)
    provides = report["provides"]
    assert provides["role"] == doctor.ROLE_RUNTIME
    assert report["imports"] == []
    assert provides["defines"] >= 400
    assert provides["versions"] == ["libcudart.so.13"]
    assert DESIGN_HIDDEN <= set(provides["hidden_entry_points"])
    # The emulator never makes up API names, so every covered function is a real one.
    assert provides["covered"] == report["coverage"]["runtime_functions"]
    assert provides["covered"] + len(provides["not_covered"]) == provides["defines"]
    for mode in ("passthrough", "transparent"):
        assert report["verdict"][mode]["status"] == "not applicable"
    _, text, _ = run_doctor(str(real_cudart))
    assert "defines rather than imports" in text
    assert text.rstrip().splitlines()[-1] == "verdict: not applicable (libcudart.so.13 is the CUDA runtime itself)"


def test_emulator_libraries(emulator_build: Path) -> None:
    runtime = doctor_json(emulator_build / "libcudart.so.13")
    assert runtime["provides"]["role"] == doctor.ROLE_EMULATED_RUNTIME
    assert runtime["provides"]["covered"] == len(FIXTURE_RUNTIME)  # the emulator implements them all
    assert runtime["provides"]["covered"] + len(runtime["provides"]["not_covered"]) == runtime["provides"]["defines"]
    assert runtime["provides"]["versions"] == ["libcudart.so.13"]

    nccl = doctor_json(emulator_build / "libnccl.so.2")
    assert nccl["provides"]["role"] == doctor.ROLE_EMULATED_NCCL
    assert nccl["provides"]["covered"] == len(FIXTURE_NCCL)
    assert "ncclCommSplit" not in nccl["provides"]["not_covered"]  # listed, but the emulator lacks it
    assert nccl["provides"]["versions"] == ["(unversioned)"]
    assert nccl["imports"] == []  # the emulated NCCL imports no cuda* symbol (README)
    dep = obj(nccl, "libcudart.so.13")  # found through its DT_RUNPATH $ORIGIN
    assert dep["found_via"] == "DT_RUNPATH of libnccl.so.2"
    assert Path(dep["path"]).resolve() == (emulator_build / "libcudart.so.13").resolve()


def test_real_libnccl_is_nccl_itself_with_a_static_runtime(nccl_wheel: Path) -> None:
    report = doctor_json(nccl_wheel / "lib" / "libnccl.so.2")
    provides = report["provides"]
    assert provides["role"] == doctor.ROLE_NCCL
    assert provides["versions"] == ["(unversioned)"]
    assert {"ncclAllReduce", "ncclCommInitRank"}.isdisjoint(provides["not_covered"])
    assert "ncclCommSplit" in provides["not_covered"]
    assert obj(report, "libnccl.so.2")["static_runtime"]
    assert any("expected" in n for n in report["notes"])
    assert report["verdict"]["transparent"]["status"] == "not applicable"


def test_program_using_nccl(nccl_wheel: Path, gcc: str, tmp_path: Path) -> None:
    source = tmp_path / "uses_nccl.c"
    source.write_text(
        "typedef struct ncclComm *ncclComm_t;\n"
        "int ncclAllReduce(const void *, void *, unsigned long, int, int, ncclComm_t, void *);\n"
        "int ncclCommSplit(ncclComm_t, int, int, ncclComm_t *, void *);\n"
        "int main(void) { ncclComm_t c = 0, n; ncclAllReduce(0, 0, 0, 0, 0, c, 0); return ncclCommSplit(c, 0, 0, &n, 0); }\n")
    lib = nccl_wheel / "lib"
    _run([gcc, "-o", "prog_nccl", str(source), f"-L{lib}", "-l:libnccl.so.2", f"-Wl,-rpath,{lib}"], tmp_path)
    report = doctor_json(tmp_path / "prog_nccl")
    found = imports_of(report)
    assert found["ncclAllReduce"]["status"] == "covered"  # unversioned, as NCCL's symbols are
    assert found["ncclAllReduce"]["bound_to"] == "libnccl.so.2"
    assert found["ncclCommSplit"]["status"] == "not covered"
    assert report["verdict"]["passthrough"]["status"] == "ok"
    transparent = report["verdict"]["transparent"]
    assert transparent["status"] == "not supported"
    assert any("ncclCommSplit" in r["reason"] for r in transparent["reasons"])
    # libnccl.so.2's own static runtime is expected, not a reason against either mode
    assert not any("libnccl" in r["reason"] for r in transparent["reasons"])


# --------------------------------------------------------------------------
# stand-ins for what this machine lacks
# --------------------------------------------------------------------------


def test_driver_api_imports_are_not_interposed(stand_ins: dict[str, Path]) -> None:
    report = doctor_json(stand_ins["driver"])
    found = imports_of(report)
    assert found["cuInit"]["category"] == "driver" and found["cuInit"]["status"] == "not interposed"
    assert found["cuInit"]["bound_to"] == "libcuda.so.1"
    assert found["cudaMalloc@libcudart.so.13"]["status"] == "covered"
    assert limit(report, "driver-api")["applies"]
    assert report["verdict"]["passthrough"]["status"] == "ok"
    transparent = report["verdict"]["transparent"]  # the job stops at the first driver call (remote/bypass.c)
    assert transparent["status"] == "ok"
    assert any(c.startswith("refused when called: imports the CUDA driver API (cuInit") for c in transparent["caveats"]), transparent


def test_cublas_is_not_covered(stand_ins: dict[str, Path]) -> None:
    report = doctor_json(stand_ins["cublas"])
    assert imports_of(report)["cublasSgemm_v2"]["category"] == "cublas"
    assert any("NVIDIA math library" in e for e in obj(report, "libcublas.so.13")["static_runtime"])
    assert limit(report, "static-runtime-libraries")["applies"]
    transparent = report["verdict"]["transparent"]  # refused when it opens the driver, not when it is linked
    assert transparent["status"] == "ok"
    assert any(c.startswith("refused when called: libcublas.so.13 has its own static CUDA runtime")
               for c in transparent["caveats"]), transparent
    assert report["verdict"]["passthrough"]["status"] == "ok"


def test_other_runtime_version_is_a_mismatch(stand_ins: dict[str, Path]) -> None:
    report = doctor_json(stand_ins["cuda12"])
    assert imports_of(report)["cudaMalloc@libcudart.so.12"]["status"] == "version mismatch"
    for mode in ("passthrough", "transparent"):
        assert report["verdict"][mode]["status"] == "not supported"


# --------------------------------------------------------------------------
# the CUDA runtime ABI (libcudart.so.12 or .13), and jit-run's use of it
# --------------------------------------------------------------------------


def test_doctor_names_the_cuda_12_runtime_abi_and_says_it_is_not_covered(stand_ins: dict[str, Path]) -> None:
    report = doctor_json(stand_ins["cuda12"])
    abi = report["runtime_abi"]
    assert abi["names"] == ["libcudart.so.12"] and abi["majors"] == [12] and abi["covered"] is False
    assert "imports cudaMalloc@libcudart.so.12" in abi["evidence"]
    reasons = [r["reason"] for r in report["verdict"]["passthrough"]["reasons"]]
    assert "uses the libcudart.so.12 (CUDA 12) runtime, which jitckpt does not cover" in reasons
    status, text, _ = run_doctor(str(stand_ins["cuda12"]))
    header = " ".join(text.split("\n\n")[0].split())
    assert "CUDA runtime ABI: libcudart.so.12 (CUDA 12): NOT covered." in header
    assert "stands in front of libcudart.so.13 (CUDA 13) only" in header
    assert "the Python watchdog stays in charge" in header


def test_doctor_names_the_abi_of_a_library_that_needs_libcudart_12(stand_ins: dict[str, Path]) -> None:
    """A PyTorch-like library, and the CUDA 12 runtime itself (a provider, not applicable, but named)."""
    report = doctor_json(stand_ins["torch12"] / "lib" / "libtorch_cuda.so")
    assert report["runtime_abi"]["names"] == ["libcudart.so.12"] and not report["runtime_abi"]["covered"]
    assert report["verdict"]["passthrough"]["status"] == "not supported"
    runtime = doctor_json(stand_ins["runtime12"])
    assert runtime["verdict"]["passthrough"]["status"] == "not applicable"
    assert runtime["runtime_abi"]["names"] == ["libcudart.so.12"] and not runtime["runtime_abi"]["covered"]
    status, text, _ = run_doctor(str(stand_ins["runtime12"]))
    assert "CUDA runtime ABI: libcudart.so.12 (CUDA 12): NOT covered" in " ".join(text.split())


def test_doctor_names_the_covered_cuda_13_abi(cuda_builds: dict[str, Path], real_cudart: Path) -> None:
    for path in (cuda_builds["shared"], real_cudart):
        abi = doctor_json(path)["runtime_abi"]
        assert abi["names"] == ["libcudart.so.13"] and abi["covered"] is True, (path, abi)
    status, text, _ = run_doctor(str(cuda_builds["shared"]))
    assert "CUDA runtime ABI: libcudart.so.13 (CUDA 13), the ABI jitckpt's interposer covers" in " ".join(text.split())
    assert doctor_json(cuda_builds["static"])["runtime_abi"] is None  # no shared runtime in sight


def test_torch_runtime_is_read_without_importing_torch(stand_ins: dict[str, Path]) -> None:
    cuda12 = doctor.torch_runtime(stand_ins["torch12"])
    assert cuda12 is not None and cuda12.abi is not None
    assert cuda12.abi.names == ("libcudart.so.12",) and not cuda12.abi.covered
    assert cuda12.abi.evidence == ("torch/lib/libtorch_cuda.so needs libcudart.so.12",)
    cuda13 = doctor.torch_runtime(stand_ins["torch13"])
    assert cuda13 is not None and cuda13.abi is not None and cuda13.abi.covered
    cpu = doctor.torch_runtime(stand_ins["torch_cpu"])
    assert cpu is not None and cpu.abi is None
    # Without libtorch_cuda.so, torch/version.py's cuda string decides.
    (stand_ins["torch_cpu"] / "version.py").write_text("cuda: Optional[str] = '12.6'\n")
    try:
        fallback = doctor.torch_runtime(stand_ins["torch_cpu"])
        assert fallback.abi.names == ("libcudart.so.12",) and "torch/version.py says cuda '12.6'" in fallback.abi.evidence
    finally:
        (stand_ins["torch_cpu"] / "version.py").write_text("cuda: Optional[str] = None\n")
    assert "torch" not in sys.modules or sys.modules["torch"].__file__ != str(stand_ins["torch12"] / "__init__.py")


@pytest.mark.parametrize("interpose", ["on", "auto"])
def test_jit_run_leaves_the_interposer_out_of_a_cuda_12_torch_job(
        stand_ins: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], interpose: str) -> None:
    """--interpose on|auto with a CUDA 12 PyTorch: a clear line, no preload, the Python watchdog in charge."""
    from jitckpt.doctor import runtime_abi
    from jitckpt.launch import launcher

    monkeypatch.setattr(runtime_abi, "torch_dir", lambda: stand_ins["torch12"])
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    args = launcher.build_parser().parse_args(
        ["--checkpoint-dir", str(tmp_path), "--interpose", interpose, "--emulated-gpus", "1",
         "torchrun", "--nproc_per_node", "1", "train.py"])
    _, env, _ = launcher.prepare(args)
    assert "libjitckpt_interpose" not in env.get("LD_PRELOAD", "")
    err = capsys.readouterr().err
    line = next((l for l in err.splitlines() if "libcudart.so.12" in l), "")
    assert "interposer" in line and "does not cover" in line, err
    assert "Python watchdog stays in charge" in line and str(stand_ins["torch12"]) in line, err

    # A CUDA 13 PyTorch gets the interposer.
    monkeypatch.setattr(runtime_abi, "torch_dir", lambda: stand_ins["torch13"])
    _, env, _ = launcher.prepare(args)
    assert "libjitckpt_interpose.so" in env.get("LD_PRELOAD", "")
    assert "libcudart.so.12" not in capsys.readouterr().err


def test_resolution_agrees_with_the_real_loader(stand_ins: dict[str, Path], emulator_build: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """RUNPATH with $ORIGIN, LD_LIBRARY_PATH and ld.so.cache, checked against ldd (which runs ld.so)."""
    if shutil.which("ldd") is None:
        pytest.skip("ldd is not installed")
    monkeypatch.setenv("LD_LIBRARY_PATH", str(emulator_build))
    report = doctor_json(stand_ins["driver"])
    proc = subprocess.run(["ldd", str(stand_ins["driver"])], capture_output=True, text=True,
                          env={**os.environ, "LD_LIBRARY_PATH": str(emulator_build)})
    assert proc.returncode == 0, proc.stderr
    by_ldd = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "=>":
            by_ldd[parts[0]] = os.path.realpath(parts[2])
    ours = {o["name"]: os.path.realpath(o["path"]) for o in report["objects"][1:]}
    for name, path in by_ldd.items():
        assert ours.get(name) == path, (name, ours.get(name), path)
    assert obj(report, "libcudart.so.13")["found_via"] == "LD_LIBRARY_PATH"
    assert obj(report, "libcuda.so.1")["found_via"] == "DT_RUNPATH of prog_driver"


# --------------------------------------------------------------------------
# coverage list, options, errors
# --------------------------------------------------------------------------


def test_coverage_list_is_read_in_the_generators_format(coverage_file: Path) -> None:
    coverage = doctor.load_coverage(coverage_file)
    assert coverage.known and coverage.sources == [str(coverage_file)]
    assert coverage.runtime == {name: "libcudart.so.13" for name in FIXTURE_RUNTIME}
    assert coverage.nccl == {name: None for name in FIXTURE_NCCL}
    # listed but not transparent: known to passthrough mode, not covered
    assert "cudaGraphLaunch" not in coverage.runtime and "ncclCommSplit" not in coverage.nccl
    assert coverage.passthrough["cudaGraphLaunch"] == "forwarded"
    assert coverage.passthrough["cudaEventRecord"] == "wrapped"
    assert "cufftExecC2C" not in coverage.passthrough
    assert doctor.load_coverage() == coverage  # the autouse fixture stands in for the built list


def test_covered_set_is_the_generated_list(built_coverage_lookup: None) -> None:
    """When `make -C interpose` has generated coverage.json, doctor covers exactly what it says."""
    built = jitckpt.native.find("interpose", "gen/coverage.json")
    if built is None:
        pytest.skip("the interposer's coverage list is not built (`make -C interpose` generates gen/coverage.json)")
    data = json.loads(built.read_text())
    expected = {library: {name: entry["version"] for name, entry in data["functions"].items()
                          if entry["library"] == library and entry["transparent"]} for library in ("cudart", "nccl")}
    coverage = doctor.load_coverage()
    assert coverage.known and coverage.sources == [str(built)]
    assert coverage.runtime == expected["cudart"]
    assert coverage.nccl == expected["nccl"]
    status, out, _ = run_doctor("--transparent-list", "--json")
    assert status == 0
    listed = json.loads(out)["coverage"]
    assert listed["runtime"] == expected["cudart"] and listed["nccl"] == expected["nccl"]
    # Facts of the design the generated list must agree with.
    assert set(coverage.runtime.values()) == {data["runtime_version_node"]} == {doctor.RUNTIME_VERSION_NODE}
    # Covered means what transparent mode's worker library handles today: every hidden entry point
    # is either covered or refused by name with the library's reason (managed variables and the
    # per-thread default stream's launch are not marshalled yet), never silently missing.
    hidden = set(doctor.HIDDEN_ENTRY_POINTS)
    assert {"__cudaRegisterFatBinary", "__cudaRegisterFunction", "__cudaLaunchKernel"} <= set(coverage.runtime)
    assert hidden <= set(coverage.runtime) | set(coverage.refused), hidden - set(coverage.runtime) - set(coverage.refused)
    assert not set(coverage.refused) & (set(coverage.runtime) | set(coverage.nccl))
    assert all(coverage.refused.values()), "every refusal has its reason"


def test_missing_coverage_list_says_coverage_unknown(cuda_builds: dict[str, Path], built_coverage_lookup: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """No built list: doctor still analyses, says why the coverage is unknown and how to fix it, and exits 0."""
    monkeypatch.setattr(jitckpt.native, "find", lambda part, name: None)
    status, text, err = run_doctor(str(cuda_builds["shared"]))
    assert status == 0 and err == ""
    header = " ".join(text.split("\n\n")[0].split())  # the paragraph, unwrapped
    assert "coverage unknown" in header and "is not built" in header and "make -C interpose" in header
    assert text.rstrip().splitlines()[-1].startswith(
        "verdict: passthrough mode OK; transparent mode UNKNOWN (coverage unknown: the interposer's coverage list")
    report = doctor_json(cuda_builds["shared"])
    assert report["coverage"]["known"] is False and "make -C interpose" in report["coverage"]["missing"]
    assert {i["status"] for i in report["imports"]} == {"coverage unknown"}
    assert report["verdict"]["passthrough"]["status"] == "ok"
    assert report["verdict"]["transparent"]["status"] == "unknown"
    status, text, _ = run_doctor("--transparent-list")
    assert status == 0 and "coverage unknown" in text and "make -C interpose" in " ".join(text.split())


def test_missing_coverage_list_keeps_other_verdicts(cuda_builds: dict[str, Path], built_coverage_lookup: None,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """What does not depend on the list (a static runtime) is still said plainly."""
    monkeypatch.setattr(jitckpt.native, "find", lambda part, name: None)
    report = doctor_json(cuda_builds["static"])
    for mode in ("passthrough", "transparent"):
        assert report["verdict"][mode]["status"] == "not supported"


@pytest.mark.parametrize("content,message", [
    (None, "no such coverage list"),
    ("{not json", "invalid JSON"),
    ('{"functions": []}', "no 'functions' object"),
    ('{"functions": {"cudaMalloc": {"library": "cudart", "version": null, "passthrough": "maybe", '
     '"transparent": true}}}', "'passthrough' must be one of wrapped, forwarded"),
])
def test_bad_coverage_file_is_one_line_and_status_2(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "coverage.json"
    if content is not None:
        path.write_text(content)
    status, out, err = run_doctor("--transparent-list", "--coverage", str(path))
    assert status == 2 and out == ""
    assert err.count("\n") == 1 and message in err and str(path) in err


def test_transparent_list(coverage_file: Path, built_coverage_lookup: None,
                          monkeypatch: pytest.MonkeyPatch) -> None:
    """--transparent-list prints the list named with --coverage, whatever is built."""
    monkeypatch.setattr(jitckpt.native, "find", lambda part, name: None)
    status, text, _ = run_doctor("--transparent-list", "--coverage", str(coverage_file))
    assert status == 0
    assert "__cudaLaunchKernel" in text and "ncclAllReduce" in text and "libcudart.so.13" in text
    assert "cudaGraphLaunch" not in text and str(coverage_file) in text
    assert f"CUDA runtime, version libcudart.so.13 ({len(FIXTURE_RUNTIME)}; passthrough mode wraps 2 of them" in text
    status, out, _ = run_doctor("--transparent-list", "--json", "--coverage", str(coverage_file))
    data = json.loads(out)["coverage"]
    assert data["known"] is True
    assert data["runtime"]["cudaMalloc"] == "libcudart.so.13"
    assert data["nccl"]["ncclAllReduce"] is None
    assert data["passthrough"]["ncclAllReduce"] == "wrapped"


def test_ld_so_cache_is_parsed() -> None:
    if not doctor.LD_SO_CACHE.is_file():
        pytest.skip("no /etc/ld.so.cache")
    cache = doctor.read_ld_so_cache()
    assert any(os.path.basename(p) == "libc.so.6" for p in cache.get("libc.so.6", []))


@pytest.mark.parametrize("command", [["jitckpt.launch.cli", "doctor"], ["jitckpt.doctor"]])
def test_jit_run_doctor_command(cuda_builds: dict[str, Path], coverage_file: Path, command: list[str]) -> None:
    """The `jit-run doctor` entry point, as a user runs it, and `python -m jitckpt.doctor`."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", *command, str(cuda_builds["shared"]), "--coverage", str(coverage_file)],
                          capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("verdict: passthrough mode OK; transparent mode OK")


@pytest.mark.parametrize("case", ["missing", "text", "directory", "object", "script"])
def test_bad_input_is_one_line_and_status_2(case: str, tmp_path: Path, gcc: str) -> None:
    path = tmp_path / case
    expected = {"missing": "no such file", "text": "not an ELF", "directory": "is a directory",
                "object": "object file", "script": "a script?"}[case]
    if case == "text":
        path.write_text("just words\n")
    elif case == "directory":
        path.mkdir()
    elif case == "object":
        (tmp_path / "x.c").write_text("int f(void) { return 1; }\n")
        _run([gcc, "-c", "-o", str(path), "x.c"], tmp_path)
    elif case == "script":
        path.write_text("#!/bin/sh\necho hi\n")
    status, out, err = run_doctor(str(path))
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1 and expected in err and str(path) in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read any file")
def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"\x7fELF")
    path.chmod(0)
    status, _, err = run_doctor(str(path))
    assert status == 2 and "cannot read" in err and err.count("\n") == 1


def test_nodeflib_program_still_finds_ld_so_cache_entries_outside_the_system_directories(
        real_cudart: Path, gcc: str, tmp_path: Path) -> None:
    """DF_1_NODEFLIB makes glibc skip the ld.so.cache entries in the system directories only, not every entry."""
    cache_entry = next((line.rsplit("=> ", 1)[1].strip() for line in
                        subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout.splitlines()
                        if line.strip().startswith("libcudart.so.13 ")), None)
    if cache_entry is None:
        pytest.skip("libcudart.so.13 is not in this machine's ld.so.cache")
    (tmp_path / "uses_rt.c").write_text("int cudaGetDeviceCount(int *);\nint main(void) { int n; return cudaGetDeviceCount(&n); }\n")
    _run([gcc, "-o", "prog_nodeflib", "uses_rt.c", f"-L{real_cudart.parent}", "-l:libcudart.so.13",
          "-Wl,-z,nodefaultlib"], tmp_path)
    runtime = obj(doctor_json(tmp_path / "prog_nodeflib"), "libcudart.so.13")
    # glibc's dl-load.c: with DF_1_NODEFLIB a cache entry is dropped only if it lies in a system directory
    assert runtime["path"] is not None and Path(runtime["path"]).resolve() == Path(cache_entry).resolve()
    assert runtime["found_via"] == "ld.so.cache"
