"""The on-disk checkpoint store (``DiskStore``): per-rank directories committed atomically.

Layout under the checkpoint directory::

    step-00000012/                 one directory per saved training step
        rank-00003/                what rank 3's save() wrote, plus
            jitckpt-meta.json      metadata written last: step, rank, world
                                   size, parallel coordinates, file checksums
        .rank-00001.partial-4711/  a save still running, or one that died

Everything in a checkpoint is owner-only, whatever the umask: jitckpt's own
folders 0700 and files 0600 from their creation (``jitckpt.store.private``;
the worker's copies of the ranks' stashes go through ``write_file``, which
follows no link the save function may have left), and what the user's save
function wrote loses its group and other bits at commit; a file it hard-linked
from elsewhere keeps its mode (changing it would change the file elsewhere
too), and a mode that cannot be changed is warned about, never a lost save
(CheckpointWarning, both).  A root that other users can write to is refused
(``check_private``), as ssh refuses such a key directory: whoever can write
there decides what every rank loads.

A save writes into a hidden ``.partial`` directory, checksums every file,
writes the metadata, then renames the directory to ``rank-NNNNN`` in one
atomic step.  A torn save therefore never has the final name, and a directory
with the final name is verified (metadata parses, every listed file is present
with its size and checksum) before it is ever handed out.

The checksum is XXH3-128 (the ``xxhash`` package): it is on the save's
critical path, and it is an order of magnitude faster than SHA-256 here
(benchmarks/checksum.py).  It guards against accidental damage (torn writes,
bit rot, truncation), not against someone who can write the directory:
that is what the owner-only permissions and ``check_private`` are for.
Checkpoints whose metadata carries SHA-256 sums are still verified with
SHA-256.

Which step a restarted rank loads is decided by ``jitckpt.store.selection``
for any tier.  An existing good checkpoint is never overwritten.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import time
import warnings
from pathlib import Path, PurePosixPath
from typing import Iterable

import xxhash

from jitckpt.store import selection
from jitckpt.store.base import CheckpointInfo, CheckpointStore, PendingCheckpoint
from jitckpt.store.errors import CheckpointError, CheckpointWarning
from jitckpt.store.private import make_missing_dirs, make_private_dir, restrict_to_owner, write_private_file, write_private_file_in
from jitckpt.store.shard import ParallelCoordinates

META_FILE = "jitckpt-meta.json"
FORMAT_VERSION = 1
_STEP_RE = re.compile(r"^step-(\d{8,})$")
_RANK_RE = re.compile(r"^rank-(\d{5,})$")


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def rank_dir_name(rank: int) -> str:
    return f"rank-{rank:05d}"


def check_private(root: Path) -> None:
    """Refuse a checkpoint root that another user owns or can write to (CheckpointError says how to fix it)."""
    st = os.stat(root)
    if st.st_uid != os.getuid() and os.getuid() != 0:
        raise CheckpointError(
            f"checkpoint directory {root} belongs to another user (uid {st.st_uid}); jitckpt loads what it finds "
            f"there into every rank, so it must be yours: pass a --checkpoint-dir you own"
        )
    if st.st_mode & 0o022:
        raise CheckpointError(
            f"checkpoint directory {root} can be written by other users (mode {st.st_mode & 0o777:o}); anyone who can "
            f"write there decides what every rank loads. Run `chmod go-w {root}` or pass a private --checkpoint-dir"
        )


def check_writable(root: str | os.PathLike) -> Path:
    """Create ``root`` if needed (owner-only), check it is private, and prove a file can be written,
    renamed and removed there.

    Raises CheckpointError naming the directory and the fix, so the problem is
    reported at start-up and not when a failure has already happened.
    """
    path = Path(root).expanduser().resolve()
    try:
        make_missing_dirs(path)  # one that exists is the user's: judged, not changed
        check_private(path)
        probe = path / f".jitckpt-write-probe-{os.getpid()}"
        write_private_file(probe, b"probe", sync=True)
        os.replace(probe, probe.with_suffix(".renamed"))
        os.unlink(probe.with_suffix(".renamed"))
    except OSError as exc:
        raise CheckpointError(
            f"checkpoint directory {path} is not writable ({exc.strerror or exc}); "
            f"pass a writable --checkpoint-dir (or set JITCKPT_CHECKPOINT_DIR), "
            f"or fix its permissions"
        ) from None
    return path


CHECKSUM = "xxh3_128"
# Checksums a checkpoint's metadata may carry, newest first: name -> hash constructor.
_CHECKSUMS = {CHECKSUM: xxhash.xxh3_128, "sha256": hashlib.sha256}


def file_checksum(path: Path, algorithm: str | None = None) -> str:
    """Hex digest of a file's content with ``algorithm`` (a key of the metadata's file entries; default CHECKSUM)."""
    digest = _CHECKSUMS[algorithm or CHECKSUM]()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _data_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.rglob("*") if p.is_file() and p.name != META_FILE)


class PendingSave(PendingCheckpoint):
    """A rank's save in progress: a hidden directory that becomes visible on commit."""

    def __init__(self, root: Path, step: int, coords: ParallelCoordinates) -> None:
        self.root = Path(root)
        self.step = step
        self.coords = coords
        self.step_path = step_dir(self.root, step)
        make_private_dir(self.step_path, parents=True)
        self.final_path = self.step_path / rank_dir_name(coords.rank)
        self.path = self.step_path / f".{rank_dir_name(coords.rank)}.partial-{os.getpid()}"
        if self.path.exists():
            shutil.rmtree(self.path)
        make_private_dir(self.path)

    def commit(self, extra_meta: dict | None = None) -> Path:
        """Checksum the files, write metadata last, and atomically publish the directory.

        Returns the final directory.  If a verified checkpoint of the same step
        and rank already exists it is kept and this save is discarded.
        """
        kept = restrict_to_owner(self.path)  # what the user's save wrote, with the user's umask
        if kept.linked:
            warnings.warn(
                f"{self.final_path}: left open to other users, since other hard links share their mode (files linked "
                f"into the checkpoint from elsewhere: making them owner-only here would do so there too): "
                f"{', '.join(kept.linked)}. The checkpoint's folders are owner-only, so no other user reaches them "
                f"through the checkpoint",
                CheckpointWarning, stacklevel=2)
        if kept.failed:
            warnings.warn(
                f"{self.final_path}: could not make these owner-only (the checkpoint is saved all the same; its "
                f"folders are owner-only): {'; '.join(kept.failed)}", CheckpointWarning, stacklevel=2)
        files = {}
        for file in _data_files(self.path):
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            files[str(file.relative_to(self.path))] = {"size": file.stat().st_size, CHECKSUM: file_checksum(file, CHECKSUM)}
        if not files:
            raise CheckpointError(
                f"the registered save function wrote no files into {self.path}; "
                f"save(path) must write its state into the directory it is given"
            )
        meta = {
            "format_version": FORMAT_VERSION,
            "step": self.step,
            **self.coords.to_meta(),
            "committed_at": time.time(),
            "files": files,
        }
        meta.update(extra_meta or {})
        tmp = self.path / (META_FILE + ".tmp")
        write_private_file(tmp, json.dumps(meta, indent=1, sort_keys=True).encode(), sync=True)
        os.replace(tmp, self.path / META_FILE)
        _fsync_dir(self.path)
        if self.final_path.exists():
            existing = verify(self.final_path)
            if existing is not None:
                shutil.rmtree(self.path, ignore_errors=True)
                return self.final_path
            # A broken directory under the final name (torn by hand, or corrupt):
            # move it aside rather than delete evidence.
            os.replace(self.final_path, self.step_path / f".{self.final_path.name}.corrupt-{int(time.time())}")
        os.replace(self.path, self.final_path)
        _fsync_dir(self.step_path)
        return self.final_path

    def write_file(self, name: str, data: bytes) -> Path:
        """Write jitckpt's own file ``name`` (relative, ``/``-separated) into the pending checkpoint, owner-only."""
        parts = PurePosixPath(name).parts
        if not parts or parts[0] == "/" or ".." in parts or parts == (META_FILE,):
            raise ValueError(f"{name!r} is not a file name inside the checkpoint (a relative path, not {META_FILE})")
        return write_private_file_in(self.path, parts, data)  # never through a link the save function left there

    def abandon(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def read_meta(directory: Path) -> dict:
    """Parse a rank checkpoint's metadata, raising CheckpointError on any defect."""
    meta_path = Path(directory) / META_FILE
    try:
        with open(meta_path) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise CheckpointError(f"{directory}: no {META_FILE} (torn save)") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{meta_path}: unreadable metadata ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{meta_path}: unknown format version {meta.get('format_version') if isinstance(meta, dict) else meta!r}")
    for key in ("step", "rank", "world_size", "files"):
        if key not in meta:
            raise CheckpointError(f"{meta_path}: metadata lacks {key!r}")
    _check_names(Path(directory), meta)
    return meta


def _check_names(directory: Path, meta: dict) -> None:
    """Refuse a rank directory whose ``step-N``/``rank-R`` names disagree with its metadata.

    Saves are committed under the names their metadata records, so a
    disagreement means a folder moved, copied or linked by hand: loading it
    would resume a minibatch other than the one its folder names (and
    jit-run's own messages would name the folder's).
    """
    for pattern, name, key, what in ((_RANK_RE, directory.name, "rank", "rank"),
                                     (_STEP_RE, directory.parent.name, "step", "minibatch")):
        match = pattern.match(name)
        if match and int(match.group(1)) != meta[key]:
            raise CheckpointError(f"{directory}: its metadata says {what} {meta[key]}, its folder {name} "
                                  f"(moved, copied or linked by hand?); not used")


def verify(directory: Path, check_content: bool = True) -> CheckpointInfo | None:
    """Return the checkpoint's info if it is complete and intact, else None.

    ``check_content`` recomputes every file's checksum; without it only presence
    and sizes are checked (used for other shards' replicas).
    """
    try:
        return verify_or_raise(directory, check_content)
    except CheckpointError:
        return None


def verify_or_raise(directory: Path, check_content: bool = True) -> CheckpointInfo:
    """Like verify() but raising CheckpointError that says what is wrong."""
    directory = Path(directory)
    meta = read_meta(directory)
    for name, entry in meta["files"].items():
        file = directory / name
        try:
            size = file.stat().st_size
        except FileNotFoundError:
            raise CheckpointError(f"{directory}: file {name} listed in metadata is missing") from None
        if size != entry["size"]:
            raise CheckpointError(f"{directory}: file {name} has {size} bytes, metadata says {entry['size']} (torn or truncated)")
        if check_content:
            algorithm = next((a for a in _CHECKSUMS if a in entry), None)
            if algorithm is None:
                raise CheckpointError(f"{directory}: metadata of file {name} carries no known checksum")
            if file_checksum(file, algorithm) != entry[algorithm]:
                raise CheckpointError(f"{directory}: file {name} fails its {algorithm} checksum (corrupt)")
    return CheckpointInfo(directory, int(meta["step"]), ParallelCoordinates.from_meta(meta), meta)


def list_steps(root: Path) -> list[int]:
    """Steps that have a directory under root, newest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    steps = []
    for entry in root.iterdir():
        match = _STEP_RE.match(entry.name)
        if match and entry.is_dir():
            steps.append(int(match.group(1)))
    return sorted(steps, reverse=True)


def _rank_dirs(step_path: Path) -> Iterable[Path]:
    if not step_path.is_dir():
        return []
    return sorted(p for p in step_path.iterdir() if _RANK_RE.match(p.name) and p.is_dir())


def torn_saves(root: Path) -> list[Path]:
    """Hidden partial directories left by saves that never committed."""
    found = []
    for step in list_steps(root):
        found += sorted(p for p in step_dir(root, step).iterdir() if ".partial-" in p.name)
    return found


def replicas(root: Path, step: int) -> list[tuple[Path, dict]]:
    """Committed rank directories of ``step`` with readable metadata; others warn and are left out."""
    found = []
    for rank_path in _rank_dirs(step_dir(root, step)):
        try:
            found.append((rank_path, read_meta(rank_path)))
        except CheckpointError as exc:
            warnings.warn(f"skipping checkpoint: {exc}", CheckpointWarning, stacklevel=3)
    return found


class DiskStore(CheckpointStore):
    """Checkpoints as files under one root directory (the layout in the module docstring)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"DiskStore({str(self.root)!r})"

    def begin_save(self, step: int, coords: ParallelCoordinates) -> PendingSave:
        return PendingSave(self.root, step, coords)

    def list_steps(self) -> list[int]:
        return list_steps(self.root)

    def replicas(self, step: int) -> list[tuple[Path, dict]]:
        return replicas(self.root, step)

    def verify(self, location: Path, check_content: bool = True) -> CheckpointInfo:
        return verify_or_raise(location, check_content)

    def torn_saves(self) -> list[Path]:
        """Hidden partial directories left by saves that never committed."""
        return torn_saves(self.root)

    def remove_torn_saves(self, older_than: float) -> list[Path]:
        """Delete partial directories untouched for ``older_than`` seconds (saves that died); returns them."""
        removed = []
        now = time.time()
        for partial in self.torn_saves():
            try:
                newest = max([partial.stat().st_mtime] + [p.stat().st_mtime for p in partial.rglob("*")])
            except OSError:
                continue  # vanished meanwhile
            if now - newest > older_than:
                shutil.rmtree(partial, ignore_errors=True)
                removed.append(partial)
        return removed

    def prune(self, keep: int) -> list[Path]:
        """Delete all steps older than the ``keep`` newest complete ones (every shard covered).

        Steps newer than the oldest kept complete step are never touched, so
        neither a newer good checkpoint nor one that may still be needed is lost.
        Returns the removed directories.
        """
        if keep < 1:
            raise ValueError("keep must be >= 1")
        complete = [s for s in self.list_steps() if selection.is_complete(self, s)]
        if len(complete) <= keep:
            return []
        oldest_kept = complete[keep - 1]
        removed = []
        for step in self.list_steps():
            if step < oldest_kept:
                shutil.rmtree(step_dir(self.root, step), ignore_errors=True)
                removed.append(step_dir(self.root, step))
        return removed
