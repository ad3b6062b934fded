"""Who can read and write a checkpoint root: everything jitckpt creates is owner-only whatever the umask
(checkpoint folders and files, the user's files once committed, the copies of every rank's stash, the
run directory's event logs, the report, the host stash itself), and a root other users can write to is
refused before anything runs.  Making things owner-only reaches nothing outside (a file the save function
hard-links into a checkpoint keeps its mode), never costs a save (a mode that cannot be changed is a
warning), and is never led elsewhere: a link, or another user's folder, where jitckpt keeps its files is
refused."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from conftest import REPO, job_env, run_jit
from jitckpt.launch import report
from jitckpt.store import CheckpointError, CheckpointWarning, ParallelCoordinates, check_writable
from jitckpt.store.disk import META_FILE, PendingSave, verify_or_raise
from jitckpt.worker import stash

LOADER_SCRIPT = REPO / "tests" / "user_programs" / "stateful_loader.py"
VOCAB_SCRIPT = REPO / "tests" / "user_programs" / "linked_vocab.py"
OTHER_UID = 65534  # nobody


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


def _committed(pending: PendingSave) -> tuple[Path, list[str]]:
    """Commit ``pending``; returns the checkpoint and the CheckpointWarnings the commit gave."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CheckpointWarning)
        final = pending.commit()
    return final, [str(w.message) for w in caught if issubclass(w.category, CheckpointWarning)]


def test_a_file_the_save_function_hard_links_in_keeps_its_mode_outside(tmp_path, open_umask):
    """A save function that ``os.link``s a large unchanged file (a vocabulary, frozen weights) into the
    checkpoint: its mode is the shared original's, so it is left as it is, and said once."""
    root = check_writable(tmp_path / "ckpt")
    vocab, frozen = tmp_path / "vocab.txt", tmp_path / "frozen.bin"
    for shared in (vocab, frozen):
        shared.write_text(f"shared {shared.name}")
        os.chmod(shared, 0o644)
    pending = PendingSave(root, 3, ParallelCoordinates.from_layout(0, 2))
    (pending.path / "state.pt").write_bytes(b"x")  # 0666 under umask 000
    os.link(vocab, pending.path / "vocab.txt")
    (pending.path / "weights").mkdir()
    os.link(frozen, pending.path / "weights" / "frozen.bin")
    final, warned = _committed(pending)
    assert _mode(vocab) == 0o644 and _mode(frozen) == 0o644, "a file outside the checkpoint changed its mode"
    assert _mode(final / "state.pt") == 0o600 and _mode(final / "weights") == 0o700
    assert len(warned) == 1 and "vocab.txt" in warned[0] and "weights/frozen.bin" in warned[0], warned
    assert warned[0].startswith(f"{final}: left open to other users, since other hard links share their mode")
    assert verify_or_raise(final).step == 3
    assert _open_to_others(root) == [f"ckpt/{final.relative_to(root)}/vocab.txt (644)",
                                     f"ckpt/{final.relative_to(root)}/weights/frozen.bin (644)"]


