"""The on-disk checkpoint store: per-rank directories committed atomically.

Layout under the checkpoint directory::

    step-00000012/                 one directory per saved training step
        rank-00003/                what rank 3's save() wrote, plus
            jitckpt-meta.json      metadata written last: step, rank, world
                                   size, parallel coordinates, file checksums
        .rank-00001.partial-4711/  a save still running, or one that died

A save writes into a hidden ``.partial`` directory, checksums every file,
writes the metadata, then renames the directory to ``rank-NNNNN`` in one
atomic step.  A torn save therefore never has the final name, and a directory
with the final name is verified (metadata parses, every listed file is present
with its size and SHA-256) before it is ever handed out.

Selection follows paper §3.3: the newest step for which every model shard
(pipeline stage x tensor-parallel partition) has at least one verified
data-parallel replica.  An existing good checkpoint is never overwritten.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import time
import warnings
from pathlib import Path
from typing import Iterable

META_FILE = "jitckpt-meta.json"
FORMAT_VERSION = 1
_STEP_RE = re.compile(r"^step-(\d{8,})$")
_RANK_RE = re.compile(r"^rank-(\d{5,})$")


class CheckpointError(RuntimeError):
    """A checkpoint directory cannot be used; the message names cause and fix."""


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (torn, corrupt, foreign) and an older one used."""


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


@dataclasses.dataclass(frozen=True)
class CheckpointInfo:
    """A verified rank checkpoint: its directory and the metadata it was committed with."""

    path: Path
    step: int
    coords: ParallelCoordinates
    meta: dict


