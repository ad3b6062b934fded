"""Per-rank state in host shared memory that outlives the rank: the three-slot step stash.

A rank's own state for a minibatch (its RNG, its data loaders' positions and
seeds, the batches it drew) is not its replicas' state, and a rank that dies cannot save it.  So
each rank writes it, every minibatch, into a file of its own under the job's
``/dev/shm`` directory; a healthy rank on the same host copies every local
rank's entry for the saved minibatch into its JIT checkpoint
(``jitckpt.worker.save``), and a restarted rank reads its own entry back
(``jitckpt.worker.resume``).

One file per (kind, rank), ``<kind>-rank-NNNNN.bin``, holds three slots
chosen by step modulo 3, so "start of minibatch i-1", "of i" and "of i+1" are
all there: healthy replicas may save i or i+1 (paper §3.3), and a survivor
that has not yet seen its all-reduce of minibatch i-1 complete (a busy host)
saves i-1 while a rank on its host has already stashed the start of i+1 (at
its first gradient collective of minibatch i).  Ranks are never more than
that apart: no rank completes the all-reduce of minibatch i before every rank
has issued it.  (A host that runs ahead of its device, with NCCL, could
stash i+2 while a peer saves i-1 only if it finished minibatch i+1's step
without the all-reduce's result; jitckpt's pre-step wait prevents that, and
a start that is missing is refused, never guessed.)  Each slot is
guarded by a sequence number (odd while writing) and a CRC, so a reader never
takes a half-written entry.  The payloads are bytes in formats that decode to
data only (``rng_state``'s binary format, ``jitckpt.store.safe_codec``).
"""

from __future__ import annotations

import mmap
import os
import struct
import zlib
from pathlib import Path

from jitckpt.store.private import make_private_dir, open_private_file

SLOTS = 3
# seq (odd while writing), step, payload length, crc32 of payload
_HEADER = struct.Struct("<QqII")

RNG = "rng"
LOADER = "loader"
FETCH = "fetch"
GAP = "gap"
# kind -> (slot size, the folder of a rank checkpoint its entries are copied to, file suffix)
KINDS = {
    RNG: (1 << 18, "jitckpt-rng", ".bin"),  # (the script's own generators too: private_rng)
    LOADER: (1 << 22, "jitckpt-loader", ".bin"),
    FETCH: (1 << 13, "jitckpt-fetch", ".bin"),  # the batches each minibatch drew (jitckpt.worker.data_position)
    GAP: (1 << 18, "jitckpt-gap", ".bin"),  # what was drawn before each minibatch's data (jitckpt.worker.minibatch_gap)
}


def stash_path(shm_dir: str | os.PathLike, kind: str, rank: int) -> Path:
    """The stash file of ``kind`` for ``rank`` in the job's shared-memory directory."""
    return Path(shm_dir) / f"{kind}-rank-{rank:05d}.bin"


def checkpoint_file_name(kind: str, rank: int) -> str:
    """Where rank ``rank``'s entry of ``kind`` sits inside a rank checkpoint."""
    _, folder, suffix = KINDS[kind]
    return f"{folder}/rank-{rank:05d}{suffix}"


class StashFull(ValueError):
    """A payload larger than the stash slot."""


class StepStash:
    """A rank's ``SLOTS``-slot stash of one kind (writer side)."""

    def __init__(self, shm_dir: str | os.PathLike, kind: str, rank: int) -> None:
        self.slot_size = KINDS[kind][0]
        make_private_dir(Path(shm_dir), parents=True)
        self.path = stash_path(shm_dir, kind, rank)
        fd = open_private_file(self.path, os.O_RDWR | os.O_CREAT)
        try:
            os.ftruncate(fd, SLOTS * self.slot_size)
            self._map = mmap.mmap(fd, SLOTS * self.slot_size)
        finally:
            os.close(fd)
        self._seq = [0] * SLOTS

    def put(self, step: int, payload: bytes) -> None:
        """Store the state minibatch ``step`` starts with (overwrites the entry of step-SLOTS)."""
        if len(payload) > self.slot_size - _HEADER.size:
            raise StashFull(f"{len(payload)} bytes do not fit the {self.slot_size}-byte stash slot of {self.path.name}")
        slot = step % SLOTS
        base = slot * self.slot_size
        seq = self._seq[slot] + 1  # odd: writing
        struct.pack_into("<Q", self._map, base, seq)
        self._map[base + _HEADER.size : base + _HEADER.size + len(payload)] = payload
        _HEADER.pack_into(self._map, base, seq + 1, step, len(payload), zlib.crc32(payload))
        self._seq[slot] = seq + 1


def read_stash(path: str | os.PathLike) -> dict[int, bytes]:
    """Return {step: payload} for every intact slot of a stash file (reader side)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return {}
    slot_size = len(data) // SLOTS
    found = {}
    for slot in range(SLOTS):
        base = slot * slot_size
        if slot_size < _HEADER.size:
            continue
        seq, step, length, crc = _HEADER.unpack_from(data, base)
        payload = data[base + _HEADER.size : base + _HEADER.size + length]
        if seq and seq % 2 == 0 and len(payload) == length and zlib.crc32(payload) == crc:
            found[step] = payload
    return found


def stashed_ranks(shm_dir: str | os.PathLike, kind: str) -> dict[int, Path]:
    """{rank: stash file} of every local rank that has a stash of ``kind``."""
    found = {}
    for path in sorted(Path(shm_dir).glob(f"{kind}-rank-*.bin")):
        try:
            found[int(path.stem.rsplit("-", 1)[1])] = path
        except ValueError:
            continue
    return found
