"""Who can read and write a checkpoint root: owner-only directories whatever the umask,
and a root other users can write to is refused before anything runs."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from conftest import REPO, job_env
from jitckpt.store import CheckpointError, ParallelCoordinates, check_writable
from jitckpt.store.disk import META_FILE, PendingSave


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def open_umask():
    old = os.umask(0)
    yield
    os.umask(old)


def test_everything_jitckpt_creates_is_owner_only_even_with_umask_000(tmp_path, open_umask):
    root = check_writable(tmp_path / "new" / "ckpt")
    assert _mode(root) == 0o700
    pending = PendingSave(root, 3, ParallelCoordinates.from_layout(1, 2))
    (pending.path / "state.pt").write_bytes(b"x")
    final = pending.commit()
    assert _mode(root / "step-00000003") == 0o700
    assert _mode(final) == 0o700
    assert _mode(final / META_FILE) == 0o600


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_root_others_can_write_to_is_refused(tmp_path, mode):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, mode)
    with pytest.raises(CheckpointError, match="can be written by other users"):
        check_writable(root)


def test_jit_run_refuses_a_world_writable_root_before_starting(tmp_path):
    root = tmp_path / "shared"
    root.mkdir()
    os.chmod(root, 0o777)
    result = subprocess.run([sys.executable, "-m", "jitckpt", "--checkpoint-dir", str(root), "torchrun", "x.py"],
                            env=job_env(), capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 2
    assert "can be written by other users" in result.stderr and f"chmod go-w {root}" in result.stderr
    assert not any(root.iterdir()), "nothing may be created in a refused root"
