"""Unit tests of the checkpoint store: atomic commit, verification, selection, pruning."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

from jitckpt.store import CheckpointError, CheckpointInfo, CheckpointWarning, DiskStore, ParallelCoordinates, select
from jitckpt.store import disk as store


def coords(rank: int, world: int = 4, tp: int = 1, pp: int = 1) -> ParallelCoordinates:
    return ParallelCoordinates.from_layout(rank, world, tp_size=tp, pp_size=pp)


def save(root: Path, step: int, rank: int, payload: bytes = b"state", world: int = 4, tp: int = 1, pp: int = 1) -> Path:
    pending = store.PendingSave(root, step, coords(rank, world, tp, pp))
    (pending.path / "state.pt").write_bytes(payload)
    (pending.path / "sub").mkdir()
    (pending.path / "sub" / "extra.bin").write_bytes(payload * 3)
    return pending.commit({"reason": "test"})


def find(root: Path, rank: int = 0, world: int = 4, **kw) -> tuple[CheckpointInfo | None, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CheckpointWarning)
        info = select(DiskStore(root), coords(rank, world, kw.pop("tp", 1), kw.pop("pp", 1)), **kw)
    return info, [str(w.message) for w in caught]


def test_commit_publishes_directory_with_checksummed_metadata(tmp_path):
    final = save(tmp_path, 7, 2, b"abc")
    assert final == tmp_path / "step-00000007" / "rank-00002"
    meta = json.loads((final / store.META_FILE).read_text())
    assert meta["step"] == 7 and meta["rank"] == 2 and meta["world_size"] == 4 and meta["dp_rank"] == 2
    assert set(meta["files"]) == {"state.pt", "sub/extra.bin"}
    assert meta["files"]["state.pt"]["size"] == 3
    assert not list((tmp_path / "step-00000007").glob(".*partial*"))
    info = store.verify(final)
    assert info is not None and info.step == 7


def test_newest_complete_checkpoint_is_chosen_and_own_replica_preferred(tmp_path):
    save(tmp_path, 3, 0)
    save(tmp_path, 9, 1)
    save(tmp_path, 9, 3)
    info, warns = find(tmp_path, rank=3)
    assert info.step == 9 and info.path.name == "rank-00003" and not warns
    info, _ = find(tmp_path, rank=0)  # rank 0 has no own copy at step 9: any replica will do
    assert info.step == 9 and info.path.name in ("rank-00001", "rank-00003")


def test_torn_save_is_never_returned(tmp_path):
    save(tmp_path, 3, 0)
    pending = store.PendingSave(tmp_path, 9, coords(1))
    (pending.path / "state.pt").write_bytes(b"half")  # never committed: process died
    info, _ = find(tmp_path)
    assert info.step == 3
    assert store.torn_saves(tmp_path) == [pending.path]


def test_directory_without_metadata_is_skipped_with_warning(tmp_path):
    save(tmp_path, 3, 0)
    final = save(tmp_path, 9, 1)
    (final / store.META_FILE).unlink()
    info, warns = find(tmp_path)
    assert info.step == 3
    assert any("torn save" in w for w in warns)


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete", "bad-json"])
def test_corrupt_newest_checkpoint_falls_back_to_previous_good(tmp_path, damage):
    save(tmp_path, 3, 0, b"old-state")
    final = save(tmp_path, 9, 0, b"new-state")
    if damage == "flip":
        data = bytearray((final / "state.pt").read_bytes())
        data[0] ^= 0xFF
        (final / "state.pt").write_bytes(bytes(data))
    elif damage == "truncate":
        (final / "sub" / "extra.bin").write_bytes(b"x")
    elif damage == "delete":
        (final / "state.pt").unlink()
    else:
        (final / store.META_FILE).write_text("{not json")
    info, warns = find(tmp_path)
    assert info.step == 3 and (info.path / "state.pt").read_bytes() == b"old-state"
    assert warns, "skipping a corrupt checkpoint must be reported"


def test_a_good_replica_beats_a_corrupt_one_of_the_same_step(tmp_path):
    bad = save(tmp_path, 9, 0, b"state")
    save(tmp_path, 9, 1, b"state")
    (bad / "state.pt").write_bytes(b"STATE")  # same size, wrong content
    info, warns = find(tmp_path, rank=0)
    assert info.step == 9 and info.path.name == "rank-00001"
    assert any("checksum" in w for w in warns)


def test_existing_good_checkpoint_is_never_overwritten(tmp_path):
    first = save(tmp_path, 9, 0, b"first")
    again = save(tmp_path, 9, 0, b"second")
    assert again == first and (first / "state.pt").read_bytes() == b"first"
    assert not list((tmp_path / "step-00000009").glob(".*partial*"))


def test_broken_directory_under_final_name_is_moved_aside_not_deleted(tmp_path):
    first = save(tmp_path, 9, 0, b"first")
    (first / "state.pt").write_bytes(b"garbage!")
    again = save(tmp_path, 9, 0, b"second")
    assert (again / "state.pt").read_bytes() == b"second"
    assert list((tmp_path / "step-00000009").glob(".rank-00000.corrupt-*"))


def test_wrong_world_size_is_a_clear_error_and_touches_nothing(tmp_path):
    final = save(tmp_path, 9, 0, world=4)
    before = sorted(p.name for p in final.rglob("*"))
    with pytest.raises(CheckpointError, match=r"world size \[4\].*world size 2.*JITCKPT_ALLOW_WORLD_SIZE_CHANGE"):
        find(tmp_path, rank=0, world=2)
    assert sorted(p.name for p in final.rglob("*")) == before
    info, _ = find(tmp_path, rank=0, world=2, allow_world_size_change=True)
    assert info.step == 9


def test_step_is_used_only_when_every_model_shard_has_a_replica(tmp_path):
    # world 4 = tp 2 x dp 2; ranks 0,2 hold tp shard 0; ranks 1,3 tp shard 1
    save(tmp_path, 5, 0, tp=2)
    save(tmp_path, 5, 1, tp=2)
    save(tmp_path, 8, 0, tp=2)
    save(tmp_path, 8, 2, tp=2)  # step 8 has no replica of tp shard 1
    info, warns = find(tmp_path, rank=3, tp=2)
    assert info.step == 5 and info.path.name == "rank-00001"
    assert any("no complete replica" in w for w in warns)
    info, _ = find(tmp_path, rank=2, tp=2)
    assert info.step == 5  # all ranks agree on the step, whatever their shard


def test_coordinates_follow_megatron_order():
    c = ParallelCoordinates.from_layout(rank=5, world_size=8, tp_size=2, pp_size=2)
    assert (c.tp_rank, c.dp_rank, c.pp_rank, c.dp_size) == (1, 0, 1, 2)
    with pytest.raises(CheckpointError, match="not divisible"):
        ParallelCoordinates.from_layout(0, 6, tp_size=4)


def test_commit_refuses_an_empty_save(tmp_path):
    pending = store.PendingSave(tmp_path, 1, coords(0))
    with pytest.raises(CheckpointError, match="wrote no files"):
        pending.commit()


def test_prune_keeps_newest_good_steps_only(tmp_path):
    for step in (1, 2, 3, 4):
        save(tmp_path, step, 0)
    (tmp_path / "step-00000004" / "rank-00000" / store.META_FILE).unlink()  # torn newest
    removed = DiskStore(tmp_path).prune(keep=2)
    assert [p.name for p in removed] == ["step-00000001"]
    assert store.list_steps(tmp_path) == [4, 3, 2]


def test_unwritable_directory_is_reported_with_the_fix(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(CheckpointError, match="not writable.*--checkpoint-dir"):
        store.check_writable(blocker / "ckpt")
    if os.geteuid() != 0:  # root ignores permission bits
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        with pytest.raises(CheckpointError):
            store.check_writable(ro)


def test_prune_never_removes_the_newest_complete_step(tmp_path):
    save(tmp_path, 20, 0, tp=2)
    save(tmp_path, 20, 1, tp=2)
    for step in (28, 29, 30):  # newer steps that cover only tensor shard 0
        save(tmp_path, step, 0, tp=2)
    assert DiskStore(tmp_path).prune(keep=3) == []
    info, _ = find(tmp_path, rank=1, tp=2)
    assert info.step == 20
