"""A real wheel, built and installed the way a cluster admin builds the job image, works like the source checkout.

* ``scripts/install-image.sh`` -- what ``docker/Dockerfile`` runs -- in a fresh
  virtual environment (seeing this interpreter's torch), from a clean copy of
  the source tree (what git would check out: no build outputs), on a machine
  made to look like a slim image: no CUDA toolkit (``CUDA_HOME`` is an empty
  directory) and no ``nvidia-nccl-cu13`` in the environment being installed
  into.  Its plain, isolated ``pip wheel .`` must fetch the header wheels as
  build requirements and give the complete wheel: the CPU device emulator,
  the interposition libraries, ``jitckpt-proxy``, tagged for this platform,
  with a record of the headers used.  The installed package is then used from
  a directory outside the checkout: ``jit-run emulator-path``, the interposer
  and doctor's coverage list resolve inside that environment, and a real
  2-rank job with an injected failure saves, restarts and resumes.
* A build that cannot build the native parts fails and says why (no make or
  gcc; no CUDA headers and no NCCL header, with the header wheels turned off),
  instead of giving a wheel without them.
* ``JITCKPT_BUILD_NATIVE=0`` gives a pure-Python wheel, says so while
  building, and the installed jit-run says so when a native part is asked for.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

from conftest import EXAMPLE, REPO, TRAIN_ARGS, job_env

pytestmark = pytest.mark.slow

NATIVE_FILES = [
    "jitckpt/native/_build/emulator/libcudart.so.13",
    "jitckpt/native/_build/emulator/libnccl.so.2",
    "jitckpt/native/_build/interpose/libjitckpt_interpose.so",
    "jitckpt/native/_build/interpose/gen/coverage.json",
    "jitckpt/native/_build/interpose/gen/jitckpt_interpose.cdef",
    "jitckpt/native/_build/interpose/libjitckpt_remote.so",
    "jitckpt/native/_build/proxy_server/jitckpt-proxy",
]
BUILD_INFO = "jitckpt/native/_build/build-info.json"
BOOTSTRAP = "jitckpt/worker/_bootstrap/sitecustomize.py"
# Variables that would point the build at headers, or change what it builds.
BUILD_VARIABLES = ("CUDA_HOME", "CUDA_INCLUDE", "NCCL_INCLUDE", "NCCL_HOME", "CPATH", "JITCKPT_BUILD_NATIVE",
                   "JITCKPT_HEADER_WHEELS", "PYTHONPATH", "PIP_NO_BUILD_ISOLATION")
BUILD_TIMEOUT = 1200


def clean_copy(destination: Path) -> Path:
    """The source tree as a clean clone of the working tree would have it: git's files, no build outputs."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():  # (a file deleted in the working tree is listed but gone)
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name, follow_symlinks=False)
    return destination


def build_env(**extra: str) -> dict[str, str]:
    """The caller's environment without anything that points the build at headers or changes it."""
    env = {k: v for k, v in job_env().items() if k not in BUILD_VARIABLES}
    env.update(extra)
    return env


