"""Cauchy Reed-Solomon coding of snapshot blobs with Intel's ISA-L (the ``rs`` scheme of the memory tier).

Why ISA-L, called directly.  ECHECK codes checkpoints with Cauchy
Reed-Solomon; the maintained libraries for that are ISA-L and, above it,
liberasurecode with its Python binding pyeclib.  Measured on the same buffers
(``benchmarks/erasure_codes.py``), pyeclib's ``encode`` reaches 0.6 GB/s per
core (it copies the object into fragments with headers and checksums), while
ISA-L's own ``ec_encode_data`` reaches about 10 GB/s: so jitckpt calls ISA-L's
functions for every Galois-field operation (the coding matrix, its inverse,
the tables, the SIMD dot products) and only picks rows of matrices itself.

Where ISA-L comes from, first found: ``JITCKPT_ISAL_LIBRARY`` (a path), the
system's ``libisal.so.2`` (Debian's ``libisal2``), or the copy that pyeclib's
wheels carry (``pip install 'jitckpt[rs]'``).  Without any, the ``rs`` scheme
is refused with that advice (``IsalUnavailable``).

Code.  For ``k`` data blobs and ``m`` parities, ISA-L's Cauchy matrix
(``gf_gen_cauchy1_matrix``, ``k + m`` rows of ``k``): row ``k + j`` gives
parity ``j``.  Any ``k`` of the ``k + m`` rows form an invertible matrix, so
any ``m`` lost blobs come back from the others.  A parity is built one blob
at a time (``ec_encode_data_update``) as the blobs arrive, so a holder keeps
one parity buffer, never the group's blobs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import importlib.util
import os
from pathlib import Path

import numpy as np

ENV_LIBRARY = "JITCKPT_ISAL_LIBRARY"
_BYTES = ctypes.POINTER(ctypes.c_ubyte)
_MAX_CALL = 1 << 30  # bytes per ISA-L call (its lengths are C ints)


class IsalUnavailable(Exception):
    """ISA-L cannot be loaded: why, and how to get it."""


def _candidates() -> list[str]:
    found = []
    if os.environ.get(ENV_LIBRARY):
        return [os.environ[ENV_LIBRARY]]
    system = ctypes.util.find_library("isal")
    found += [system] if system else []
    found += ["libisal.so.2"]
    spec = importlib.util.find_spec("pyeclib")
    if spec is not None and spec.origin:
        libs = Path(spec.origin).parent.parent / "pyeclib.libs"
        found += sorted(str(p) for p in libs.glob("libisal*.so*"))
    return found


@functools.lru_cache(maxsize=1)
def library() -> ctypes.CDLL:
    """ISA-L, loaded once; raises IsalUnavailable."""
    tried = []
    for name in _candidates():
        try:
            lib = ctypes.CDLL(name)
        except OSError as exc:
            tried.append(f"{name}: {exc}")
            continue
        try:
            for fn in ("gf_gen_cauchy1_matrix", "gf_invert_matrix", "ec_init_tables", "ec_encode_data",
                       "ec_encode_data_update"):
                getattr(lib, fn)
        except AttributeError as exc:
            tried.append(f"{name}: {exc}")
            continue
        ints, pointers = ctypes.c_int, ctypes.POINTER(_BYTES)
        lib.gf_gen_cauchy1_matrix.argtypes = [_BYTES, ints, ints]
        lib.gf_gen_cauchy1_matrix.restype = None
        lib.gf_invert_matrix.argtypes = [_BYTES, _BYTES, ints]
        lib.gf_invert_matrix.restype = ctypes.c_int
        lib.ec_init_tables.argtypes = [ints, ints, _BYTES, _BYTES]
        lib.ec_init_tables.restype = None
        lib.ec_encode_data.argtypes = [ints, ints, ints, _BYTES, pointers, pointers]
        lib.ec_encode_data.restype = None
        lib.ec_encode_data_update.argtypes = [ints, ints, ints, ints, _BYTES, _BYTES, pointers]
        lib.ec_encode_data_update.restype = None
        return lib
    raise IsalUnavailable("the rs scheme needs Intel's ISA-L erasure-code library, not found "
                          f"({'; '.join(tried) or 'nothing to try'}): pip install 'jitckpt[rs]' (pyeclib's wheels "
                          f"carry it), install the system's libisal2, or name it in {ENV_LIBRARY}")


def _ptr(array: np.ndarray) -> "ctypes._Pointer":
    return array.ctypes.data_as(_BYTES)


def _pointers(arrays: list[np.ndarray], offset: int = 0) -> "ctypes.Array":
    return (_BYTES * len(arrays))(*[ctypes.cast(a.ctypes.data + offset, _BYTES) for a in arrays])


@functools.lru_cache(maxsize=64)
def coding_matrix(k: int, m: int) -> np.ndarray:
    """ISA-L's Cauchy matrix for ``k`` data and ``m`` parities: ``(k + m, k)`` bytes, the identity on top."""
    if not (1 <= k and 1 <= m and k + m <= 255):
        raise ValueError(f"no Reed-Solomon code for k={k}, m={m} (1 <= k, 1 <= m, k + m <= 255)")
    matrix = np.zeros((k + m, k), np.uint8)
    library().gf_gen_cauchy1_matrix(_ptr(matrix), k + m, k)
    matrix.flags.writeable = False
    return matrix


