"""The checkpoint store interface: what the worker and the launcher need from any tier.

A *store* keeps per-rank checkpoints by training step.  The worker saves into
a pending checkpoint that becomes visible only when committed, and on resume
asks ``jitckpt.store.selection`` for the newest step whose every model shard
has a verified replica; selection needs only the primitives below.  The launcher checks the store at start-up and
prunes old steps.  ``jitckpt.store.disk.DiskStore`` is the tier that exists
today; the in-memory redundancy tier (DESIGN decision 12) implements the same
interface.
"""

from __future__ import annotations

import abc
import dataclasses
from pathlib import Path
from typing import Iterable

from jitckpt.store.shard import ParallelCoordinates


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """A verified rank checkpoint: its directory and the metadata it was committed with."""

    path: Path
    step: int
    coords: ParallelCoordinates
    meta: dict


class PendingCheckpoint(abc.ABC):
    """A rank's save in progress: ``path`` for the user's save function, invisible until ``commit``.

    Every file of a checkpoint goes through the store, which sets its mode:
    jitckpt's own through ``write_file``, the user's when ``commit`` takes them
    (but for files hard-linked from elsewhere, whose mode is shared with that place).
    """

    path: Path

    @abc.abstractmethod
    def write_file(self, name: str, data: bytes) -> Path:
        """Add jitckpt's own file ``name`` (a relative ``/``-separated path; folders are made as needed),
        owner-only; returns where it is.  ValueError for a name outside the checkpoint; PermissionError
        where a link (or another user's folder) stands in the way: nothing is written through it."""

    @abc.abstractmethod
    def commit(self, extra_meta: dict | None = None) -> Path:
        """Make every file owner-only, record integrity data and metadata last, publish atomically;
        returns the final location.  A mode it cannot or must not change (a file with other hard links)
        is a CheckpointWarning, not a failed save."""

    @abc.abstractmethod
    def abandon(self) -> None:
        """Drop the pending save."""


class CheckpointStore(abc.ABC):
    """One tier of checkpoint storage (see the module docstring)."""

    @abc.abstractmethod
    def begin_save(self, step: int, coords: ParallelCoordinates) -> PendingCheckpoint:
        """Start rank ``coords.rank``'s checkpoint of ``step``."""

    @abc.abstractmethod
    def list_steps(self) -> list[int]:
        """Steps with any checkpoint data, newest first."""

    @abc.abstractmethod
    def replicas(self, step: int) -> Iterable[tuple[Path, dict]]:
        """Every committed rank checkpoint of ``step`` whose metadata reads, with that metadata.

        Unreadable ones are reported as CheckpointWarning and left out.
        """

    @abc.abstractmethod
    def verify(self, location: Path, check_content: bool = True) -> CheckpointInfo:
        """The checkpoint at ``location`` if complete and intact (content checksums with
        ``check_content``), else CheckpointError saying what is wrong."""

    @abc.abstractmethod
    def prune(self, keep: int) -> list[Path]:
        """Remove steps older than the ``keep`` newest complete ones; returns what was removed."""
