"""Shard identity: which part of the job's state a rank holds, and so which ranks are replicas.

Two ranks may stand in for each other on resume only if they hold the same
state.  A rank's identity is its **shard key** and its **replica group** (the
ranks whose key is the same), derived from

- the tensor/pipeline-parallel layout of ``JITCKPT_TP_SIZE``/``JITCKPT_PP_SIZE``
  (Megatron's rank order): ranks of one (pipeline stage, tensor partition);
- each ``Sharding`` the worker observed (``jitckpt.worker.sharding``): state
  laid out over a grid of ranks, split along some of the grid's dims.  FSDP2
  and DTensor parameters: the device mesh and the mesh dims their placements
  shard (HSDP's (replicate, shard) mesh splits dim 1 only, so the two
  replicate groups are replicas).  ZeroRedundancyOptimizer: its process group
  as a 1-D grid, split, so no two members hold the same optimizer state.

With nothing sharded every rank of one (pipeline, tensor) shard is a
data-parallel replica (DDP), exactly as before shard identities were
recorded; a checkpoint written before then is read as that layout.  When a
rank's sharding could not be observed (no optimizer existed yet), its
checkpoint is its own rank's only.  The identity is recorded in every
checkpoint's metadata (``to_meta``) and checked when one is selected
(``jitckpt.store.selection``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Iterable

from jitckpt.store.errors import CheckpointError


def format_ranks(ranks: Iterable[int]) -> str:
    """Ranks in their order, runs written compactly: ``0-3``, ``0-6:2``, ``1,5,9-11``."""
    seq = list(ranks)
    out: list[str] = []
    i = 0
    while i < len(seq):
        j = i
        if i + 2 < len(seq) and seq[i + 1] != seq[i]:
            step = seq[i + 1] - seq[i]
            while j + 1 < len(seq) and seq[j + 1] - seq[j] == step:
                j += 1
        if j - i >= 2:
            out.append(f"{seq[i]}-{seq[j]}" + (f":{step}" if step != 1 else ""))
            i = j + 1
        else:
            out.append(str(seq[i]))
            i += 1
    return ",".join(out)


def parse_ranks(text: str) -> tuple[int, ...]:
    """The inverse of ``format_ranks``."""
    ranks: list[int] = []
    for item in filter(None, str(text).split(",")):
        run, _, step = item.partition(":")
        first, sep, last = run.partition("-")
        if not sep:
            ranks.append(int(first))
            continue
        by = int(step) if step else 1
        if by == 0:
            raise ValueError(f"zero step in rank run {item!r}")
        ranks.extend(range(int(first), int(last) + (1 if by > 0 else -1), by))
    return tuple(ranks)


@dataclasses.dataclass(frozen=True)
class Sharding:
    """State split over a grid of ranks: ``ranks`` laid out row-major in ``shape``.

    Ranks that differ on a dim in ``sharded_dims`` hold different parts; ranks
    that differ only on the other dims hold copies; ranks outside the grid
    hold none of it.
    """

    what: str
    shape: tuple[int, ...]
    ranks: tuple[int, ...]
    sharded_dims: tuple[int, ...]

    def __post_init__(self) -> None:
        if math.prod(self.shape) != len(self.ranks) or len(set(self.ranks)) != len(self.ranks):
            raise ValueError(f"{self.what}: {len(self.ranks)} ranks do not fill a {self._shape_text()} grid")
        if any(not 0 <= d < len(self.shape) for d in self.sharded_dims):
            raise ValueError(f"{self.what}: sharded dims {list(self.sharded_dims)} outside a {self._shape_text()} grid")

    def _shape_text(self) -> str:
        return "x".join(map(str, self.shape))

    @functools.cached_property
    def _part_of(self) -> dict[int, int]:
        parts = {}
        for index, rank in enumerate(self.ranks):
            coord, part = [], 0
            for size in reversed(self.shape):
                coord.append(index % size)
                index //= size
            coord.reverse()
            for d in self.sharded_dims:
                part = part * self.shape[d] + coord[d]
            parts[rank] = part
        return parts

    @property
    def parts(self) -> int:
        """How many different parts the state is split into."""
        return math.prod(self.shape[d] for d in self.sharded_dims)

    def part(self, rank: int) -> int | None:
        """Which part ``rank`` holds (0 .. parts-1), None outside the grid."""
        return self._part_of.get(rank)

    def holders(self, rank: int, world_size: int) -> set[int]:
        """Ranks holding the same part of this state as ``rank``."""
        part = self.part(rank)
        if part is None:
            return set(range(world_size)) - set(self.ranks)
        return {r for r, p in self._part_of.items() if p == part}

    def key(self, rank: int) -> str:
        """This state's contribution to ``rank``'s shard key."""
        part = self.part(rank)
        dims = ",".join(map(str, self.sharded_dims))
        return f"{self.what}[{self._shape_text()} {format_ranks(self.ranks)} /{dims}]#{'-' if part is None else part}"

    def describe(self, rank: int) -> str:
        part = self.part(rank)
        return f"{self.what} shard {part}/{self.parts}" if part is not None else f"none of {self.what}"

    def to_meta(self) -> dict:
        return {"what": self.what, "shape": list(self.shape), "ranks": format_ranks(self.ranks),
                "sharded_dims": list(self.sharded_dims)}

    @classmethod
    def from_meta(cls, meta: dict) -> "Sharding":
        return cls(str(meta["what"]), tuple(int(s) for s in meta["shape"]), parse_ranks(meta["ranks"]),
                   tuple(int(d) for d in meta["sharded_dims"]))


_LAYOUT_FIELDS = ("rank", "world_size", "dp_rank", "dp_size", "pp_rank", "pp_size", "tp_rank", "tp_size")


@dataclasses.dataclass(frozen=True)
class ParallelCoordinates:
    """Where a rank sits in the job (data-, pipeline-, tensor-parallel indices) and what state it holds."""

    rank: int
    world_size: int
    dp_rank: int = 0
    dp_size: int = 1
    pp_rank: int = 0
    pp_size: int = 1
    tp_rank: int = 0
    tp_size: int = 1
    shardings: tuple[Sharding, ...] = ()
    sharding_known: bool = True  # False: not observed (no optimizer yet); the rank is its own only replica

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

    def with_sharding(self, shardings: Iterable[Sharding], known: bool = True) -> "ParallelCoordinates":
        """These coordinates with the observed shardings (order does not matter)."""
        ordered = tuple(sorted(set(shardings), key=lambda s: (s.what, s.shape, s.ranks, s.sharded_dims)))
        return dataclasses.replace(self, shardings=ordered, sharding_known=known)

    def _peer(self, rank: int) -> "ParallelCoordinates":
        """Rank ``rank`` of the same job, seen through this rank's shardings."""
        layout = ParallelCoordinates.from_layout(rank, self.world_size, self.tp_size, self.pp_size)
        return dataclasses.replace(layout, shardings=self.shardings, sharding_known=self.sharding_known)

    @property
    def shard(self) -> str:
        """The shard key: equal for exactly the ranks that hold the same state."""
        if not self.sharding_known:
            return f"rank {self.rank} (sharding not observed)"
        layout = f"pp{self.pp_rank}/{self.pp_size} tp{self.tp_rank}/{self.tp_size}"
        return "; ".join([layout] + [s.key(self.rank) for s in self.shardings])

    @functools.cached_property
    def replicas(self) -> tuple[int, ...]:
        """The ranks that hold the same state as this one (itself included)."""
        if not self.sharding_known:
            return (self.rank,)
        first = self.pp_rank * self.tp_size * self.dp_size + self.tp_rank
        same = set(range(first, first + self.tp_size * self.dp_size, self.tp_size))
        for sharding in self.shardings:
            same &= sharding.holders(self.rank, self.world_size)
        return tuple(sorted(same))

    def unreplicated_ranks(self) -> list[int]:
        """The ranks of the job whose state no other rank holds a copy of (as far as these coordinates know)."""
        if not self.sharding_known:
            return [self.rank]
        return [rank for rank in range(self.world_size) if len(self._peer(rank).replicas) == 1]

    def describe(self, rank: int | None = None) -> str:
        """In words, the state rank ``rank`` (default: this one) holds, as far as these coordinates know."""
        if rank is not None and rank != self.rank:
            return self._peer(rank).describe()
        if not self.sharding_known:
            return "sharding not observed"
        words = [f"pipeline stage {self.pp_rank}/{self.pp_size}"] if self.pp_size > 1 else []
        words += [f"tensor partition {self.tp_rank}/{self.tp_size}"] if self.tp_size > 1 else []
        words += [s.describe(self.rank) for s in self.shardings]
        return ", ".join(words) or "the whole model"

    @classmethod
    def from_meta(cls, meta: dict) -> "ParallelCoordinates":
        """The identity recorded in a checkpoint's metadata; one written without it is its (pp, tp) layout."""
        try:
            layout = {k: int(meta[k]) for k in _LAYOUT_FIELDS if k in meta}
            if "shard" not in meta:
                return cls(**layout)
            coords = cls(**layout, shardings=tuple(Sharding.from_meta(s) for s in meta.get("sharding", [])),
                         sharding_known=bool(meta.get("sharding_known", True)))
            recorded = parse_ranks(meta["replicas"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"unreadable shard identity in the metadata ({type(exc).__name__}: {exc})") from None
        if coords.shard != meta["shard"] or coords.rank not in recorded:
            raise CheckpointError(
                f"inconsistent shard identity in the metadata: shard {meta['shard']!r}, replicas "
                f"{meta['replicas']!r}, but its sharding gives {coords.shard!r} for rank {coords.rank}"
            )
        coords.__dict__["replicas"] = recorded  # as recorded: cheap to read for every rank of a large job
        return coords

    def to_meta(self) -> dict:
        """The fields recorded in a checkpoint's metadata."""
        return {
            **{k: getattr(self, k) for k in _LAYOUT_FIELDS},
            "shard": self.shard,
            "replicas": format_ranks(self.replicas),
            "sharding": [s.to_meta() for s in self.shardings],
            "sharding_known": self.sharding_known,
        }