def test_a_job_whose_save_links_its_vocabulary_in_leaves_the_original_alone(tmp_path, open_umask):
    """The same through jit-run: a rank dies, the others' save functions link the vocabulary into their JIT
    checkpoints; the shared original keeps 0644, the job resumes from those checkpoints and completes."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("the quick brown fox\n" * 1000)
    os.chmod(vocab, 0o644)
    ckpt = tmp_path / "ckpt"
    result = run_jit(ckpt, nproc=2, args=["--steps", "8", "--vocab", str(vocab), "--die", "1:4"], script=VOCAB_SCRIPT)
    assert result.returncode == 0, result.output[-4000:]
    # (the path ends in rank-NNNNN: the two ranks' lines may interleave in the output, a line's end glued to
    # the other rank's next line)
    resumed = re.findall(r"resumed at minibatch (\d+) with the vocabulary from (\S*?/rank-\d+)", result.output)
    assert len(resumed) == 2, result.output[-4000:]
    assert _mode(vocab) == 0o644, f"the shared vocabulary became {_mode(vocab):o}"
    for _, path in resumed:
        assert (Path(path) / "vocab.txt").samefile(vocab)
        assert re.search(rf"{re.escape(path)}: left open to other users, since other hard links share their mode "
                         rf".*: vocab\.txt\.", result.output), result.output[-4000:]


@pytest.fixture
def immutable(tmp_path):
    """Make a file immutable (``chattr +i``: not even its owner, nor root, may change its mode); undone after.

    Undone on the whole of ``tmp_path``: the commit renames the folder the file was made immutable in, so its
    old path is gone (an immutable file left behind makes the run's clean-up fail).
    """
    made = False

    def make(path: Path) -> None:
        nonlocal made
        done = subprocess.run(["chattr", "+i", str(path)], capture_output=True, text=True) if shutil.which("chattr") else None
        if done is None or done.returncode != 0:
            pytest.skip("needs a file whose mode cannot be changed: chattr +i is not available here "
                        f"({done.stderr.strip() if done else 'no chattr'})")
        made = True

    yield make
    if made:
        for path in tmp_path.rglob("*"):
            if path.is_file() and not path.is_symlink():
                subprocess.run(["chattr", "-i", str(path)], check=False, capture_output=True)


def test_a_mode_that_cannot_be_changed_is_a_warning_not_a_lost_save(tmp_path, open_umask, immutable):
    root = check_writable(tmp_path / "ckpt")
    pending = PendingSave(root, 3, ParallelCoordinates.from_layout(0, 2))
    (pending.path / "state.pt").write_bytes(b"x")
    (pending.path / "pinned.bin").write_bytes(b"y")
    immutable(pending.path / "pinned.bin")
    final, warned = _committed(pending)
    assert verify_or_raise(final).step == 3, "the save was lost over a mode"
    assert _mode(final / "state.pt") == 0o600
    assert len(warned) == 1 and "could not make these owner-only" in warned[0] and "pinned.bin" in warned[0], warned


def test_a_link_in_the_checkpoint_where_jitckpt_writes_its_files_is_refused(tmp_path):
    """A folder of jitckpt's own (``jitckpt-rng/``) or its file replaced by a link, or a file of its own that
    is hard-linked elsewhere, in a pending checkpoint: nothing is written through them."""
    root = check_writable(tmp_path / "ckpt")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "kept.bin").write_bytes(b"not jitckpt's")
    pending = PendingSave(root, 3, ParallelCoordinates.from_layout(0, 2))
    (pending.path / "jitckpt-rng").symlink_to(elsewhere)
    with pytest.raises(PermissionError, match=r"jitckpt-rng is a symbolic link, not a folder"):
        pending.write_file("jitckpt-rng/rank-00001.bin", b"rng")
    (pending.path / "jitckpt-loader").mkdir()
    (pending.path / "jitckpt-loader" / "rank-00001.bin").symlink_to(elsewhere / "kept.bin")
    with pytest.raises(PermissionError, match=r"rank-00001.bin is a symbolic link"):
        pending.write_file("jitckpt-loader/rank-00001.bin", b"loader")
    os.link(elsewhere / "kept.bin", pending.path / "jitckpt-ddp-layout.json")
    with pytest.raises(PermissionError, match=r"jitckpt-ddp-layout.json is a file with other hard links"):
        pending.write_file("jitckpt-ddp-layout.json", b"[]")
    assert sorted(p.name for p in elsewhere.iterdir()) == ["kept.bin"]
    assert (elsewhere / "kept.bin").read_bytes() == b"not jitckpt's"


def test_the_host_stash_refuses_a_link_in_place_of_its_folder(tmp_path):
    """``/dev/shm/jitckpt-<run>`` sits in a sticky folder everyone can write: someone else may have put a link
    there under that name, to read or replace every rank's state."""
    shm = tmp_path / "shm"
    shm.mkdir()
    os.chmod(shm, 0o1777)
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (shm / "jitckpt-run").symlink_to(theirs)
    with pytest.raises(PermissionError, match=r"jitckpt-run is a symbolic link, not a folder.*Remove the link"):
        stash.StepStash(shm / "jitckpt-run", stash.RNG, 2)
    assert not any(theirs.iterdir())


@pytest.mark.skipif(os.geteuid() != 0, reason="needs a folder owned by another user: only root can make one here")
def test_the_host_stash_refuses_another_users_folder(tmp_path):
    shm = tmp_path / "shm"
    (shm / "jitckpt-run").mkdir(parents=True, mode=0o700)
    os.chmod(shm, 0o1777)
    os.chown(shm / "jitckpt-run", OTHER_UID, OTHER_UID)
    with pytest.raises(PermissionError, match=rf"jitckpt-run belongs to another user \(uid {OTHER_UID}\)"):
        stash.StepStash(shm / "jitckpt-run", stash.RNG, 2)
    assert not any((shm / "jitckpt-run").iterdir())


def test_the_host_stash_tightens_its_own_folder_left_open(tmp_path):
    shm = tmp_path / "shm" / "jitckpt-run"
    shm.mkdir(parents=True)
    os.chmod(shm, 0o777)
    stash.StepStash(shm, stash.RNG, 2).put(5, b"state")
    assert _mode(shm) == 0o700 and _mode(stash.stash_path(shm, stash.RNG, 2)) == 0o600


def test_folders_the_user_names_are_used_as_they_are(tmp_path):
    """The checkpoint root and the report's folder are the user's: an existing one is not changed (the
    root is judged by check_private), a missing one is made owner-only."""
    root = tmp_path / "project" / "ckpt"
    root.mkdir(parents=True)
    os.chmod(root, 0o755)
    os.chmod(root.parent, 0o2775)  # a team's shared project folder
    assert check_writable(root) == root and _mode(root) == 0o755 and _mode(root.parent) == 0o2775
    report.write({"outcome": "completed"}, root.parent / "report.json")
    assert _mode(root.parent) == 0o2775 and _mode(root.parent / "report.json") == 0o600
    report.write({"outcome": "completed"}, tmp_path / "new" / "reports" / "report.json")
    assert _mode(tmp_path / "new") == 0o700 and _mode(tmp_path / "new" / "reports") == 0o700


_RECORD = (
    "import os, sys; os.umask(0); from jitckpt import eventlog; "
    "eventlog.record('resume_refused', rank=0); eventlog.record('worker_exit', rank=0); print('RECORDED')"
)


def test_a_worker_started_by_hand_records_into_a_run_directory_still_missing(tmp_path):
    run_dir = tmp_path / "runs" / "today" / "run-1"
    result = subprocess.run([sys.executable, "-c", _RECORD], env=job_env() | {"JITCKPT_RUN_DIR": str(run_dir)},
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0 and "RECORDED" in result.stdout, result.stdout + result.stderr
    from jitckpt import eventlog

    assert [e["event"] for e in eventlog.read_all(run_dir)] == ["resume_refused", "worker_exit"]
    made = [tmp_path / "runs", tmp_path / "runs" / "today", run_dir, run_dir / "events"]
    assert {str(p.relative_to(tmp_path)): _mode(p) for p in made} == {str(p.relative_to(tmp_path)): 0o700 for p in made}
    assert [_mode(p) for p in (run_dir / "events").iterdir()] == [0o600]
    assert not result.stderr, result.stderr


def test_a_process_that_cannot_record_its_events_says_so_once(tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the run directory's parent should be")
    run_dir = blocker / "run-1"
    result = subprocess.run([sys.executable, "-c", _RECORD], env=job_env() | {"JITCKPT_RUN_DIR": str(run_dir)},
                            capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0 and "RECORDED" in result.stdout, result.stdout + result.stderr
    said = [line for line in result.stderr.splitlines() if "cannot record" in line]
    assert len(said) == 1 and str(run_dir / "events") in said[0] and "JITCKPT_RUN_DIR" in said[0], result.stderr
