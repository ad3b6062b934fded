"""Bad checkpoints on disk: a clear message, nothing lost, and training still ends bit-exact."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from conftest import plant_code, run_jit

pytestmark = pytest.mark.slow


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


def test_corrupt_newest_checkpoint_falls_back_to_the_previous_good_one(tmp_path, fault_free_sha):
    ckpt = tmp_path / "ckpt"
    faults = "rank=2,step=8,phase=backward,kind=kill;rank=1,step=18,phase=forward,kind=kill,attempt=1"
    first = run_jit(ckpt, fault=faults, max_restarts=1)
    assert first.returncode != 0 or first.report["restarts"] == 1  # ran out of restarts after the 2nd save
    newest = sorted((ckpt / "step-00000018").glob("rank-*"))
    assert len(newest) == 2  # ranks 0 and 2 (3 ranks, rank 1 failed)
    for replica in newest:  # corrupt every replica of the newest step
        state = replica / "state.pt"
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0x5A
        state.write_bytes(bytes(data))
    second = run_jit(ckpt)
    assert second.returncode == 0, second.output[-4000:]
    assert "fails its xxh3_128 checksum" in second.output
    assert "resuming from minibatch 8" in second.output
    assert "already holds a complete checkpoint of minibatch 18" in second.output  # jit-run says it resumes
    assert second.sha == fault_free_sha
    assert (ckpt / "step-00000018").is_dir(), "the corrupt checkpoint must be left for inspection"


def test_wrong_world_size_is_a_clear_error_and_loses_nothing(tmp_path):
    ckpt = tmp_path / "ckpt"
    saved = run_jit(ckpt, fault="rank=2,step=6,phase=forward,kind=kill", max_restarts=0)
    assert saved.returncode != 0 and (ckpt / "step-00000006").is_dir()
    assert "rerun the same command to resume" in saved.output  # --max-restarts 0: the hint
    before = tree_digest(ckpt / "step-00000006")
    wrong = run_jit(ckpt, nproc=2, max_restarts=0)
    assert wrong.returncode != 0
    assert "written by a job of world size [3], but this job has world size 2" in wrong.output
    assert tree_digest(ckpt / "step-00000006") == before


def test_planted_code_in_a_checkpoint_is_never_run(tmp_path):
    """Every replica's RNG file replaced by a pickle that runs code, with the metadata checksums updated
    to match (what someone with write access to the checkpoint root could do): the resume refuses loudly,
    and the planted code never runs."""
    ckpt = tmp_path / "ckpt"
    saved = run_jit(ckpt, fault="rank=2,step=6,phase=forward,kind=kill", max_restarts=0)
    assert saved.returncode != 0 and (ckpt / "step-00000006").is_dir()
    marker = tmp_path / "planted-code-ran"
    planted = plant_code(ckpt / "step-00000006", "jitckpt-rng/", marker)
    assert planted == 6  # every rank's state (3), in every replica (2)
    second = run_jit(ckpt, max_restarts=0)
    assert not marker.exists(), "code planted in a checkpoint ran on resume"
    assert second.returncode != 0
    assert "is unusable (not a jitckpt RNG state" in second.output, second.output[-4000:]



def test_a_checkpoint_folder_copied_under_another_name_is_refused(tmp_path, fault_free_sha):
    """step-6 copied by hand to step-12 (its metadata still says minibatch 6), and rank 1's folder of step 6
    replaced by a link to rank 0's: before, the ranks loaded the copy as the newest checkpoint, and jit-run
    said it resumed from minibatch 12.  Both are refused by name; the job resumes from the real step 6."""
    ckpt = tmp_path / "ckpt"
    saved = run_jit(ckpt, fault="rank=2,step=6,phase=forward,kind=kill", max_restarts=0)
    assert saved.returncode != 0 and (ckpt / "step-00000006").is_dir()
    shutil.copytree(ckpt / "step-00000006", ckpt / "step-00000012")
    shutil.rmtree(ckpt / "step-00000006" / "rank-00001")
    (ckpt / "step-00000006" / "rank-00001").symlink_to(ckpt / "step-00000006" / "rank-00000")
    second = run_jit(ckpt, max_restarts=0)
    assert second.returncode == 0, second.output[-4000:]
    assert "step-00000012/rank-00000: its metadata says minibatch 6, its folder step-00000012" in second.output
    assert "step-00000006/rank-00001: its metadata says rank 0, its folder rank-00001" in second.output
    assert "resuming from minibatch 6" in second.output and "resuming from minibatch 12" not in second.output
    assert second.report["start"]["resumed_from_minibatch"] == 6, second.report["start"]
    assert second.sha == fault_free_sha


def test_a_fresh_start_over_unusable_checkpoints_is_said_and_reported(tmp_path, fault_free_sha):
    """Every replica of the only checkpoint truncated: jit-run warns before the start, every rank says what is
    wrong, the job trains from minibatch 0 to the fault-free result, and the report names what it passed over
    (before, it read like a fresh job's: no failures, nothing about the checkpoint left behind)."""
    ckpt = tmp_path / "ckpt"
    saved = run_jit(ckpt, fault="rank=2,step=6,phase=forward,kind=kill", max_restarts=0)
    assert saved.returncode != 0
    for replica in (ckpt / "step-00000006").glob("rank-*"):
        state = replica / "state.pt"
        state.write_bytes(state.read_bytes()[:100])
    before = tree_digest(ckpt / "step-00000006")
    second = run_jit(ckpt, max_restarts=0)
    assert second.returncode == 0, second.output[-4000:]
    assert "holds checkpoint folders (minibatch 6) but none is complete" in second.output
    assert "file state.pt has 100 bytes" in second.output, second.output[-4000:]
    assert "a fresh start from minibatch 0" in second.output
    start = second.report["start"]
    assert start["resumed_from_minibatch"] is None and start["unusable_checkpoints"], start
    assert any("state.pt has 100 bytes" in why for why in start["unusable_checkpoints"]), start
    assert "started: from minibatch 0, passing over the checkpoints on disk" in second.output
    assert second.sha == fault_free_sha
    assert tree_digest(ckpt / "step-00000006") == before  # left for inspection
