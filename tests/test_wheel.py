"""A real wheel, installed the way a cluster admin installs it, works like the source checkout.

``pip wheel .`` builds the native parts and ships them as package data
(``jitckpt/native/_build/``) together with the workers' bootstrap; the wheel
is then installed, non-editable, into a fresh virtual environment, and used
from a directory outside the checkout: ``jit-run emulator-path`` and the
interposer must resolve inside that environment, and a real 2-rank job with
an injected failure must save, restart and resume.
"""

from __future__ import annotations

import json
import os
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
    "jitckpt/worker/_bootstrap/sitecustomize.py",
]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv (seeing this interpreter's torch) with the wheel built from this checkout installed."""
    root = tmp_path_factory.mktemp("wheel")
    dist = root / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(dist), str(REPO)],
        capture_output=True, text=True, timeout=900, cwd=root, env=job_env() | {"JITCKPT_REQUIRE_NATIVE": "1"},
    )
    assert build.returncode == 0, build.stdout + build.stderr
    wheels = list(dist.glob("jitckpt-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
    missing = [name for name in NATIVE_FILES if name not in names]
    assert not missing, f"the wheel lacks {missing}"
    env_dir = root / "venv"
    venv.EnvBuilder(system_site_packages=True, with_pip=False).create(env_dir)
    python = env_dir / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "--quiet", str(wheels[0])],
        capture_output=True, text=True, timeout=300,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    return env_dir


def _env() -> dict[str, str]:
    env = job_env()
    env.pop("PYTHONPATH", None)  # nothing from the checkout
    return env


def test_wheel_install_finds_its_own_native_parts(installed, tmp_path):
    python = installed / "bin" / "python"
    probe = (
        "import json, jitckpt, jitckpt.native as n; from jitckpt.native import interposer; "
        "print(json.dumps({'package': jitckpt.__file__, 'emulator': str(n.build_dir('emulator')), "
        "'interposer': str(interposer.library_path()), 'coverage': str(n.find('interpose', 'gen/coverage.json'))}))"
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


def test_wheel_install_runs_a_job_through_a_failure(installed, tmp_path):
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
