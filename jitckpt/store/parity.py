"""Parities of a group of rank snapshots, held instead of a copy of each: XOR (REFT's scheme) or Reed-Solomon (ECHECK's).

Blob.  A rank directory (a snapshot: its files, metadata and checksums) is
turned into one byte string for the parity: an 8-byte big-endian length, a
JSON list of ``[relative path, size]`` in sorted order, then the files' bytes
in that order.  The same directory always gives the same blob, and a blob
gives the directory back (its paths checked: no absolute path, no ``..``).

Parity.  For minibatch N and group G, ``<root>/step-N/group-G.parity`` holds
the XOR of the members' blobs, each padded with zeros to the longest, and
``group-G.json`` each member's blob length and BLAKE2b digest.  With ``rs``
(k members, m parities, ``jitckpt.store.isal``), parity ``j`` is
``group-G.row-J.parity``, its JSON adding the code, k, m, ``j`` and each
member's index in the group.  Written under hidden names and renamed,
owner-only.  With every member but one (XOR), or all but at most m (RS), at
hand, the parities give the missing ones back, each checked against its
digest before its directory is written; a rebuilt directory still carries the
snapshot's own checksums, which the selection verifies.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import struct
from pathlib import Path

import numpy as np

from jitckpt.store.disk import rank_dir_name, step_dir
from jitckpt.store.memory import install_rank_copy
from jitckpt.store.private import make_private_dir, open_private_file, write_private_file

_LENGTH = struct.Struct("!Q")
_GROUP = re.compile(r"^group-(\d+)(?:\.row-(\d+))?\.json$")
_STEP = re.compile(r"^step-(\d+)$")


class ParityError(Exception):
    """A parity or a blob that cannot be used: the reason."""


def checked_files(files: object) -> list[tuple[list[str], int]]:
    """An untrusted ``[[relative path, size], ...]`` (a blob's, a received copy's), checked: its paths name no
    place outside the folder they are written into (no absolute path, no ``..``); ValueError otherwise."""
    if not isinstance(files, list) or not files:
        raise ValueError("no file list")
    checked = []
    for item in files:
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and isinstance(item[1], int)):
            raise ValueError(f"a file entry {item!r:.80}")
        parts = item[0].split("/")
        if item[1] < 0 or any(p in ("", ".", "..") or "\0" in p for p in parts):
            raise ValueError(f"a file entry {item!r:.80}")
        checked.append((parts, item[1]))
    return checked


def files_of(directory: Path) -> list[tuple[str, int]]:
    """``(relative path, size)`` of every file under ``directory``, in the blob's order."""
    found = [(f.relative_to(directory).as_posix(), f.stat().st_size) for f in directory.rglob("*") if f.is_file()]
    return sorted(found)


def blob_header(files: list[tuple[str, int]]) -> bytes:
    """The blob's bytes before the files' contents."""
    raw = json.dumps([list(f) for f in files]).encode()
    return _LENGTH.pack(len(raw)) + raw


def blob_of(directory: Path) -> bytes:
    """The blob of a rank directory (see the module docstring)."""
    files = files_of(directory)
    return blob_header(files) + b"".join((directory / path).read_bytes() for path, _ in files)


