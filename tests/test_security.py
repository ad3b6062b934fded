"""Who can read and write a checkpoint root: everything jitckpt creates is owner-only whatever the umask
(checkpoint folders and files, the user's files once committed, the copies of every rank's stash, the
run directory's event logs, the report, the host stash itself), and a root other users can write to is
refused before anything runs."""

from __future__ import annotations

import os
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, job_env, run_jit
from jitckpt.store import CheckpointError, ParallelCoordinates, check_writable
from jitckpt.store.disk import META_FILE, PendingSave
from jitckpt.worker import stash

LOADER_SCRIPT = REPO / "tests" / "user_programs" / "stateful_loader.py"


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def _open_to_others(root: Path) -> list[str]:
    """Every folder and file under ``root`` (itself included; links not followed) that group or others may use."""
    found = []
    for folder, dirs, files in os.walk(root):
        for path in [Path(folder) / name for name in dirs + files] + ([root] if Path(folder) == root else []):
            st = os.lstat(path)
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o077:
                found.append(f"{path.relative_to(root.parent)} ({stat.S_IMODE(st.st_mode):o})")
    return sorted(found)


@pytest.fixture(params=[0o000, 0o277], ids=["umask-000", "umask-277"])
def any_umask(request):
    """The process's umask set to one that opens everything (000) or that takes the owner's write bit (277)."""
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


@pytest.fixture
def open_umask():
    old = os.umask(0)
    yield
    os.umask(old)


def test_everything_the_store_creates_is_owner_only_whatever_the_umask(tmp_path, any_umask):
    root = check_writable(tmp_path / "new" / "ckpt")
    assert _mode(tmp_path / "new") == 0o700 and _mode(root) == 0o700
    pending = PendingSave(root, 3, ParallelCoordinates.from_layout(1, 2))
    pending.write_file("jitckpt-rng/rank-00001.bin", b"rng")
    pending.write_file("jitckpt-ddp-layout.json", b"[]")
    final = pending.commit()
    modes = {str(p.relative_to(root)): _mode(p) for p in [root, *root.rglob("*")]}
    assert modes == {
        ".": 0o700,
        "step-00000003": 0o700,
        "step-00000003/rank-00001": 0o700,
        "step-00000003/rank-00001/jitckpt-rng": 0o700,
        "step-00000003/rank-00001/jitckpt-rng/rank-00001.bin": 0o600,
        "step-00000003/rank-00001/jitckpt-ddp-layout.json": 0o600,
        f"step-00000003/rank-00001/{META_FILE}": 0o600,
    }
    assert (final / "jitckpt-rng" / "rank-00001.bin").read_bytes() == b"rng"


def test_the_users_files_are_made_owner_only_at_commit_and_links_are_not_followed(tmp_path, open_umask):
    root = check_writable(tmp_path / "ckpt")
    outside = tmp_path / "shared.txt"
    outside.write_text("not jitckpt's")
    os.chmod(outside, 0o644)
    pending = PendingSave(root, 3, ParallelCoordinates.from_layout(0, 2))
    (pending.path / "state.pt").write_bytes(b"x")  # as a save function writes under umask 000: 0666
    (pending.path / "shards" / "part-0").mkdir(parents=True)  # 0777
    (pending.path / "shards" / "part-0" / "data.bin").write_bytes(b"y")
    (pending.path / "script.sh").write_text("#!/bin/sh\n")
    os.chmod(pending.path / "script.sh", 0o775)
    (pending.path / "link").symlink_to(outside)
    final = pending.commit()
    assert not _open_to_others(root), _open_to_others(root)
    assert _mode(final / "shards" / "part-0") == 0o700 and _mode(final / "shards" / "part-0" / "data.bin") == 0o600
    assert _mode(final / "script.sh") == 0o700, "only the group's and others' bits go"
    assert _mode(outside) == 0o644, "a link's target outside the checkpoint is left alone"


@pytest.mark.parametrize("name", ["", ".", "/etc/passwd", "../rank-00002/x", "a/../../x", META_FILE, f"./{META_FILE}"])
def test_a_file_name_outside_the_checkpoint_or_its_metadata_is_refused(tmp_path, name):
    pending = PendingSave(check_writable(tmp_path / "ckpt"), 3, ParallelCoordinates.from_layout(0, 2))
    with pytest.raises(ValueError, match="not a file name inside the checkpoint"):
        pending.write_file(name, b"x")
    assert not any(pending.path.iterdir())


def test_the_host_stash_is_owner_only_whatever_the_umask(tmp_path, any_umask):
    shm = tmp_path / "shm" / "jitckpt-run"
    stash.StepStash(shm, stash.RNG, 2).put(5, b"state")
    assert _mode(shm.parent) == 0o700 and _mode(shm) == 0o700
    assert _mode(stash.stash_path(shm, stash.RNG, 2)) == 0o600
    assert stash.read_stash(stash.stash_path(shm, stash.RNG, 2)) == {5: b"state"}


def test_a_jit_checkpoint_made_under_umask_000_is_owner_only_throughout(tmp_path, open_umask):
    """A real job under ``umask 000``: its JIT checkpoint (the user's file, every local rank's RNG and
    loader state, DDP's layout, the metadata), the run directory's event logs and the report."""
    ckpt = tmp_path / "ckpt"
    result = run_jit(ckpt, nproc=3, args=["--die", "1:5:kill", "--epochs", "1"], script=LOADER_SCRIPT)
    assert result.returncode == 0, result.output[-4000:]
    created = {p.relative_to(ckpt).as_posix() for p in ckpt.rglob("*")}
    rank_dir = "step-00000005/rank-00000"
    for name in ["state.pt", META_FILE, "jitckpt-ddp-layout.json", "jitckpt-rng/rank-00001.bin",
                 "jitckpt-loader/rank-00001.bin"]:
        assert f"{rank_dir}/{name}" in created, f"{name} missing: the job did not make every kind of file"
    assert any(re.fullmatch(r"\.jitckpt/run-[^/]+/events/[^/]+\.jsonl", p) for p in created), sorted(created)
    loose = _open_to_others(ckpt) + [f"ckpt-report.json ({_mode(tmp_path / 'ckpt-report.json'):o})"] * bool(
        _mode(tmp_path / "ckpt-report.json") & 0o077)
    assert not loose, "open to group or others:\n" + "\n".join(loose)


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
