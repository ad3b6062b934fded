"""Which checkpoint a restarted rank loads (paper §3.3), for any store tier.

The newest step for which every model shard (pipeline stage x tensor-parallel
partition) has at least one verified data-parallel replica.  Every rank of
the restarted job runs the same cheap check (metadata and sizes) for every
shard, so they agree on the step; only the replicas of a rank's own shard are
checksummed in full.  A checkpoint written by a job of another layout is an
error unless explicitly allowed; torn or corrupt ones are skipped with a
CheckpointWarning that names the reason.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from jitckpt.store.base import CheckpointError, CheckpointInfo, CheckpointStore, CheckpointWarning
from jitckpt.store.shard import ParallelCoordinates

Shard = tuple[int, int]


def _intact(store: CheckpointStore, location: Path) -> CheckpointInfo | None:
    try:
        return store.verify(location, check_content=False)
    except CheckpointError:
        return None


def is_complete(store: CheckpointStore, step: int) -> bool:
    """True if every model shard of ``step`` has a replica with intact metadata and file sizes."""
    return covered_shards(store, step) is not None


def covered_shards(store: CheckpointStore, step: int) -> dict[Shard, list[Path]] | None:
    """Replicas of ``step`` with intact metadata and sizes, by shard; None unless every shard has one."""
    shards: dict[Shard, list[Path]] = {}
    layout = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        replicas = list(store.replicas(step))
    for location, _ in replicas:
        info = _intact(store, location)
        if info is None:
            continue
        layout = (info.coords.pp_size, info.coords.tp_size)
        shards.setdefault(info.coords.shard, []).append(location)
    if layout is None or not all((p, t) in shards for p in range(layout[0]) for t in range(layout[1])):
        return None
    return shards


def select(store: CheckpointStore, coords: ParallelCoordinates, allow_world_size_change: bool = False) -> CheckpointInfo | None:
    """The newest verified checkpoint for ``coords``'s model shard, from any replica (see module docstring)."""
    for step in store.list_steps():
        candidates = list(store.replicas(step))
        if not candidates:
            continue
        where = candidates[0][0].parent
        world_sizes = {int(m["world_size"]) for _, m in candidates}
        if world_sizes != {coords.world_size} and not allow_world_size_change:
            raise CheckpointError(
                f"the newest checkpoint ({where}) was written by a job of world size "
                f"{sorted(world_sizes)}, but this job has world size {coords.world_size}. Nothing was "
                f"loaded or deleted. Restart with the original world size, point --checkpoint-dir "
                f"elsewhere, or set JITCKPT_ALLOW_WORLD_SIZE_CHANGE=1 to load it anyway"
            )
        layouts = {(int(m.get("pp_size", 1)), int(m.get("tp_size", 1))) for _, m in candidates}
        if len(layouts) != 1:
            warnings.warn(f"skipping {where}: replicas disagree on the parallel layout", CheckpointWarning, stacklevel=2)
            continue
        pp_size, tp_size = layouts.pop()
        if (pp_size, tp_size) != (coords.pp_size, coords.tp_size) and not allow_world_size_change:
            raise CheckpointError(
                f"{where} was written with pipeline x tensor parallel sizes {pp_size}x{tp_size}, "
                f"this job uses {coords.pp_size}x{coords.tp_size}; nothing was loaded or deleted"
            )
        covered: dict[Shard, list[tuple[Path, dict]]] = {}
        for location, meta in candidates:
            shard = (int(meta.get("pp_rank", 0)), int(meta.get("tp_rank", 0)))
            if _intact(store, location) is not None:
                covered.setdefault(shard, []).append((location, meta))
        needed = {(p, t) for p in range(pp_size) for t in range(tp_size)}
        if not needed <= covered.keys():
            missing = sorted(needed - covered.keys())
            warnings.warn(f"skipping {where}: no complete replica for shard(s) (pp, tp) {missing}", CheckpointWarning, stacklevel=2)
            continue
        my_shard = coords.shard if (pp_size, tp_size) == (coords.pp_size, coords.tp_size) else (0, 0)
        for location in _prefer_own(covered[my_shard], coords.rank):
            try:
                return store.verify(location, check_content=True)
            except CheckpointError as exc:
                warnings.warn(f"skipping checkpoint: {exc}", CheckpointWarning, stacklevel=2)
        warnings.warn(
            f"skipping {where}: every replica of shard {my_shard} is corrupt; trying an older step",
            CheckpointWarning,
            stacklevel=2,
        )
    return None


def _prefer_own(replicas: list[tuple[Path, dict]], rank: int) -> list[Path]:
    """Try this rank's own checkpoint first (its files are most likely cached), then the others."""
    own = [location for location, meta in replicas if int(meta["rank"]) == rank]
    return own + [location for location, meta in replicas if int(meta["rank"]) != rank]
