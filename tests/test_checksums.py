"""Integrity checksums of committed checkpoints: XXH3-128 now, SHA-256 still understood."""

from __future__ import annotations

import hashlib
import json

import pytest

from jitckpt.store import CheckpointError, ParallelCoordinates
from jitckpt.store.disk import CHECKSUM, META_FILE, PendingSave, file_checksum, verify_or_raise


def _commit(root, content: bytes = b"weights" * 1000):
    pending = PendingSave(root, 2, ParallelCoordinates.from_layout(0, 1))
    (pending.path / "state.pt").write_bytes(content)
    return pending.commit()


def test_new_checkpoints_carry_xxh3_and_detect_a_flipped_bit(tmp_path):
    final = _commit(tmp_path)
    entry = json.loads((final / META_FILE).read_text())["files"]["state.pt"]
    assert set(entry) == {"size", CHECKSUM} and entry[CHECKSUM] == file_checksum(final / "state.pt")
    verify_or_raise(final)
    data = bytearray((final / "state.pt").read_bytes())
    data[1234] ^= 0x01
    (final / "state.pt").write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="fails its xxh3_128 checksum"):
        verify_or_raise(final)


def test_checkpoints_with_sha256_sums_are_still_verified(tmp_path):
    final = _commit(tmp_path)
    meta = json.loads((final / META_FILE).read_text())
    content = (final / "state.pt").read_bytes()
    meta["files"]["state.pt"] = {"size": len(content), "sha256": hashlib.sha256(content).hexdigest()}
    (final / META_FILE).write_text(json.dumps(meta))
    verify_or_raise(final)
    meta["files"]["state.pt"]["sha256"] = "0" * 64
    (final / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="fails its sha256 checksum"):
        verify_or_raise(final)


def test_a_file_entry_without_a_known_checksum_is_refused(tmp_path):
    final = _commit(tmp_path)
    meta = json.loads((final / META_FILE).read_text())
    meta["files"]["state.pt"] = {"size": meta["files"]["state.pt"]["size"], "md5": "x"}
    (final / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(CheckpointError, match="carries no known checksum"):
        verify_or_raise(final)
