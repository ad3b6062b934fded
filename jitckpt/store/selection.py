"""Which checkpoint a restarted rank loads (paper §3.3, DESIGN decision 2), for any store tier.

Every rank checkpoint records its writer's shard identity (``jitckpt.store.shard``):
its shard key and its replica group, the ranks that hold the same state.

- A step is used only if every rank of the job is in the replica group of
  some intact checkpoint of that step: every shard has a surviving copy.
  This looks at the files alone (metadata and sizes), so every rank of the
  restarted job reaches the same verdict.  A step that lacks a shard is
  skipped with one CheckpointWarning naming the shard and the rank.
- A rank loads only a checkpoint whose replica group contains it and, once
  it has observed its own sharding, whose shard key is its own (a mismatch
  is skipped with a warning saying both).  Only those are checksummed in
  full; its own rank's directory is tried first.

A checkpoint written by a job of another world size or layout is an error
unless explicitly allowed (then only unsharded state is loaded); torn or
corrupt ones are skipped with a CheckpointWarning that names the reason.
"""

from __future__ import annotations

import warnings
from typing import Sequence

from jitckpt.store.base import CheckpointInfo, CheckpointStore
from jitckpt.store.errors import CheckpointError, CheckpointWarning
from jitckpt.store.shard import ParallelCoordinates, format_ranks

_NAMED_LOSSES = 4  # shards named in the warning; the rest are counted


def _intact(store: CheckpointStore, step: int, problems: list[str] | None = None) -> list[CheckpointInfo]:
    """Committed checkpoints of ``step`` whose metadata reads and whose files have their recorded sizes.

    What is wrong with the others goes into ``problems``, if given.
    """
    found = []
    for location, _ in store.replicas(step):
        try:
            found.append(store.verify(location, check_content=False))
        except CheckpointError as exc:
            if problems is not None:
                problems.append(str(exc))
    return found


def uncovered_ranks(infos: list[CheckpointInfo], world_size: int) -> list[int]:
    """Ranks of a ``world_size`` job that no checkpoint in ``infos`` holds a copy for."""
    covered: set[int] = set()
    for info in infos:
        covered.update(info.coords.replicas)
    return [r for r in range(world_size) if r not in covered]


def is_complete(store: CheckpointStore, step: int) -> bool:
    """True if every shard of ``step`` has a copy with intact metadata and file sizes."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        infos = _intact(store, step)
    worlds = {info.coords.world_size for info in infos}
    return len(worlds) == 1 and not uncovered_ranks(infos, worlds.pop())


def lost_shards(where: object, missing: list[int], infos: list[CheckpointInfo], problems: Sequence[str] = ()) -> str:
    """One line: which ranks' shards have no surviving copy in ``where``, in words (``problems``: why, if known)."""
    if not infos:
        why = f" ({'; '.join(problems[:2])}{'; ...' if len(problems) > 2 else ''})" if problems else ""
        return f"skipping {where}: no intact checkpoint of any rank{why}"
    # Every rank words it the same way: through the lowest surviving rank's view of the layout.
    witness = min(infos, key=lambda info: info.coords.rank).coords
    by_shard: dict[str, list[int]] = {}
    for rank in missing:
        shard = witness.describe(rank) if witness.sharding_known else "sharding not recorded"
        by_shard.setdefault(shard, []).append(rank)
    named = [f"the shard of rank{'s' if len(ranks) > 1 else ''} {format_ranks(ranks)} ({shard})"
             for shard, ranks in list(by_shard.items())[:_NAMED_LOSSES]]
    more = len(by_shard) - _NAMED_LOSSES
    return (
        f"skipping {where}: no surviving copy of {'; '.join(named)}{f' and {more} more shards' if more > 0 else ''}"
        f": no rank holding it saved this step; falling back to the newest checkpoint that covers every shard"
    )


def _where(candidates: list[tuple]) -> str:
    """The step's directory, or its directories in each tier holding it (disk, memory), in words."""
    places = list(dict.fromkeys(str(path.parent) for path, _ in candidates))
    return places[0] if len(places) == 1 else f"{places[0]} (and {', '.join(places[1:])})"


