"""Random-number-generator state: captured at every minibatch start, restored on resume.

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
"""

from __future__ import annotations

import ctypes
import mmap
import os
import pickle
import random
import struct
import sys
import zlib
from pathlib import Path
from typing import Any

_SLOT_SIZE = 1 << 16
_MT19937_STATE_BYTES = 624 * 4 + 4  # uint32 key[624]; int pos
# seq (odd while writing), step, payload length, crc32 of payload
_HEADER = struct.Struct("<QqII")


class _PythonRandomCache:
    """The last pickled ``random`` state: most training loops never draw from it, so it rarely changes."""

    state: tuple | None = None
    pickled = b""


def _pickled_python_random() -> bytes:
    current = random.getstate()
    if current != _PythonRandomCache.state:  # ~5x cheaper than pickling 625 ints every minibatch
        _PythonRandomCache.state = current
        _PythonRandomCache.pickled = pickle.dumps(current, protocol=pickle.HIGHEST_PROTOCOL)
    return _PythonRandomCache.pickled


class _NumpyRandomCache:
    """The last pickled state of NumPy's global generator, and the raw MT19937 words it was taken from.

    ``numpy.random.get_state()`` costs ~50 us; reading the generator's raw
    words costs ~1 us.  If they are unchanged and no cached Gaussian was
    pending, nothing was drawn since the last capture and its pickle is
    reused.  (A pending cached Gaussian can be consumed without moving the
    words, so then the full state is read again.)
    """

    raw = b""
    pickled = b""
    gauss_pending = True


def _numpy_raw_words(numpy: Any) -> bytes | None:
    try:
        bit_generator = numpy.random.mtrand._rand._bit_generator
        return ctypes.string_at(bit_generator.ctypes.state_address, _MT19937_STATE_BYTES)
    except Exception:  # another NumPy layout: always read the full state
        return None


def _pickled_numpy_random(numpy: Any) -> bytes:
    raw = _numpy_raw_words(numpy)
    cache = _NumpyRandomCache
    if raw is None or raw != cache.raw or cache.gauss_pending:
        state = numpy.random.get_state()
        cache.raw = raw or b""
        cache.pickled = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        cache.gauss_pending = raw is None or bool(state[3])
    return cache.pickled


def capture() -> dict[str, Any]:
    """The current RNG states as plain picklable values (bytes; see restore())."""
    import torch

    state: dict[str, Any] = {"torch_cpu": torch.get_rng_state().numpy().tobytes(), "python": _pickled_python_random()}
    if torch.cuda.is_initialized():  # (cheap; implies CUDA is available)
        state["torch_cuda"] = [s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()]
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        state["numpy"] = _pickled_numpy_random(numpy)
    return state


def restore(state: dict[str, Any]) -> None:
    """Put back states produced by capture()."""
    import torch

    torch.set_rng_state(torch.frombuffer(bytearray(state["torch_cpu"]), dtype=torch.uint8))
    random.setstate(pickle.loads(state["python"]))
    if "torch_cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.frombuffer(bytearray(s), dtype=torch.uint8) for s in state["torch_cuda"]])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(pickle.loads(state["numpy"]))


def stash_path(shm_dir: str | os.PathLike, rank: int) -> Path:
    return Path(shm_dir) / f"rng-rank-{rank:05d}.bin"


class RngStash:
    """A rank's two-slot RNG stash in host shared memory (writer side)."""

    def __init__(self, shm_dir: str | os.PathLike, rank: int) -> None:
        Path(shm_dir).mkdir(parents=True, exist_ok=True)
        self.path = stash_path(shm_dir, rank)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, 2 * _SLOT_SIZE)
            self._map = mmap.mmap(fd, 2 * _SLOT_SIZE)
        finally:
            os.close(fd)
        self._seq = [0, 0]

    def put(self, step: int, state: dict[str, Any]) -> None:
        """Store the state at the start of minibatch ``step`` (overwrites step-2)."""
        payload = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
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
    """Return {step: pickled state} for every intact slot of a stash file (reader side)."""
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
