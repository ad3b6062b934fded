"""How fast can a memory tier encode and rebuild snapshots on one core?  Parity codes against a plain copy.

The memory tier keeps, for every rank's snapshot, enough redundancy on other
hosts to rebuild it.  ``replicate`` (what jit-run builds) costs one copy per
snapshot; ``xor`` (REFT) and ``rs`` (ECHECK's Cauchy Reed-Solomon) cost less
memory but must encode every snapshot of a group and decode at a loss.  This
measures, single-threaded on the same warmed buffers (k snapshots of
``--mib`` MiB each):

- ``memcpy``: copying the k buffers (numpy), the cost ``replicate`` pays per
  snapshot before the network;
- ``xor``: one parity of the k buffers (numpy ``bitwise_xor``), and the
  rebuild of one lost buffer from the parity and the k-1 others;
- ``rs isa-l cauchy (jitckpt.store.isal)``: what ``--memory-redundancy rs``
  runs, ISA-L's ``ec_encode_data`` called directly (the parity holders fold
  one blob at a time with ``ec_encode_data_update``, also timed), and the
  rebuild of m lost buffers;
- ``rs isa-l cauchy (pyeclib)`` (ISA-L through liberasurecode's fragment
  API) and ``rs zfec``: m parities of the k buffers, and the rebuild of m
  lost ones.

Throughput is the data encoded (k buffers) or rebuilt per second, per core;
the variants run interleaved, ``--reps`` rounds, medians reported.  A
library that is not installed is reported as such (``pip install pyeclib
zfec``); of these, jitckpt uses only the ISA-L that pyeclib's wheels carry
(its ``rs`` extra).

    python benchmarks/erasure_codes.py [--k 4] [--m 2] [--mib 24] [--reps 7]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from typing import Callable

import numpy as np


def _buffers(k: int, size: int) -> list[bytes]:
    rng = np.random.default_rng(0)
    return [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for _ in range(k)]


def _memcpy(data: list[bytes], m: int) -> tuple[Callable[[], object], Callable[[], object]]:
    arrays = [np.frombuffer(b, np.uint8) for b in data]
    out = [np.empty_like(a) for a in arrays]

    def encode():
        for a, o in zip(arrays, out):
            np.copyto(o, a)

    return encode, encode


def _xor(data: list[bytes], m: int) -> tuple[Callable[[], object], Callable[[], object]]:
    words = [np.frombuffer(b, np.uint64) for b in data]
    parity = np.empty_like(words[0])

    def encode():
        np.copyto(parity, words[0])
        for w in words[1:]:
            np.bitwise_xor(parity, w, out=parity)

    encode()
    rebuilt = np.empty_like(parity)

    def decode():  # buffer 0 lost: parity ^ the others
        np.copyto(rebuilt, parity)
        for w in words[1:]:
            np.bitwise_xor(rebuilt, w, out=rebuilt)
        return rebuilt

    assert np.array_equal(decode(), words[0])
    return encode, decode


def _pyeclib(data: list[bytes], m: int) -> tuple[Callable[[], object], Callable[[], object]]:
    from pyeclib.ec_iface import ECDriver

    k = len(data)
    driver = ECDriver(k=k, m=m, ec_type="isa_l_rs_cauchy")
    whole = b"".join(data)  # (pyeclib splits one object into k fragments itself)
    fragments = driver.encode(whole)
    survivors = fragments[m:]  # the first m (data) fragments lost

    def encode():
        return driver.encode(whole)

    def decode():
        return driver.reconstruct(survivors, list(range(m)))

    rebuilt = decode()
    assert rebuilt == fragments[:m]
    return encode, decode


def _isal(data: list[bytes], m: int) -> tuple[Callable[[], object], Callable[[], object]]:
    from jitckpt.store import isal

    try:
        isal.library()
    except isal.IsalUnavailable:
        raise ImportError(name="ISA-L") from None
    arrays = [np.frombuffer(b, np.uint8) for b in data]
    k = len(arrays)
    parities = isal.encode(arrays, m)
    present = {i: a for i, a in enumerate(arrays) if i >= m} | {k + j: p for j, p in enumerate(parities)}

    def encode():
        return isal.encode(arrays, m)

    def decode():  # the first m lost
        return isal.decode(k, m, present, list(range(m)))

    assert all(np.array_equal(decode()[i], arrays[i]) for i in range(m))
    return encode, decode


def _isal_folding(data: list[bytes], m: int) -> tuple[Callable[[], object], Callable[[], object]]:
    from jitckpt.store import isal

    encode_all, decode = _isal(data, m)
    arrays = [np.frombuffer(b, np.uint8) for b in data]
    k = len(arrays)

    def encode():  # one parity holder's work per snapshot of its group: every member folded into its row
        parity = np.zeros(len(arrays[0]), np.uint8)
        for index, a in enumerate(arrays):
            parity = isal.update(parity, a, k, m, 0, index)
        return parity

    assert np.array_equal(encode(), encode_all()[0])
    return encode, decode


def _zfec(data: list[bytes], m: int) -> tuple[Callable[[], object], Callable[[], object]]:
    import zfec

    k = len(data)
    encoder, decoder = zfec.Encoder(k, k + m), zfec.Decoder(k, k + m)
    parities = encoder.encode(data, list(range(k, k + m)))
    blocks = [*data[m:], *parities]  # the first m lost
    numbers = [*range(m, k), *range(k, k + m)]

    def encode():
        return encoder.encode(data, list(range(k, k + m)))

    def decode():
        return decoder.decode(blocks, numbers)

    assert list(decode())[:m] == data[:m]
    return encode, decode


VARIANTS = {"memcpy": _memcpy, "xor": _xor, "rs isa-l cauchy (jitckpt.store.isal)": _isal,
            "rs isa-l one parity folded blob by blob (a holder's share)": _isal_folding,
            "rs isa-l cauchy (pyeclib)": _pyeclib, "rs zfec": _zfec}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--k", type=int, default=4, help="data buffers per group (default 4)")
    parser.add_argument("--m", type=int, default=2, help="parities of the rs codes (default 2; xor has 1)")
    parser.add_argument("--mib", type=float, default=24.0, help="MiB per buffer (default 24: the benchmark job's snapshot)")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    size = int(args.mib * 2**20) // 64 * 64
    data = _buffers(args.k, size)
    ready, missing = {}, {}
    for name, build in VARIANTS.items():
        try:
            ready[name] = build(data, args.m)
        except ImportError as exc:
            missing[name] = f"not installed ({exc.name})"
    times: dict[str, dict[str, list[float]]] = {name: {"encode": [], "decode": []} for name in ready}
    for _ in range(args.reps):  # interleaved: every variant once per round
        for name, (encode, decode) in ready.items():
            for what, fn in (("encode", encode), ("decode", decode)):
                started = time.perf_counter()
                fn()
                times[name][what].append(time.perf_counter() - started)
    encoded = args.k * size
    print(f"{args.k} buffers of {size / 2**20:.1f} MiB, m={args.m} (xor: 1), one core, median of {args.reps} "
          f"interleaved rounds; {platform.processor() or platform.machine()}, {os.cpu_count()} cores\n")
    print("| variant | encode GB/s per core | encode ms | rebuild GB/s per core | rebuild ms | encode vs memcpy |")
    print("| --- | --- | --- | --- | --- | --- |")
    base = statistics.median(times["memcpy"]["encode"])
    for name in ready:
        enc, dec = statistics.median(times[name]["encode"]), statistics.median(times[name]["decode"])
        lost = 0 if name == "memcpy" else (1 if name == "xor" else args.m)
        rebuilt = "-" if not lost else f"{lost * size / dec / 1e9:.2f}"
        print(f"| {name} | {encoded / enc / 1e9:.2f} | {enc * 1000:.1f} | {rebuilt} | "
              f"{'-' if not lost else f'{dec * 1000:.1f}'} | {enc / base:.1f}x |")
    for name, why in missing.items():
        print(f"| {name} | {why} | | | | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