def unpack_blob(blob: bytes, target: Path) -> None:
    """Write the directory that ``blob`` describes into the new folder ``target``, owner-only."""
    if len(blob) < _LENGTH.size:
        raise ParityError("a blob too short for its header")
    (length,) = _LENGTH.unpack_from(blob)
    try:
        files = json.loads(blob[_LENGTH.size:_LENGTH.size + length])
    except ValueError as exc:
        raise ParityError(f"a blob whose file list is unreadable ({exc})") from None
    try:
        checked = checked_files(files)
    except ValueError as exc:
        raise ParityError(f"a blob with {exc}") from None
    offset = _LENGTH.size + length
    if offset + sum(size for _, size in checked) > len(blob):
        raise ParityError("a blob shorter than its file list says")
    make_private_dir(target)
    for parts, size in checked:
        if len(parts) > 1:
            make_private_dir(target.joinpath(*parts[:-1]), parents=True)
        fd = open_private_file(target.joinpath(*parts), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        with open(fd, "wb") as out:
            out.write(blob[offset:offset + size])
        offset += size


def digest(blob: bytes | memoryview) -> str:
    return hashlib.blake2b(blob, digest_size=16).hexdigest()


def xor_into(parity: np.ndarray, blob: bytes | memoryview) -> np.ndarray:
    """``parity`` XOR ``blob`` (zero-padded to the longer of the two); returns the (possibly grown) parity."""
    data = np.frombuffer(blob, np.uint8)
    if len(data) > len(parity):
        grown = np.zeros(len(data), np.uint8)
        grown[:len(parity)] = parity
        parity = grown
    np.bitwise_xor(parity[:len(data)], data, out=parity[:len(data)])
    return parity


def write_parity(root: Path, step: int, group: int, parity: np.ndarray, members: dict[int, tuple[int, str]],
                 code: dict | None = None) -> str:
    """Publish the parity of ``group`` for ``step`` under ``root`` (the parity file first, its JSON last);
    ``code``: for ``rs``, ``{"k", "m", "row", "index": {rank: index}}``.  Returns its name (``group-G[.row-J]``)."""
    here = step_dir(root, step)
    make_private_dir(here, parents=True)
    name = f"group-{group}" + (f".row-{code['row']}" if code else "")
    hidden = here / f".{name}.parity.partial-{os.getpid()}"
    fd = open_private_file(hidden, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    with open(fd, "wb") as out:
        out.write(parity.tobytes())
    os.replace(hidden, here / f"{name}.parity")
    meta = {"step": step, "group": group, "size": len(parity),
            "members": {str(rank): {"length": length, "blake2b": d} for rank, (length, d) in sorted(members.items())}}
    if code:
        meta.update(code="rs", k=code["k"], m=code["m"], row=code["row"])
        for rank, entry in meta["members"].items():
            entry["index"] = code["index"][int(rank)]
    write_private_file(here / f".{name}.json.partial-{os.getpid()}", json.dumps(meta).encode())
    os.replace(here / f".{name}.json.partial-{os.getpid()}", here / f"{name}.json")
    return name


def parities(root: Path) -> list[tuple[int, int, Path]]:
    """``(step, group, json path)`` of every complete parity under ``root``, newest step first."""
    found = []
    for entry in root.iterdir() if root.is_dir() else []:
        step = _STEP.match(entry.name)
        if not step:
            continue
        for meta in entry.iterdir():
            group = _GROUP.match(meta.name)
            if group and meta.with_suffix(".parity").is_file():
                found.append((int(step.group(1)), int(group.group(1)), meta))
    return sorted(found, key=lambda f: (-f[0], f[1]))


def prune(root: Path, keep_from: int) -> None:
    """Remove the parities of steps before ``keep_from``."""
    for step, _, meta in parities(root):
        if step < keep_from:
            shutil.rmtree(meta.parent, ignore_errors=True)


def rebuild(parity_root: Path, copies_root: Path) -> tuple[list[str], list[str]]:
    """Rebuild, into ``copies_root`` (``step-N/rank-R``), every member missing there from its group's parities.

    Returns (what was rebuilt, ``step-N/rank-R from <code>``, why each group that lost more members than its
    parities rebuild, or whose parities do not check, could not be).  The
    members at hand must be in ``copies_root`` (the hand-over puts every
    surviving rank's own snapshots there).
    """
    rebuilt, failed = [], []
    groups: dict[tuple[int, int], list[Path]] = {}
    for step, group, meta_path in parities(parity_root):
        groups.setdefault((step, group), []).append(meta_path)
    for (step, group), metas in sorted(groups.items(), key=lambda g: (-g[0][0], g[0][1])):
        rows = []
        for path in metas:
            try:
                rows.append(_read_meta(path))
            except ParityError as exc:  # (the group's other parities may still do)
                failed.append(str(exc))
        if not rows:
            continue
        here = step_dir(copies_root, step)
        # Rows that agree on the code and on every member's blob: one set per timeline that left parities here
        # (a stale one from a cut-short timeline never mixes with this one's); the most rows first.
        sets: dict[str, list[dict]] = {}
        for row in rows:
            key = json.dumps([row.get("code", "xor"), row.get("k"), row.get("m"), sorted(row["members"].items())])
            sets.setdefault(key, []).append(row)
        candidates = sorted(sets.values(), key=len, reverse=True)
        missing = sorted(rank for rank in candidates[0][0]["members"] if not (here / rank_dir_name(rank)).is_dir())
        if not missing:
            continue
        blobs, errors = None, []
        for candidate in candidates:
            try:
                blobs = _rebuild_group(candidate, here, missing)
                break
            except ParityError as exc:
                errors.append(str(exc))
        if blobs is None:
            failed.append(f"minibatch {step}: {errors[0]}")
            continue
        for rank, blob in blobs.items():
            try:
                if install_rank_copy(copies_root, step, rank_dir_name(rank), lambda partial: unpack_blob(blob, partial)):
                    code = "XOR parity" if candidate[0].get("code", "xor") == "xor" else "Reed-Solomon parities"
                    rebuilt.append(f"{step_dir(copies_root, step).name}/{rank_dir_name(rank)} from {code}")
            except (OSError, ParityError) as exc:
                failed.append(f"minibatch {step}: rank {rank}'s snapshot cannot be rebuilt ({exc})")
    return rebuilt, failed


def _read_meta(path: Path) -> dict:
    """A parity's JSON, checked: ``members`` as {rank: (length, digest, index)}."""
    try:
        meta = json.loads(path.read_text())
        meta["members"] = {int(rank): (int(m["length"]), str(m["blake2b"]), int(m.get("index", -1)))
                           for rank, m in meta["members"].items()}
        if meta.get("code", "xor") not in ("xor", "rs"):
            raise ValueError(f"code {meta.get('code')!r}")
        if meta.get("code") == "rs":
            meta["k"], meta["m"], meta["row"] = int(meta["k"]), int(meta["m"]), int(meta["row"])
            if sorted(i for _, _, i in meta["members"].values()) != list(range(meta["k"])) or not 0 <= meta["row"] < meta["m"]:
                raise ValueError("member indexes or row out of range")
        meta["path"] = path
        return meta
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ParityError(f"{path}: unreadable ({exc})") from None


def _rebuild_group(rows: list[dict], here: Path, missing: list[int]) -> dict[int, bytes]:
    """The blobs of the ``missing`` members of one group, from its parities ``rows`` (one code, one set of
    members) and the others in ``here``, each checked against its digest; raises ParityError."""
    members = rows[0]["members"]
    if set(missing) - set(members):
        raise ParityError("parities of another set of members")
    lost_names = ", ".join(map(str, missing))
    if rows[0].get("code", "xor") == "xor" and len(missing) > 1:
        raise ParityError(f"ranks {lost_names} of one XOR group are all lost (a group's parity rebuilds one)")
    if len(missing) > len(rows):
        raise ParityError(f"ranks {lost_names} of one Reed-Solomon group are lost and {len(rows)} of its parities "
                          f"survive (each rebuilds one)")
    present: dict[int, np.ndarray] = {}
    try:
        for rank in members:
            if rank in missing:
                continue
            blob = blob_of(here / rank_dir_name(rank))
            if digest(blob) != members[rank][1]:
                raise ParityError(f"rank {rank}'s snapshot there is not the one the parity was made of")
            present[rank] = np.frombuffer(blob, np.uint8)
        if rows[0].get("code", "xor") == "xor":
            parity = np.fromfile(rows[0]["path"].with_suffix(".parity"), np.uint8).copy()
            for data in present.values():
                parity = xor_into(parity, data)
            found = {missing[0]: parity}
        else:
            from jitckpt.store import isal

            try:
                isal.library()
            except isal.IsalUnavailable as exc:
                raise ValueError(str(exc)) from None
            k, m = rows[0]["k"], rows[0]["m"]
            size = max(r["path"].with_suffix(".parity").stat().st_size for r in rows)
            index = {rank: i for rank, (_, _, i) in members.items()}
            sources = {index[rank]: _padded(data, size) for rank, data in present.items()}
            for r in sorted(rows, key=lambda r: r["row"])[:len(missing)]:
                sources[k + r["row"]] = _padded(np.fromfile(r["path"].with_suffix(".parity"), np.uint8), size)
            decoded = isal.decode(k, m, sources, [index[rank] for rank in missing])
            found = {rank: decoded[index[rank]] for rank in missing}
    except (OSError, ValueError, IndexError, ImportError) as exc:
        raise ParityError(f"ranks {lost_names} cannot be rebuilt ({exc})") from None
    blobs = {}
    for rank, data in found.items():
        length, expected = members[rank][0], members[rank][1]
        blob = data[:length].tobytes()
        if digest(blob) != expected:
            raise ParityError(f"rank {rank}'s rebuilt snapshot does not match its digest (a corrupt parity?)")
        blobs[rank] = blob
    return blobs


def _padded(data: np.ndarray, size: int) -> np.ndarray:
    if len(data) >= size:
        return np.ascontiguousarray(data[:size])
    return np.concatenate([data, np.zeros(size - len(data), np.uint8)])