def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def read_build_info(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as archive:
        return json.loads(archive.read(BUILD_INFO))


# ---- the image's install, outside Docker -------------------------------------------------------------


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> dict:
    """scripts/install-image.sh into a fresh venv that sees this interpreter's torch, with no CUDA toolkit."""
    root = tmp_path_factory.mktemp("image")
    source = clean_copy(root / "src")
    env_dir = root / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    assert not (site / "nvidia").exists()  # the environment has no NVIDIA wheels of its own
    no_cuda = root / "no-cuda"
    no_cuda.mkdir()
    done = subprocess.run(["bash", str(source / "scripts" / "install-image.sh")], capture_output=True, text=True,
                          timeout=BUILD_TIMEOUT, cwd=root,
                          env=build_env(PYTHON=str(python), JITCKPT_WHEEL_DIR=str(root / "dist"),
                                        CUDA_HOME=str(no_cuda)))
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    wheels = list((root / "dist").glob("jitckpt-*.whl"))
    assert len(wheels) == 1, wheels
    return {"venv": env_dir, "wheel": wheels[0], "output": output}


def test_an_isolated_build_fetches_the_headers_and_ships_the_native_parts(image) -> None:
    wheel = image["wheel"]
    assert wheel.name.endswith("-py3-none-linux_x86_64.whl"), wheel.name  # machine code: for this platform
    names = wheel_names(wheel)
    missing = [name for name in (*NATIVE_FILES, BUILD_INFO, BOOTSTRAP) if name not in names]
    assert not missing, f"the wheel lacks {missing}"
    info = read_build_info(wheel)
    assert info["native"] is True, info
    # no toolkit and no NCCL in the environment: both came from wheels pip installed for the build
    cuda, nccl = info["cuda_headers"], info["nccl_header"]
    assert cuda["how"].startswith("NVIDIA's header wheels in the build environment (nvidia-cuda-runtime 13."), cuda
    assert "pip-build-env" in cuda["include"] and cuda["include"].endswith("nvidia/cu13/include"), cuda
    assert re.fullmatch(r"nvidia-nccl-cu13 2\.\d+\.\d+ in the build environment", nccl["how"]), nccl
    assert "pip-build-env" in nccl["include"] and re.fullmatch(r"2\.\d+\.\d+", nccl["version"]), nccl
    assert "[install-image] jitckpt installed with its native parts" in image["output"]
    assert f"NCCL {nccl['version']}'s header" in image["output"]
    # which of NVIDIA's libraries transparent mode forwards is recorded and said: with the headers
    # scripts/setup.sh caches (the Makefiles look there), all three, and the emulator's versions ship too
    from native_toolchain import CUBLAS_INCLUDE, CUDNN_INCLUDE
    expected = {"cuBLAS": CUBLAS_INCLUDE is not None, "cuBLASLt": CUBLAS_INCLUDE is not None,
                "cuDNN": CUDNN_INCLUDE is not None}
    assert info["forwarded"] == expected, info
    said = "[install-image] transparent mode forwards " + (", ".join(n for n, on in expected.items() if on) or "none")
    assert said in image["output"], image["output"][-3000:]
    if expected["cuDNN"]:
        assert "jitckpt/native/_build/emulator/libcudnn.so.9" in names, sorted(names)


def test_the_image_runs_the_tested_install_script() -> None:
    """docker/Dockerfile installs with the script tested here, on a base image without CUDA."""
    dockerfile = (REPO / "docker" / "Dockerfile").read_text()
    instructions = re.sub(r"\\\n", " ", re.sub(r"^\s*#.*\n", "", dockerfile, flags=re.M))
    runs = [line for line in instructions.splitlines() if line.startswith("RUN ")]
    assert any("scripts/install-image.sh" in run for run in runs), runs
    base = re.search(r"^FROM\s+(\S+)", instructions, re.M)
    assert base and "cuda" not in base.group(1).lower(), base


def _env() -> dict[str, str]:
    env = job_env()
    env.pop("PYTHONPATH", None)  # nothing from the checkout
    return env


def test_wheel_install_finds_its_own_native_parts(image, tmp_path):
    installed = image["venv"]
    python = installed / "bin" / "python"
    probe = (
        "import json, jitckpt, jitckpt.native as n; from jitckpt.native import interposer; "
        "print(json.dumps({'package': jitckpt.__file__, 'emulator': str(n.build_dir('emulator')), "
        "'interposer': str(interposer.library_path()), 'coverage': str(n.find('interpose', 'gen/coverage.json')), "
        "'proxy': str(n.find('proxy_server', 'jitckpt-proxy'))}))"
    )
    result = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_env())
    assert result.returncode == 0, result.stderr
    where = json.loads(result.stdout)
    for key, path in where.items():
        assert Path(path).resolve().is_relative_to(installed.resolve()), f"{key} resolved outside the venv: {path}"
    result = subprocess.run([str(installed / "bin" / "jit-run"), "emulator-path"], capture_output=True, text=True,
                            timeout=120, cwd=tmp_path, env=_env())
    assert result.returncode == 0, result.stderr
    assert Path(result.stdout.strip()).resolve().is_relative_to(installed.resolve())
    # doctor reads the generated coverage list shipped in the wheel
    result = subprocess.run([str(installed / "bin" / "jit-run"), "doctor", str(Path(where["emulator"]) / "libnccl.so.2")],
                            capture_output=True, text=True, timeout=120, cwd=tmp_path, env=_env())
    assert result.returncode == 0 and "coverage unknown" not in result.stdout, result.stdout + result.stderr


