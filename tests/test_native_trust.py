"""jit-run never preloads or runs native parts that another user could have changed.

The interposer and the remote library go on ``LD_PRELOAD`` of every worker and
the proxy runs as the job's user, so a build file (or a folder above it) that
group or others can write is code injection; ``jitckpt.native.trusted``
refuses it with the fix, and a build jitckpt starts itself runs under umask
022 whatever the user's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, job_env
from jitckpt import native


def _fake_part(root: Path, part: str) -> Path:
    for name in native.FILES[part]:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"\x7fELF")
        os.chmod(root / name, 0o755)
    os.chmod(root, 0o755)
    return root


def test_a_build_nobody_else_can_write_is_trusted(tmp_path: Path) -> None:
    build = _fake_part(tmp_path / "build", native.INTERPOSE)
    assert native.trusted(native.INTERPOSE, build) == build


@pytest.mark.parametrize("where", ["libjitckpt_interpose.so", "gen", "."])
def test_a_file_or_folder_others_can_write_is_refused_with_the_fix(tmp_path: Path, where: str) -> None:
    build = _fake_part(tmp_path / "build", native.INTERPOSE)
    target = build / where
    os.chmod(target, os.stat(target).st_mode | 0o002)
    with pytest.raises(native.NativeMissing, match=r"can be written by other users.*chmod go-w"):
        native.trusted(native.INTERPOSE, build)


def test_a_world_writable_sticky_folder_above_is_not_a_reason(tmp_path: Path) -> None:
    sticky = tmp_path / "shared"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    build = _fake_part(sticky / "build", native.PROXY)
    assert native.trusted(native.PROXY, build) == build


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give a file to another user")
def test_a_file_of_another_user_is_refused(tmp_path: Path) -> None:
    build = _fake_part(tmp_path / "build", native.PROXY)
    os.chown(build / "jitckpt-proxy", 12345, 12345)
    with pytest.raises(native.NativeMissing, match="belongs to another user"):
        native.trusted(native.PROXY, build)


def test_jit_run_transparent_refuses_a_proxy_others_can_write(tmp_path: Path) -> None:
    """From the user's side: a wheel-like install whose proxy is world-writable is refused before anything starts."""
    builds = {part: native.build_dir(part) for part in (native.PROXY, native.INTERPOSE, native.EMULATOR)}
    if None in builds.values():
        pytest.skip("the native parts are not built (make -C proxy_server; make -C emulator)")
    # a copy of the package with its native parts as package data, the proxy's folder world-writable
    package = tmp_path / "site" / "jitckpt"
    shutil.copytree(REPO / "jitckpt", package, ignore=shutil.ignore_patterns("__pycache__", "_build"))
    for part, built in builds.items():
        target = package / "native" / "_build" / part
        for name in native.FILES[part]:
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(built / name, target / name)
    os.chmod(package / "native" / "_build" / native.PROXY, 0o777)
    env = job_env()
    env["PYTHONPATH"] = str(tmp_path / "site")
    proc = subprocess.run([sys.executable, "-m", "jitckpt", "--transparent", "--emulated-gpus", "1", "/bin/true"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "can be written by other users" in proc.stderr and "chmod go-w" in proc.stderr, proc.stderr
