#!/usr/bin/env python3
"""Integrity hashing on the JIT save's critical path: SHA-256 against XXH3-128 (and others).

A JIT save checksums every file it commits (jitckpt/store/disk.py), so the
hash's speed adds directly to the time a failure costs.  This prints, for a
checkpoint file of each size, the time to commit it with each hash
(``PendingSave.commit``, which also fsyncs) and the raw hashing throughput,
interleaved (one round of every hash, then the next round) so machine load
hits all of them alike.  Median of --reps rounds.

    python benchmarks/checksum.py                 # 64 MiB and 512 MiB, 5 rounds
    python benchmarks/checksum.py --sizes 1024 --reps 3
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Callable

import xxhash

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from jitckpt.store import ParallelCoordinates  # noqa: E402
from jitckpt.store import disk  # noqa: E402

HASHES: dict[str, Callable[[], object]] = {
    "sha256": hashlib.sha256,
    "xxh3_128": xxhash.xxh3_128,
    "blake2b": hashlib.blake2b,
}


def hash_file(path: Path, new: Callable[[], object]) -> None:
    digest = new()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)  # type: ignore[attr-defined]


def commit_seconds(root: Path, size: int, algorithm: str) -> float:
    """Seconds ``PendingSave.commit`` takes for one file of ``size`` bytes with ``algorithm``."""
    pending = disk.PendingSave(root, size, ParallelCoordinates.from_layout(0, 1))
    with open(pending.path / "state.pt", "wb") as f:
        f.write(os.urandom(1 << 20) * (size >> 20))
    saved = disk.CHECKSUM
    disk.CHECKSUM = algorithm
    disk._CHECKSUMS.setdefault(algorithm, HASHES[algorithm])
    try:
        started = time.perf_counter()
        final = pending.commit()
        seconds = time.perf_counter() - started
    finally:
        disk.CHECKSUM = saved
    for file in final.iterdir():
        file.unlink()
    final.rmdir()
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 512], help="file sizes in MiB")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    args = parser.parse_args()
    print(f"# checksum benchmark, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}\n")
    print("| file | hash | commit (median s) | hashing (GB/s) | commit vs sha256 |")
    print("| --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        root = Path(tmp)
        for size_mib in args.sizes:
            size = size_mib << 20
            commits: dict[str, list[float]] = {name: [] for name in HASHES}
            rates: dict[str, list[float]] = {name: [] for name in HASHES}
            sample = root / "sample.bin"
            sample.write_bytes(os.urandom(1 << 20) * size_mib)
            for _ in range(args.reps):
                for name, new in HASHES.items():
                    commits[name].append(commit_seconds(root, size, name))
                    started = time.perf_counter()
                    hash_file(sample, new)
                    rates[name].append(size / (time.perf_counter() - started) / 1e9)
            sample.unlink()
            base = statistics.median(commits["sha256"])
            for name in HASHES:
                median = statistics.median(commits[name])
                print(f"| {size_mib} MiB | {name} | {median:.3f} | {statistics.median(rates[name]):.2f} | {median / base:.2f}x |")
    print(f"\n(crc32 for reference: {len(b'x' * (64 << 20)) / _time(lambda: zlib.crc32(b'x' * (64 << 20))) / 1e9:.2f} GB/s, "
          "not used: 32 bits are too few for many large files)")
    return 0


def _time(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


if __name__ == "__main__":
    sys.exit(main())