def test_wheel_install_runs_a_job_through_a_failure(image, tmp_path):
    installed = image["venv"]
    ckpt = tmp_path / "ckpt"
    report = tmp_path / "report.json"
    cmd = [str(installed / "bin" / "jit-run"), "--checkpoint-dir", str(ckpt), "--hang-timeout", "3", "--save-grace", "30",
           "--report", str(report), "--fault", "rank=1,step=5,phase=backward,kind=kill",
           "torchrun", "--standalone", "--nproc_per_node", "2", "--max-restarts", "2", str(EXAMPLE), *TRAIN_ARGS]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=_env())
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    data = json.loads(report.read_text())
    assert data["restarts"] == 1, data
    assert "JIT checkpoint of minibatch 5 committed" in output, output[-4000:]
    assert "resuming from minibatch 5" in output, output[-4000:]


def backend(env: dict[str, str]) -> dict:
    """The build backend's answers for this interpreter: the requirements it gives pip for a wheel (the PEP 517
    hook), and the headers it finds without any (how each was found, or None)."""
    hook = ("import json, native_build as b; cuda, nccl = b.find_cuda_headers(False)[0], b.find_nccl_header(False)[0]; "
            "print(json.dumps({'requires': b.get_requires_for_build_wheel(), 'cuda': cuda and cuda.how, "
            "'nccl': nccl and nccl.how}))")
    done = subprocess.run([sys.executable, "-c", hook], capture_output=True, text=True, timeout=120, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_build_asks_only_for_the_headers_this_host_lacks(tmp_path: Path) -> None:
    """The 300 MB nvidia-nccl-cu13 wheel is fetched for its header only when no nccl.h is found elsewhere (here:
    the one installed in this environment), the CUDA header wheels only when the toolkit has no headers."""
    header_wheels = ("nvidia-cuda-runtime", "nvidia-cuda-crt", "nvidia-cuda-cccl", "nvidia-cuda-profiler-api",
                     "nvidia-nccl-cu13")
    here = backend(build_env())
    if not here["cuda"] or not here["nccl"] or "environment being installed into" not in here["nccl"]:
        pytest.skip(f"needs the CUDA toolkit's headers and nvidia-nccl-cu13 installed in this environment ({here})")
    assert not [r for r in here["requires"] if r.startswith(header_wheels)], here
    no_cuda = tmp_path / "no-cuda"
    no_cuda.mkdir()
    asked = [r for r in backend(build_env(CUDA_HOME=str(no_cuda)))["requires"] if r.startswith(header_wheels)]
    assert asked == ["nvidia-cuda-runtime>=13,<14", "nvidia-cuda-crt>=13,<14", "nvidia-cuda-cccl>=13,<14",
                     "nvidia-cuda-profiler-api>=13,<14"], asked
    opted_out = backend(build_env(CUDA_HOME=str(no_cuda), JITCKPT_BUILD_NATIVE="0"))["requires"]
    assert not [r for r in opted_out if r.startswith(header_wheels)], opted_out


# ---- builds that cannot build the native parts, and the opt-out --------------------------------------


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """A fresh venv with pip and nothing else: no torch, no NVIDIA wheels, no setuptools of jitckpt's choosing."""
    env_dir = tmp_path_factory.mktemp("bare") / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    return env_dir / "bin" / "python"


def pip_wheel(python: Path, tmp_path: Path, env: dict[str, str]) -> tuple[subprocess.CompletedProcess, list[Path]]:
    """`pip wheel -v .` of a clean copy (isolated, as a user runs it); the result and the wheels it made."""
    source = clean_copy(tmp_path / "src")
    done = subprocess.run([str(python), "-m", "pip", "wheel", "-v", "--no-deps", "-w", str(tmp_path / "dist"),
                           str(source)], capture_output=True, text=True, timeout=BUILD_TIMEOUT, cwd=tmp_path, env=env)
    return done, list((tmp_path / "dist").glob("*.whl"))


def test_a_build_without_make_or_gcc_fails_with_the_reason(bare_python: Path, tmp_path: Path) -> None:
    empty_bin = tmp_path / "bin"
    empty_bin.mkdir()
    done, wheels = pip_wheel(bare_python, tmp_path, build_env(PATH=str(empty_bin)))
    out = done.stdout + done.stderr
    assert done.returncode != 0 and not wheels, out[-4000:]
    assert "jitckpt: cannot build the native parts" in out, out[-4000:]
    assert "make (e.g. apt-get install make)" in out and "gcc (e.g. apt-get install gcc)" in out, out[-4000:]
    assert "To install jitckpt without them (user-level mode only): JITCKPT_BUILD_NATIVE=0" in out
    assert "the native build asks for header wheels" not in out  # a build bound to fail fetches nothing


def test_a_build_without_the_headers_fails_naming_them(bare_python: Path, tmp_path: Path) -> None:
    """No toolkit (CUDA_HOME empty), no NCCL in the environment, and the header wheels turned off."""
    no_cuda = tmp_path / "no-cuda"
    no_cuda.mkdir()
    done, wheels = pip_wheel(bare_python, tmp_path, build_env(CUDA_HOME=str(no_cuda), JITCKPT_HEADER_WHEELS="0"))
    out = done.stdout + done.stderr
    assert done.returncode != 0 and not wheels, out[-4000:]
    assert "jitckpt: cannot build the native parts" in out, out[-4000:]
    assert "the CUDA 13 runtime headers (cuda_runtime_api.h" in out, out[-4000:]
    assert f"the CUDA toolkit, {no_cuda}/include (CUDA_HOME)" in out, out[-4000:]
    assert "pip install nvidia-cuda-runtime>=13,<14" in out and "unless JITCKPT_HEADER_WHEELS=0" in out
    if not any(Path(d, "nccl.h").exists() for d in ("/usr/include", "/usr/local/include")):
        assert "NCCL's header nccl.h; looked in: nvidia-nccl-cu13 (nvidia/nccl/include)" in out, out[-4000:]


def test_opting_out_builds_a_pure_python_wheel_and_says_so(bare_python: Path, tmp_path: Path) -> None:
    done, wheels = pip_wheel(bare_python, tmp_path, build_env(JITCKPT_BUILD_NATIVE="0"))
    out = done.stdout + done.stderr
    assert done.returncode == 0 and len(wheels) == 1, out[-4000:]
    assert "JITCKPT_BUILD_NATIVE=0: building a pure-Python jitckpt without its native parts" in out
    wheel = wheels[0]
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    names = wheel_names(wheel)
    assert not [n for n in names if n.endswith(".so") or ".so." in n or n.endswith("jitckpt-proxy")], names
    assert BOOTSTRAP in names and read_build_info(wheel) == {
        "native": False, "reason": "built with JITCKPT_BUILD_NATIVE=0 (a pure-Python jitckpt)"}
    # installed, it says so when a native part is asked for
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    install = subprocess.run([sys.executable, "-m", "pip", "--python", str(env_dir / "bin" / "python"), "install",
                              "--no-deps", "--no-index", "--force-reinstall", "--quiet", str(wheel)],
                             capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    jit_run = str(env_dir / "bin" / "jit-run")
    result = subprocess.run([jit_run, "--transparent", "true"], capture_output=True, text=True, timeout=120,
                            cwd=tmp_path, env=_env())
    assert result.returncode == 2, result.stdout + result.stderr
    assert "this jitckpt was installed without its native parts (built with JITCKPT_BUILD_NATIVE=0" in result.stderr
    result = subprocess.run([jit_run, "emulator-path"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                            env=_env())
    assert result.returncode == 1 and "installed without its native parts" in result.stderr, result.stderr