def _own_copies(infos: list[CheckpointInfo], coords: ParallelCoordinates, where: object) -> list[CheckpointInfo]:
    """The checkpoints among ``infos`` that hold ``coords``'s own shard, its own rank's first."""
    world = infos[0].coords.world_size
    if world == coords.world_size:
        mine = [info for info in infos if coords.rank in info.coords.replicas]
        if coords.sharding_known:
            checked = []
            for info in mine:
                if info.coords.sharding_known and info.coords.shard != coords.shard:
                    warnings.warn(
                        f"skipping {info.path}: it holds shard '{info.coords.shard}' but rank {coords.rank} holds "
                        f"'{coords.shard}' (the job's state is sharded differently from when it was saved)",
                        CheckpointWarning,
                        stacklevel=3,
                    )
                else:
                    checked.append(info)
            mine = checked
    else:  # another world size, explicitly allowed: only state every rank holds a copy of
        if any(info.coords.shardings or not info.coords.sharding_known for info in infos):
            warnings.warn(f"skipping {where}: its state is sharded over {world} ranks, and a sharded checkpoint "
                          f"cannot be loaded at world size {coords.world_size}", CheckpointWarning, stacklevel=3)
            return []
        same_layout = (infos[0].coords.pp_size, infos[0].coords.tp_size) == (coords.pp_size, coords.tp_size)
        want = coords if same_layout else ParallelCoordinates(0, world, pp_size=infos[0].coords.pp_size,
                                                              tp_size=infos[0].coords.tp_size)
        mine = [info for info in infos if (info.coords.pp_rank, info.coords.tp_rank) == (want.pp_rank, want.tp_rank)]
    return sorted(mine, key=lambda info: (info.coords.rank != coords.rank, info.coords.rank))


def select(store: CheckpointStore, coords: ParallelCoordinates, allow_world_size_change: bool = False, *,
           step: int | None = None) -> CheckpointInfo | None:
    """The newest verified checkpoint of ``coords``'s own shard (see module docstring).

    With ``step``, only that step is considered (the one every rank of the job
    agreed on, ``jitckpt.worker.step_agreement``): its checkpoint, or None if
    this rank cannot load it, the reasons given as CheckpointWarnings as usual.
    """
    for listed in store.list_steps():
        if step is not None and listed != step:
            continue
        candidates = list(store.replicas(listed))
        if not candidates:
            continue
        where = _where(candidates)
        world_sizes = {int(m["world_size"]) for _, m in candidates}
        if world_sizes != {coords.world_size} and not allow_world_size_change:
            raise CheckpointError(
                f"the newest checkpoint ({where}) was written by a job of world size "
                f"{sorted(world_sizes)}, but this job has world size {coords.world_size}. Nothing was "
                f"loaded or deleted. Restart with the original world size, point --checkpoint-dir "
                f"elsewhere, or set JITCKPT_ALLOW_WORLD_SIZE_CHANGE=1 to load it anyway"
            )
        layouts = {(int(m.get("pp_size", 1)), int(m.get("tp_size", 1))) for _, m in candidates}
        if len(layouts) != 1 or len(world_sizes) != 1:
            warnings.warn(f"skipping {where}: its checkpoints disagree on the parallel layout", CheckpointWarning, stacklevel=2)
            continue
        pp_size, tp_size = layouts.pop()
        if (pp_size, tp_size) != (coords.pp_size, coords.tp_size) and not allow_world_size_change:
            raise CheckpointError(
                f"{where} was written with pipeline x tensor parallel sizes {pp_size}x{tp_size}, "
                f"this job uses {coords.pp_size}x{coords.tp_size}; nothing was loaded or deleted"
            )
        problems: list[str] = []
        infos = _intact(store, listed, problems)
        missing = uncovered_ranks(infos, world_sizes.pop())
        if missing:
            warnings.warn(lost_shards(where, missing, infos, problems), CheckpointWarning, stacklevel=2)
            continue
        mine = _own_copies(infos, coords, where)
        for info in mine:
            try:
                return store.verify(info.path, check_content=True)
            except CheckpointError as exc:
                warnings.warn(f"skipping checkpoint: {exc}", CheckpointWarning, stacklevel=2)
        if mine:
            older = "; trying an older step" if step is None else ""
            warnings.warn(f"skipping {where}: every copy of shard '{coords.shard}' is corrupt{older}",
                          CheckpointWarning, stacklevel=2)
    return None