def _tables(k: int, rows: np.ndarray) -> np.ndarray:
    rows = np.ascontiguousarray(rows, np.uint8)
    tables = np.zeros(32 * k * len(rows), np.uint8)
    library().ec_init_tables(k, len(rows), _ptr(rows), _ptr(tables))
    return tables


def update(parity: np.ndarray, blob: bytes | memoryview | np.ndarray, k: int, m: int, row: int,
           index: int) -> np.ndarray:
    """Fold data blob number ``index`` (of ``k``) into parity ``row`` (of ``m``); the blob is zero-padded to
    the parity's length, and the parity grows (zeros) to the blob's.  Returns the (possibly new) parity."""
    if not (0 <= index < k and 0 <= row < m):
        raise ValueError(f"blob {index} of {k}, parity {row} of {m}")
    data = np.frombuffer(blob, np.uint8) if not isinstance(blob, np.ndarray) else blob
    if len(data) > len(parity):
        grown = np.zeros(len(data), np.uint8)
        grown[:len(parity)] = parity
        parity = grown
    tables = _tables(k, coding_matrix(k, m)[k + row:k + row + 1])
    lib = library()
    for start in range(0, len(data), _MAX_CALL):
        n = min(_MAX_CALL, len(data) - start)
        lib.ec_encode_data_update(n, k, 1, index, _ptr(tables), ctypes.cast(data.ctypes.data + start, _BYTES),
                                  _pointers([parity], start))
    return parity


def encode(blobs: list[np.ndarray], m: int) -> list[np.ndarray]:
    """All ``m`` parities of ``k`` equal-length blobs at once (for tests and benchmarks; holders use update)."""
    blobs = [np.ascontiguousarray(b, np.uint8) for b in blobs]
    k, size = len(blobs), len(blobs[0])
    parities = [np.zeros(size, np.uint8) for _ in range(m)]
    tables = _tables(k, coding_matrix(k, m)[k:])
    lib = library()
    for start in range(0, size, _MAX_CALL):
        n = min(_MAX_CALL, size - start)
        lib.ec_encode_data(n, k, m, _ptr(tables), _pointers(blobs, start), _pointers(parities, start))
    return parities


def decode(k: int, m: int, present: dict[int, np.ndarray], lost: list[int]) -> dict[int, np.ndarray]:
    """The data blobs ``lost`` (indexes below ``k``) from any ``k`` of the others: ``present`` maps an index
    (a data blob below ``k``, parity ``j`` at ``k + j``) to its buffer, all of one length.  ValueError if
    fewer than ``k`` are present."""
    usable = sorted(i for i in present if i not in lost)[:k]
    if len(usable) < k:
        raise ValueError(f"{len(usable)} of the {k} blobs needed are at hand")
    size = len(present[usable[0]])
    if any(len(present[i]) != size for i in usable):
        raise ValueError("blobs of different lengths")
    chosen = np.ascontiguousarray(coding_matrix(k, m)[usable])  # row i of it: source i as a mix of the k data
    inverse = np.zeros((k, k), np.uint8)
    if library().gf_invert_matrix(_ptr(chosen.copy()), _ptr(inverse), k) != 0:
        raise ValueError("a singular decoding matrix")  # (never for a Cauchy code; checked all the same)
    tables = _tables(k, inverse[lost])
    out = {i: np.zeros(size, np.uint8) for i in lost}
    sources = [np.ascontiguousarray(present[i]) for i in usable]
    lib = library()
    for start in range(0, size, _MAX_CALL):
        n = min(_MAX_CALL, size - start)
        lib.ec_encode_data(n, k, len(lost), _ptr(tables), _pointers(sources, start),
                           _pointers([out[i] for i in lost], start))
    return out
