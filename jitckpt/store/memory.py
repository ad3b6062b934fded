"""The memory tier's store: rank checkpoints in the node's shared memory, two per rank (DESIGN decision 12).

A ``MemoryStore`` is a ``DiskStore`` rooted at ``<run shm dir>/memory`` on
the host's shared memory (``/dev/shm``): the same layout (``step-N/rank-R``),
metadata and checksums written last, atomic commit.  It belongs to the node,
not to the worker that wrote it, so it outlives a restart of the workers, as
the per-rank stash does.  The workers' snapshots (``jitckpt.worker.
memory_snapshots``) go here; the selection reads it beside the disk
(``jitckpt.store.tiered``).

Two per rank, alternating (Deadpool's ping-pong buffers): each rank keeps
the snapshot of the current minibatch and of the previous one; ``prune_rank``
removes older ones once a new one is committed, so a failure while a
snapshot is written always leaves the previous one whole.
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from pathlib import Path
from typing import Callable

from jitckpt.store.disk import DiskStore, rank_dir_name, step_dir
from jitckpt.store.private import make_private_dir, open_private_file

SUBDIR = "memory"
PEER_COPIES = "from-peer-memory"
KEEP = 2  # the current minibatch's snapshot and the previous one
_PARTIAL = re.compile(r"^\.(rank-\d+)\.partial-(\d+)(?:-\d+)?$")  # (a save, or a copy: pid-thread)


def memory_root(shm_dir: str | os.PathLike) -> Path:
    """Where the memory tier of the run whose shared-memory directory is ``shm_dir`` keeps its snapshots."""
    return Path(shm_dir) / SUBDIR


class MemoryStore(DiskStore):
    """A node's memory tier (see the module docstring)."""

    def __init__(self, shm_dir: str | os.PathLike) -> None:
        super().__init__(memory_root(shm_dir))

    def __repr__(self) -> str:
        return f"MemoryStore({str(self.root)!r})"

    def holds(self, path: Path) -> bool:
        """True for a rank checkpoint directory of this store (a snapshot)."""
        return Path(path).is_relative_to(self.root)

    def prune_rank(self, rank: int, current: int, drop_later: bool = False) -> None:
        """Remove ``rank``'s snapshots older than minibatch ``current - 1``, its partial ones left by other
        processes, and with ``drop_later`` those after ``current`` (left by a timeline a failure cut short).

        Only steps it removes something from are removed when empty: never a step another rank may be
        creating (ranks are at most one minibatch apart, and only older and later ones go).
        """
        own = rank_dir_name(rank)
        for step in self.list_steps():
            here = step_dir(self.root, step)
            for entry in _entries(here):
                match = _PARTIAL.match(entry.name)
                if match and match.group(1) == own and int(match.group(2)) != os.getpid():
                    shutil.rmtree(entry, ignore_errors=True)
            if step < current - (KEEP - 1) or (drop_later and step > current):
                shutil.rmtree(here / own, ignore_errors=True)
                try:
                    here.rmdir()  # (once no rank has anything left there)
                except OSError:
                    pass


def _entries(path: Path) -> list[Path]:
    try:
        return list(path.iterdir())
    except OSError:
        return []


def install_rank_copy(root: Path, step: int, name: str, fill: Callable[[Path], None], replace: bool = False) -> bool:
    """Publish a copy of rank directory ``name`` of ``step`` under ``root``: ``fill(partial)`` writes it under a
    hidden name, then it is renamed into place.  Never over a rank directory already there (returns False
    then), unless ``replace``: then the one there is removed first.  Whatever ``fill`` raises, no partial
    directory is left behind."""
    target = step_dir(root, step)
    final = target / name
    if final.exists():
        if not replace:
            return False
        shutil.rmtree(final, ignore_errors=True)
    make_private_dir(target, parents=True)
    partial = target / f".{name}.partial-{os.getpid()}-{threading.get_ident()}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        fill(partial)
        os.replace(partial, final)
    except BaseException as exc:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(exc, OSError) and final.exists():
            return False  # (another copy of it won the race)
        raise
    return True


def copy_private(source: Path, target: Path) -> None:
    """Copy the folder ``source`` to the new folder ``target``, every folder and file owner-only whatever the
    umask (``shutil.copytree`` would follow the umask); links are not followed but refused."""
    make_private_dir(target)
    for entry in sorted(source.iterdir()):
        if entry.is_symlink():
            raise OSError(f"{entry}: a link in a snapshot")
        if entry.is_dir():
            copy_private(entry, target / entry.name)
        else:
            copy_private_file(entry, target / entry.name)


def copy_private_file(source: Path, target: Path) -> None:
    """Copy the file ``source`` to ``target`` (created or replaced), owner-only whatever the umask."""
    fd = open_private_file(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with open(fd, "wb") as out, open(source, "rb") as src:
        shutil.copyfileobj(src, out, 1 << 20)


def peer_copies(checkpoint_root: str | os.PathLike) -> DiskStore:
    """Where the memory tier's copies held for other hosts' ranks are handed over at a JIT save: a store beside
    the checkpoints (``<root>/.jitckpt/from-peer-memory``), on the file system every host shares."""
    return DiskStore(Path(checkpoint_root) / ".jitckpt" / PEER_COPIES)


def parity_area(checkpoint_root: str | os.PathLike) -> Path:
    """Where the parities (XOR, Reed-Solomon) kept in hosts' memory are handed over at a JIT event (``jitckpt.store.parity``)."""
    return Path(checkpoint_root) / ".jitckpt" / f"{PEER_COPIES}-parity"


def keep_on_disk(disk: DiskStore, memory: MemoryStore, *more: DiskStore) -> tuple[int, list[str]] | None:
    """Copy the snapshots that complete the newest step of ``disk``, ``memory`` (and ``more``) into ``disk``.

    For a job that ends without finishing (no restarts left, stopped): its
    memory tier goes with the run, and the JIT checkpoint on disk lacks the
    shard of the rank that was lost, so a rerun would start afresh.  The
    snapshots are copied as they are (metadata and checksums included) into
    ``disk``'s step directory, each under a hidden name first and then renamed,
    never over a rank directory already there.  Returns (step, rank
    directories copied), or None when no step is complete or nothing is missing.
    """
    from jitckpt.store.selection import is_complete
    from jitckpt.store.tiered import TieredStore

    every = TieredStore(disk, memory, *more)
    step = next((s for s in every.list_steps() if is_complete(every, s)), None)
    if step is None:
        return None
    copied = []
    for tier in (memory, *more):
        for source in sorted(p for p in _entries(step_dir(tier.root, step)) if not p.name.startswith(".")):
            if install_rank_copy(disk.root, step, source.name, lambda partial: copy_private(source, partial)):
                copied.append(source.name)
    return (step, sorted(copied)) if copied else None
