"""Shard identity: which part of the model a rank holds, and so which ranks are replicas.

Two ranks may stand in for each other on resume only if they hold the same
shard.  Today the shard is (pipeline stage, tensor-parallel partition) in
Megatron's rank order (``JITCKPT_TP_SIZE``/``JITCKPT_PP_SIZE``); every rank
with the same shard is a data-parallel replica.  The identity is recorded in
every checkpoint's metadata and checked when one is selected.
"""

from __future__ import annotations

import dataclasses

from jitckpt.store.base import CheckpointError


@dataclasses.dataclass(frozen=True)
class ParallelCoordinates:
    """Where a rank sits in the job: data-, pipeline- and tensor-parallel indices."""

    rank: int
    world_size: int
    dp_rank: int = 0
    dp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    tp_rank: int = 0
    tp_size: int = 1

    @property
    def shard(self) -> tuple[int, int]:
        """The model shard this rank holds: (pipeline stage, tensor partition)."""
        return (self.pp_rank, self.tp_rank)

    @classmethod
    def from_layout(cls, rank: int, world_size: int, tp_size: int = 1, pp_size: int = 1) -> "ParallelCoordinates":
        """Coordinates for Megatron's default rank order: tensor fastest, then data, then pipeline."""
        if tp_size < 1 or pp_size < 1 or world_size % (tp_size * pp_size) != 0:
            raise CheckpointError(
                f"world size {world_size} is not divisible by tensor-parallel size {tp_size} "
                f"x pipeline-parallel size {pp_size}; fix JITCKPT_TP_SIZE / JITCKPT_PP_SIZE"
            )
        dp_size = world_size // (tp_size * pp_size)
        tp_rank = rank % tp_size
        dp_rank = (rank // tp_size) % dp_size
        pp_rank = rank // (tp_size * dp_size)
        return cls(rank, world_size, dp_rank, dp_size, pp_rank, pp_size, tp_rank, tp_size)

    @classmethod
    def from_meta(cls, meta: dict) -> "ParallelCoordinates":
        """The coordinates recorded in a checkpoint's metadata."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: int(meta[k]) for k in names if k in meta})

    def to_meta(self) -> dict[str, int]:
        """The fields recorded in a checkpoint's metadata."""
        return dataclasses.asdict(self)
