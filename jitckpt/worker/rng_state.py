"""Random-number-generator state: captured every minibatch, restored on resume, never executed.

The library captures by itself the state a redone minibatch needs to draw the
same random numbers: torch's CPU generator, every initialised CUDA device's
generator, Python's ``random`` and NumPy's global generator (if NumPy is
loaded).  Ranks may seed differently, and a replica's RNG is not the dead
rank's RNG, so each rank's copy lives outside its process: in a host
shared-memory file (``/dev/shm``) that survives the rank's death and that a
healthy rank on the same host copies into its JIT checkpoint.

The stash keeps two slots (by step parity), so both "start of minibatch i"
and "start of minibatch i+1" are available: healthy replicas may save either
(paper §3.3).  Each slot is guarded by a sequence number and a CRC, so a
reader never takes a half-written state.

The states are stored in a fixed binary format (below), not as pickles: a
checkpoint directory is read back as untrusted input, and decoding it can only
yield numbers or a ``RngStateError``, never run code.

    payload := MAGIC record*
    record  := kind:u8 length:u32 data[length]
    kind 1  torch CPU generator state (torch's own byte layout)
    kind 2  Python random: version:i32 words[625]:u32 has_gauss:u8 gauss:f64
    kind 3  NumPy MT19937: key[624]:u32 pos:i32 has_gauss:u8 gauss:f64
    kind 4  one CUDA device's generator state, in device order
"""

from __future__ import annotations

import array
import ctypes
import mmap
import os
import random
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

from jitckpt.store.disk import make_private_dir

_SLOT_SIZE = 1 << 16
_MT19937_STATE_BYTES = 624 * 4 + 4  # uint32 key[624]; int pos
# seq (odd while writing), step, payload length, crc32 of payload
_HEADER = struct.Struct("<QqII")

MAGIC = b"JITRNG1\0"
_RECORD = struct.Struct("<BI")
TORCH_CPU, PYTHON, NUMPY, TORCH_CUDA = 1, 2, 3, 4
_PYTHON_TAIL = struct.Struct("<Bd")
_NUMPY_TAIL = struct.Struct("<iBd")
_PYTHON_SIZE = 4 + 625 * 4 + _PYTHON_TAIL.size
_NUMPY_SIZE = 624 * 4 + _NUMPY_TAIL.size


class RngStateError(ValueError):
    """A stored RNG state is not in jitckpt's format (corrupt, truncated or foreign)."""


def _record(kind: int, data: bytes) -> bytes:
    return _RECORD.pack(kind, len(data)) + data


class _PythonRandomCache:
    """The last encoded ``random`` state: most training loops never draw from it, so it rarely changes."""

    state: tuple | None = None
    encoded = b""


def _encoded_python_random() -> bytes:
    current = random.getstate()
    if current != _PythonRandomCache.state:  # ~5x cheaper than encoding 625 ints every minibatch
        version, words, gauss = current
        _PythonRandomCache.state = current
        _PythonRandomCache.encoded = _record(
            PYTHON,
            struct.pack("<i", version) + array.array("I", words).tobytes()
            + _PYTHON_TAIL.pack(gauss is not None, 0.0 if gauss is None else gauss),
        )
    return _PythonRandomCache.encoded


class _NumpyRandomCache:
    """The last encoded state of NumPy's global generator, and the raw MT19937 words it was taken from.

    ``numpy.random.get_state()`` costs ~50 us; reading the generator's raw
    words costs ~1 us.  If they are unchanged and no cached Gaussian was
    pending, nothing was drawn since the last capture and its encoding is
    reused.  (A pending cached Gaussian can be consumed without moving the
    words, so then the full state is read again.)
    """

    raw = b""
    encoded = b""
    gauss_pending = True


def _numpy_raw_words(numpy: Any) -> bytes | None:
    try:
        bit_generator = numpy.random.mtrand._rand._bit_generator
        return ctypes.string_at(bit_generator.ctypes.state_address, _MT19937_STATE_BYTES)
    except Exception:  # another NumPy layout: always read the full state
        return None


def _encoded_numpy_random(numpy: Any) -> bytes:
    raw = _numpy_raw_words(numpy)
    cache = _NumpyRandomCache
    if raw is None or raw != cache.raw or cache.gauss_pending:
        name, key, pos, has_gauss, gauss = numpy.random.get_state()
        if name != "MT19937":
            raise RngStateError(f"NumPy's global generator is {name}, not MT19937")
        cache.raw = raw or b""
        cache.encoded = _record(NUMPY, numpy.asarray(key, dtype="<u4").tobytes()
                                + _NUMPY_TAIL.pack(int(pos), bool(has_gauss), float(gauss)))
        cache.gauss_pending = raw is None or bool(has_gauss)
    return cache.encoded


