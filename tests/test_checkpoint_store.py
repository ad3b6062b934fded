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
    assert any("no surviving copy of the shard of ranks 1,3 (tensor partition 1/2)" in w for w in warns), warns
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


# ----- shard identities: FSDP2/DTensor meshes, HSDP, ZeRO (synthetic metadata) -----------------

from jitckpt.store.shard import Sharding, format_ranks, parse_ranks  # noqa: E402
from jitckpt.store.selection import is_complete  # noqa: E402


def fsdp(world: int) -> Sharding:
    """What the worker observes for fully_shard over a 1-D mesh of every rank: Shard(0) on dim 0."""
    return Sharding("parameters (FSDP2/DTensor)", (world,), tuple(range(world)), (0,))


def hsdp(replicate: int, shard: int) -> Sharding:
    """HSDP: a (replicate, shard) mesh, placements (Replicate(), Shard(0)): split along dim 1 only."""
    return Sharding("parameters (FSDP2/DTensor)", (replicate, shard), tuple(range(replicate * shard)), (1,))


def zero(world: int) -> Sharding:
    return Sharding("optimizer state (ZeroRedundancyOptimizer)", (world,), tuple(range(world)), (0,))


def sharded(rank: int, world: int, *shardings: Sharding, known: bool = True, tp: int = 1) -> ParallelCoordinates:
    return coords(rank, world, tp).with_sharding(shardings, known=known)


def save_as(root: Path, step: int, who: ParallelCoordinates, payload: bytes = b"state") -> Path:
    pending = store.PendingSave(root, step, who)
    (pending.path / "state.pt").write_bytes(payload + b"-%d" % who.rank)
    return pending.commit({"reason": "test"})


def find_as(root: Path, who: ParallelCoordinates, **kw) -> tuple[CheckpointInfo | None, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CheckpointWarning)
        info = select(DiskStore(root), who, **kw)
    return info, [str(w.message) for w in caught]


@pytest.mark.parametrize("ranks", [[], [5], [0, 2], [0, 1, 2, 3], [0, 2, 4, 6], [1, 5, 9, 10, 11], [3, 2, 1, 0], [0, 1, 2, 7, 9]])
def test_rank_lists_are_written_compactly_and_read_back(ranks):
    assert list(parse_ranks(format_ranks(ranks))) == ranks
    assert format_ranks(range(1024)) == "0-1023" and format_ranks(range(0, 16, 4)) == "0-12:4"


def test_replica_groups_follow_the_observed_sharding():
    # DDP: every rank holds the same state
    assert coords(1, 4).replicas == (0, 1, 2, 3)
    # FSDP2 over every rank: no two ranks hold the same shard
    assert [sharded(r, 4, fsdp(4)).replicas for r in range(4)] == [(0,), (1,), (2,), (3,)]
    # HSDP (replicate x shard = 2x2): the same shard position in both replicate groups
    assert [sharded(r, 4, hsdp(2, 2)).replicas for r in range(4)] == [(0, 2), (1, 3), (0, 2), (1, 3)]
    assert sharded(1, 4, hsdp(2, 2)).shard == sharded(3, 4, hsdp(2, 2)).shard != sharded(0, 4, hsdp(2, 2)).shard
    # DDP with ZeroRedundancyOptimizer: parameters replicated, optimizer state split
    assert sharded(2, 3, zero(3)).replicas == (2,)
    # an env tensor-parallel layout and a mesh together: both must agree
    assert sharded(1, 8, hsdp(2, 4), tp=2).replicas == (1, 5)
    assert sharded(1, 8, hsdp(2, 2), tp=2).replicas == (1, 3)  # ranks 5 and 7 are outside the mesh
    # not observed (no optimizer yet): its own rank only
    assert sharded(2, 4, known=False).replicas == (2,)
    assert sharded(1, 4, hsdp(2, 2)).describe() == "parameters (FSDP2/DTensor) shard 1/2"
    assert sharded(0, 4, hsdp(2, 2)).describe(3) == "parameters (FSDP2/DTensor) shard 1/2"


def test_shard_identity_is_recorded_in_the_metadata_and_read_back(tmp_path):
    final = save_as(tmp_path, 7, sharded(1, 4, hsdp(2, 2)))
    meta = json.loads((final / store.META_FILE).read_text())
    assert meta["replicas"] == "1,3" and "FSDP2" in meta["shard"] and meta["sharding"][0]["sharded_dims"] == [1]
    info = store.verify(final)
    assert info.coords == sharded(1, 4, hsdp(2, 2)) and info.coords.replicas == (1, 3)
    # metadata whose recorded shard contradicts its sharding is not trusted
    meta["shard"] = "pp0/1 tp0/1"
    (final / store.META_FILE).write_text(json.dumps(meta))
    assert store.verify(final) is None
    with pytest.raises(CheckpointError, match="inconsistent shard identity"):
        store.verify_or_raise(final)


