"""Several store tiers seen as one: the checkpoint root on disk and the node's memory tier.

``jitckpt.store.selection`` asks a store for the steps it has and the rank
checkpoints of a step; a ``TieredStore`` answers with the union of its tiers,
the first tier's copies first.  A step is then complete when every shard has a
copy in *some* tier: the healthy ranks' JIT saves on disk and a lost rank's
snapshot in host memory (``jitckpt.store.memory``) make one set, and where the
disk's newest step lacks a shard, the memory tier's snapshots of an older step
may cover every shard.  Saves go to the first tier (the JIT save); the memory
tier is written by its own snapshots.
"""

from __future__ import annotations

from pathlib import Path

from jitckpt.store.base import CheckpointInfo, CheckpointStore, PendingCheckpoint
from jitckpt.store.shard import ParallelCoordinates


class TieredStore(CheckpointStore):
    """The union of ``tiers`` for reading; the first one for saving and pruning."""

    def __init__(self, *tiers: CheckpointStore) -> None:
        if not tiers:
            raise ValueError("a TieredStore needs at least one tier")
        self.tiers = tiers

    def __repr__(self) -> str:
        return f"TieredStore({', '.join(map(repr, self.tiers))})"

    def begin_save(self, step: int, coords: ParallelCoordinates) -> PendingCheckpoint:
        return self.tiers[0].begin_save(step, coords)

    def list_steps(self) -> list[int]:
        return sorted({step for tier in self.tiers for step in tier.list_steps()}, reverse=True)

    def replicas(self, step: int) -> list[tuple[Path, dict]]:
        return [found for tier in self.tiers for found in tier.replicas(step)]

    def verify(self, location: Path, check_content: bool = True) -> CheckpointInfo:
        return self._tier_of(location).verify(location, check_content)

    def _tier_of(self, location: Path) -> CheckpointStore:
        """The tier whose root holds ``location`` (the first one if none says so)."""
        for tier in self.tiers:
            root = getattr(tier, "root", None)
            if root is not None and Path(location).is_relative_to(root):
                return tier
        return self.tiers[0]

    def prune(self, keep: int) -> list[Path]:
        return self.tiers[0].prune(keep)