def capture() -> bytes:
    """The current RNG states, encoded (see the module docstring; restore() takes them back)."""
    import torch

    parts = [MAGIC, _record(TORCH_CPU, torch.get_rng_state().numpy().tobytes()), _encoded_python_random()]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        parts.append(_encoded_numpy_random(numpy))
    if torch.cuda.is_initialized():  # (cheap; implies CUDA is available)
        parts += [_record(TORCH_CUDA, s.numpy().tobytes()) for s in torch.cuda.get_rng_state_all()]
    return b"".join(parts)


def decode(payload: bytes) -> dict[int, list[bytes]]:
    """The records of an encoded state by kind, checked for shape; raises RngStateError on anything else."""
    if not payload.startswith(MAGIC):
        raise RngStateError("not a jitckpt RNG state (bad magic: a pickle or another file?)")
    records: dict[int, list[bytes]] = {}
    offset = len(MAGIC)
    while offset < len(payload):
        if offset + _RECORD.size > len(payload):
            raise RngStateError("truncated RNG state")
        kind, length = _RECORD.unpack_from(payload, offset)
        offset += _RECORD.size
        data = payload[offset:offset + length]
        offset += length
        if len(data) != length:
            raise RngStateError("truncated RNG state")
        expected = {PYTHON: _PYTHON_SIZE, NUMPY: _NUMPY_SIZE}.get(kind)
        if kind not in (TORCH_CPU, PYTHON, NUMPY, TORCH_CUDA) or (expected is not None and length != expected):
            raise RngStateError(f"unknown or malformed RNG record (kind {kind}, {length} bytes)")
        if kind != TORCH_CUDA and kind in records:
            raise RngStateError(f"duplicate RNG record (kind {kind})")
        records.setdefault(kind, []).append(data)
    if TORCH_CPU not in records or PYTHON not in records:
        raise RngStateError("RNG state lacks the torch CPU or Python record")
    return records


def restore(payload: bytes) -> None:
    """Put back a state produced by capture(); raises RngStateError (and changes nothing) if it is malformed."""
    import torch

    records = decode(payload)
    python = records[PYTHON][0]
    version = struct.unpack_from("<i", python)[0]
    words = tuple(array.array("I", python[4:4 + 625 * 4]))
    has_gauss, gauss = _PYTHON_TAIL.unpack_from(python, 4 + 625 * 4)
    numpy_state = None
    if NUMPY in records:
        import numpy

        data = records[NUMPY][0]
        pos, np_has_gauss, np_gauss = _NUMPY_TAIL.unpack_from(data, 624 * 4)
        numpy_state = ("MT19937", numpy.frombuffer(data[:624 * 4], dtype="<u4").astype(numpy.uint32), pos, np_has_gauss, np_gauss)
    cpu = torch.frombuffer(bytearray(records[TORCH_CPU][0]), dtype=torch.uint8)
    try:
        torch.set_rng_state(cpu)
        random.setstate((version, words, gauss if has_gauss else None))
    except (RuntimeError, ValueError, TypeError) as exc:
        raise RngStateError(f"RNG state rejected: {exc}") from None
    if TORCH_CUDA in records and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(s), dtype=torch.uint8) for s in records[TORCH_CUDA]])
    if numpy_state is not None:
        import numpy

        numpy.random.set_state(numpy_state)


def stash_path(shm_dir: str | os.PathLike, rank: int) -> Path:
    return Path(shm_dir) / f"rng-rank-{rank:05d}.bin"


class RngStash:
    """A rank's two-slot RNG stash in host shared memory (writer side)."""

    def __init__(self, shm_dir: str | os.PathLike, rank: int) -> None:
        make_private_dir(Path(shm_dir), parents=True)
        self.path = stash_path(shm_dir, rank)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, 2 * _SLOT_SIZE)
            self._map = mmap.mmap(fd, 2 * _SLOT_SIZE)
        finally:
            os.close(fd)
        self._seq = [0, 0]

    def put(self, step: int, payload: bytes) -> None:
        """Store the encoded state (capture()) at the start of minibatch ``step`` (overwrites step-2)."""
        if len(payload) > _SLOT_SIZE - _HEADER.size:
            raise ValueError(f"RNG state of {len(payload)} bytes does not fit the stash slot")
        slot = step % 2
        base = slot * _SLOT_SIZE
        seq = self._seq[slot] + 1  # odd: writing
        struct.pack_into("<Q", self._map, base, seq)
        self._map[base + _HEADER.size : base + _HEADER.size + len(payload)] = payload
        _HEADER.pack_into(self._map, base, seq + 1, step, len(payload), zlib.crc32(payload))
        self._seq[slot] = seq + 1


def read_stash(path: str | os.PathLike) -> dict[int, bytes]:
    """Return {step: encoded state} for every intact slot of a stash file (reader side)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return {}
    found = {}
    for slot in range(2):
        base = slot * _SLOT_SIZE
        if len(data) < base + _HEADER.size:
            continue
        seq, step, length, crc = _HEADER.unpack_from(data, base)
        payload = data[base + _HEADER.size : base + _HEADER.size + length]
        if seq and seq % 2 == 0 and len(payload) == length and zlib.crc32(payload) == crc:
            found[step] = payload
    return found
