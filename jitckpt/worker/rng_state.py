"""Random-number-generator state: captured every minibatch, restored on resume, never executed.

The library captures by itself the state a redone minibatch needs to draw the
same random numbers: torch's CPU generator, every initialised CUDA device's
generator, Python's ``random`` and NumPy's global generator (if NumPy is
loaded).  Ranks may seed differently, and a replica's RNG is not the dead
rank's RNG, so each rank's copy lives outside its process: in a host
shared-memory file (``/dev/shm``) that survives the rank's death and that a
healthy rank on the same host copies into its JIT checkpoint.

The stash (``jitckpt.worker.stash``) keeps three slots (by step modulo 3),
so the starts of minibatches i-1, i and i+1 are available.

The states are stored in a fixed binary format (below), not as pickles: a
checkpoint directory is read back as untrusted input, and decoding it can only
yield numbers or a ``RngStateError``, never run code.

    payload := MAGIC record*
    record  := kind:u8 length:u32 data[length]
    kind 1  torch CPU generator state (torch's own byte layout)
    kind 2  Python random: version:i32 words[625]:u32 has_gauss:u8 gauss:f64
    kind 3  NumPy MT19937: key[624]:u32 pos:i32 has_gauss:u8 gauss:f64
    kind 4  one CUDA device's generator state, in device order
    kind 5  the script's own generators (``torch.Generator``, ``random.Random``,
            ``numpy.random.default_rng``), named by where they were made
            (``jitckpt.worker.private_rng``)
"""

from __future__ import annotations

import array
import ctypes
import os
import random
import struct
import sys
from pathlib import Path
from typing import Any

from jitckpt.worker import private_rng, stash

_MT19937_STATE_BYTES = 624 * 4 + 4  # uint32 key[624]; int pos

MAGIC = b"JITRNG1\0"
_RECORD = struct.Struct("<BI")
TORCH_CPU, PYTHON, NUMPY, TORCH_CUDA, PRIVATE = 1, 2, 3, 4, 5
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
    private = private_rng.capture()
    if private is not None:
        parts.append(_record(PRIVATE, private))
    return b"".join(parts)


def with_own_generators(payload: bytes, private: bytes) -> bytes:
    """``payload`` (a capture()) with its record of the script's own generators replaced by ``private``."""
    records = decode(payload)
    records[PRIVATE] = [private]
    return MAGIC + b"".join(_record(kind, data) for kind in sorted(records) for data in records[kind])


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
        if kind not in (TORCH_CPU, PYTHON, NUMPY, TORCH_CUDA, PRIVATE) or (expected is not None and length != expected):
            raise RngStateError(f"unknown or malformed RNG record (kind {kind}, {length} bytes)")
        if kind != TORCH_CUDA and kind in records:
            raise RngStateError(f"duplicate RNG record (kind {kind})")
        if kind == PRIVATE:
            try:
                private_rng.decode(data)
            except private_rng.PrivateRngError as exc:
                raise RngStateError(f"malformed record of the script's own generators: {exc}") from None
        records.setdefault(kind, []).append(data)
    if TORCH_CPU not in records or PYTHON not in records:
        raise RngStateError("RNG state lacks the torch CPU or Python record")
    return records


def restore(payload: bytes, own_generators: bool = True) -> None:
    """Put back a state produced by capture(); raises RngStateError (and changes nothing) if it is malformed.

    ``own_generators=False``: only the global generators (borrowing another rank's, as the HF adapter does).
    """
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
    if PRIVATE in records and own_generators:  # (first: a state they reject leaves the global ones as they were)
        try:
            private_rng.restore(records[PRIVATE][0])
        except private_rng.PrivateRngError as exc:
            raise RngStateError(str(exc)) from None
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
    """This rank's RNG stash file (``jitckpt.worker.stash``)."""
    return stash.stash_path(shm_dir, stash.RNG, rank)


class RngStash(stash.StepStash):
    """A rank's RNG stash in host shared memory (writer side; ``capture()`` payloads)."""

    def __init__(self, shm_dir: str | os.PathLike, rank: int) -> None:
        super().__init__(shm_dir, stash.RNG, rank)


read_stash = stash.read_stash