def test_fsdp_shard_without_a_surviving_copy_falls_back_to_an_older_complete_step(tmp_path):
    for rank in (0, 1):
        save_as(tmp_path, 4, sharded(rank, 2, fsdp(2)))
    save_as(tmp_path, 9, sharded(0, 2, fsdp(2)))  # rank 1 died: its shard has no copy at step 9
    for rank in (0, 1):
        info, warns = find_as(tmp_path, sharded(rank, 2, fsdp(2)))
        assert info.step == 4 and info.path.name == f"rank-{rank:05d}"  # never another rank's shard
        assert warns == [
            f"skipping {tmp_path / 'step-00000009'}: no surviving copy of the shard of rank 1 "
            f"(parameters (FSDP2/DTensor) shard 1/2): no rank holding it saved this step; "
            f"falling back to the newest checkpoint that covers every shard"
        ]
    assert not is_complete(DiskStore(tmp_path), 9) and is_complete(DiskStore(tmp_path), 4)


def test_fsdp_shard_without_a_surviving_copy_and_nothing_older_is_a_fresh_start(tmp_path):
    save_as(tmp_path, 9, sharded(0, 2, fsdp(2)))
    for rank in (0, 1):
        info, warns = find_as(tmp_path, sharded(rank, 2, fsdp(2)))
        assert info is None and len(warns) == 1 and "no surviving copy of the shard of rank 1" in warns[0]


def test_hsdp_rank_resumes_from_the_replica_of_its_own_shard(tmp_path):
    for rank in (0, 2, 3):  # rank 1 died; rank 3 holds the same shard in the other replicate group
        save_as(tmp_path, 9, sharded(rank, 4, hsdp(2, 2)))
    chosen = {rank: find_as(tmp_path, sharded(rank, 4, hsdp(2, 2))) for rank in range(4)}
    assert {rank: (info.step, info.path.name) for rank, (info, _) in chosen.items()} == {
        0: (9, "rank-00000"), 1: (9, "rank-00003"), 2: (9, "rank-00002"), 3: (9, "rank-00003")}
    assert all(not warns for _, warns in chosen.values())
    # before the rank has seen its optimizer, the checkpoints' recorded replica groups decide
    info, _ = find_as(tmp_path, sharded(1, 4, known=False))
    assert info.path.name == "rank-00003"


def test_zero_optimizer_shards_are_never_swapped(tmp_path):
    save_as(tmp_path, 9, sharded(0, 2, zero(2)))
    info, warns = find_as(tmp_path, sharded(1, 2, zero(2)))
    assert info is None and "optimizer state (ZeroRedundancyOptimizer) shard 1/2" in warns[0]


def test_a_checkpoint_of_another_shard_layout_is_skipped_with_the_reason(tmp_path):
    # written before shard identities were recorded, by a job jitckpt took for plain data parallel
    for rank in (0, 1):
        final = save(tmp_path, 9, rank, world=2)
        meta = json.loads((final / store.META_FILE).read_text())
        for key in ("shard", "replicas", "sharding", "sharding_known"):
            del meta[key]
        (final / store.META_FILE).write_text(json.dumps(meta))
    info, warns = find(tmp_path, rank=1, world=2)  # a DDP job reads it as before
    assert info.step == 9 and info.path.name == "rank-00001"
    info, warns = find_as(tmp_path, sharded(1, 2, fsdp(2)))  # an FSDP job must not
    assert info is None
    assert any("rank-00001: it holds shard 'pp0/1 tp0/1' but rank 1 holds 'pp0/1 tp0/1; parameters (FSDP2/DTensor)"
               in w and "sharded differently" in w for w in warns), warns
    assert any("rank-00000: it holds shard 'pp0/1 tp0/1'" in w for w in warns), warns  # a replica by the old rule


def test_a_checkpoint_saved_before_the_sharding_was_observed_is_its_own_ranks_only(tmp_path):
    save_as(tmp_path, 9, sharded(0, 2, known=False))
    info, warns = find_as(tmp_path, sharded(1, 2))
    assert info is None and "no surviving copy of the shard of rank 1 (sharding not recorded)" in warns[0]
    save_as(tmp_path, 9, sharded(1, 2, known=False))
    info, _ = find_as(tmp_path, sharded(1, 2, fsdp(2)))
    assert info.path.name == "rank-00001"


def test_a_sharded_checkpoint_is_not_loaded_at_another_world_size(tmp_path):
    for rank in (0, 1):
        save_as(tmp_path, 9, sharded(rank, 2, fsdp(2)))
    info, warns = find_as(tmp_path, sharded(0, 4, fsdp(4)), allow_world_size_change=True)
    assert info is None and any("sharded over 2 ranks" in w for w in warns)