def step_dir(root: Path, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def rank_dir_name(rank: int) -> str:
    return f"rank-{rank:05d}"


def check_writable(root: str | os.PathLike) -> Path:
    """Create ``root`` if needed and prove a file can be written, renamed and removed there.

    Raises CheckpointError naming the directory and the fix, so the problem is
    reported at start-up and not when a failure has already happened.
    """
    path = Path(root).expanduser().resolve()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".jitckpt-write-probe-{os.getpid()}"
        with open(probe, "wb") as f:
            f.write(b"probe")
            f.flush()
            os.fsync(f.fileno())
        os.replace(probe, probe.with_suffix(".renamed"))
        os.unlink(probe.with_suffix(".renamed"))
    except OSError as exc:
        raise CheckpointError(
            f"checkpoint directory {path} is not writable ({exc.strerror or exc}); "
            f"pass a writable --checkpoint-dir (or set JITCKPT_CHECKPOINT_DIR), "
            f"or fix its permissions"
        ) from None
    return path


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
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


class PendingSave:
    """A rank's save in progress: a hidden directory that becomes visible on commit."""

    def __init__(self, root: Path, step: int, coords: ParallelCoordinates) -> None:
        self.root = Path(root)
        self.step = step
        self.coords = coords
        self.step_path = step_dir(self.root, step)
        self.step_path.mkdir(parents=True, exist_ok=True)
        self.final_path = self.step_path / rank_dir_name(coords.rank)
        self.path = self.step_path / f".{rank_dir_name(coords.rank)}.partial-{os.getpid()}"
        if self.path.exists():
            shutil.rmtree(self.path)
        self.path.mkdir()

    def commit(self, extra_meta: dict | None = None) -> Path:
        """Checksum the files, write metadata last, and atomically publish the directory.

        Returns the final directory.  If a verified checkpoint of the same step
        and rank already exists it is kept and this save is discarded.
        """
        files = {}
        for file in _data_files(self.path):
            fd = os.open(file, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            files[str(file.relative_to(self.path))] = {"size": file.stat().st_size, "sha256": _sha256(file)}
        if not files:
            raise CheckpointError(
                f"the registered save function wrote no files into {self.path}; "
                f"save(path) must write its state into the directory it is given"
            )
        meta = {
            "format_version": FORMAT_VERSION,
            "step": self.step,
            **dataclasses.asdict(self.coords),
            "committed_at": time.time(),
            "files": files,
        }
        meta.update(extra_meta or {})
        tmp = self.path / (META_FILE + ".tmp")
        with open(tmp, "w") as f:
            json.dump(meta, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
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
    return meta


def _coords_from_meta(meta: dict) -> ParallelCoordinates:
    fields = {f.name for f in dataclasses.fields(ParallelCoordinates)}
    return ParallelCoordinates(**{k: int(meta[k]) for k in fields if k in meta})


def verify(directory: Path, check_content: bool = True) -> CheckpointInfo | None:
    """Return the checkpoint's info if it is complete and intact, else None.

    ``check_content`` recomputes every file's SHA-256; without it only presence
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
        if check_content and _sha256(file) != entry["sha256"]:
            raise CheckpointError(f"{directory}: file {name} fails its SHA-256 checksum (corrupt)")
    return CheckpointInfo(directory, int(meta["step"]), _coords_from_meta(meta), meta)


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


def find_checkpoint(
    root: Path,
    coords: ParallelCoordinates,
    allow_world_size_change: bool = False,
) -> CheckpointInfo | None:
    """The newest verified checkpoint for ``coords``'s model shard, from any replica.

    A step qualifies only if every shard of the job that wrote it has a replica
    there (so all ranks of the restarted job pick the same step).  Skipped
    checkpoints produce a CheckpointWarning naming the reason.  A checkpoint
    from a job of another world size raises CheckpointError unless
    ``allow_world_size_change``.
    """
    for step in list_steps(root):
        candidates = []
        for rank_path in _rank_dirs(step_dir(root, step)):
            try:
                meta = read_meta(rank_path)
            except CheckpointError as exc:
                warnings.warn(f"skipping checkpoint: {exc}", CheckpointWarning, stacklevel=2)
                continue
            candidates.append((rank_path, meta))
        if not candidates:
            continue
        world_sizes = {int(m["world_size"]) for _, m in candidates}
        if world_sizes != {coords.world_size}:
            if not allow_world_size_change:
                raise CheckpointError(
                    f"the newest checkpoint ({step_dir(root, step)}) was written by a job of world size "
                    f"{sorted(world_sizes)}, but this job has world size {coords.world_size}. Nothing was "
                    f"loaded or deleted. Restart with the original world size, point --checkpoint-dir "
                    f"elsewhere, or set JITCKPT_ALLOW_WORLD_SIZE_CHANGE=1 to load it anyway"
                )
        layouts = {(int(m.get("pp_size", 1)), int(m.get("tp_size", 1))) for _, m in candidates}
        if len(layouts) != 1:
            warnings.warn(f"skipping {step_dir(root, step)}: replicas disagree on the parallel layout", CheckpointWarning, stacklevel=2)
            continue
        pp_size, tp_size = layouts.pop()
        if (pp_size, tp_size) != (coords.pp_size, coords.tp_size) and not allow_world_size_change:
            raise CheckpointError(
                f"{step_dir(root, step)} was written with pipeline x tensor parallel sizes {pp_size}x{tp_size}, "
                f"this job uses {coords.pp_size}x{coords.tp_size}; nothing was loaded or deleted"
            )
        # Cheap check (sizes) for every shard so that all ranks agree on the step,
        # full checksum only for the replicas of this rank's own shard.
        covered: dict[tuple[int, int], list[Path]] = {}
        for rank_path, meta in candidates:
            shard = (int(meta.get("pp_rank", 0)), int(meta.get("tp_rank", 0)))
            if verify(rank_path, check_content=False) is not None:
                covered.setdefault(shard, []).append(rank_path)
        needed = {(p, t) for p in range(pp_size) for t in range(tp_size)}
        if not needed <= covered.keys():
            missing = sorted(needed - covered.keys())
            warnings.warn(
                f"skipping {step_dir(root, step)}: no complete replica for shard(s) (pp, tp) {missing}",
                CheckpointWarning,
                stacklevel=2,
            )
            continue
        my_shard = coords.shard if (pp_size, tp_size) == (coords.pp_size, coords.tp_size) else (0, 0)
        for rank_path in _prefer_own(covered[my_shard], coords.rank):
            try:
                return verify_or_raise(rank_path, check_content=True)
            except CheckpointError as exc:
                warnings.warn(f"skipping checkpoint: {exc}", CheckpointWarning, stacklevel=2)
        warnings.warn(
            f"skipping {step_dir(root, step)}: every replica of shard {my_shard} is corrupt; trying an older step",
            CheckpointWarning,
            stacklevel=2,
        )
    return None


def _prefer_own(paths: list[Path], rank: int) -> list[Path]:
    """Try this rank's own directory first (its files are most likely cached), then the others."""
    own = [p for p in paths if p.name == rank_dir_name(rank)]
    return own + [p for p in paths if p.name != rank_dir_name(rank)]


def is_complete(root: Path, step: int) -> bool:
    """True if every model shard of ``step`` has a replica with intact metadata and file sizes."""
    shards: dict[tuple[int, int], int] = {}
    layout = None
    for rank_path in _rank_dirs(step_dir(root, step)):
        info = verify(rank_path, check_content=False)
        if info is None:
            continue
        layout = (info.coords.pp_size, info.coords.tp_size)
        shards[info.coords.shard] = shards.get(info.coords.shard, 0) + 1
    if layout is None:
        return False
    return all((p, t) in shards for p in range(layout[0]) for t in range(layout[1]))


def prune(root: Path, keep: int) -> list[Path]:
    """Delete all steps older than the ``keep`` newest complete ones (every shard covered).

    Steps newer than the oldest kept complete step are never touched, so
    neither a newer good checkpoint nor one that may still be needed is lost.
    Returns the removed directories.
    """
    if keep < 1:
        raise ValueError("keep must be >= 1")
    complete = [s for s in list_steps(root) if is_complete(root, s)]
    if len(complete) <= keep:
        return []
    oldest_kept = complete[keep - 1]
    removed = []
    for step in list_steps(root):
        if step < oldest_kept:
            shutil.rmtree(step_dir(root, step), ignore_errors=True)
            removed.append(step_dir(root, step))
    return removed
