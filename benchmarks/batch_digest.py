#!/usr/bin/env python3
"""What noting the batches each minibatch takes costs (jitckpt/worker/data_position.py), per batch.

Under jit-run, every batch a DataLoader yields gets a digest that is written to
the rank's host stash, so that a resume which would train on other batches is
refused.  This prints, for a few batch shapes, the time a plain DataLoader
(``num_workers=0``, a TensorDataset in memory: the cheapest fetch there is, so
the ratio is an upper bound) takes per batch, and the time the digest and the
stash write add to it, interleaved (one round of each, then the next round)
so machine load hits both alike.  Median of --reps rounds.

    python benchmarks/batch_digest.py            # 5 rounds of 300 batches per shape
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jitckpt.worker import data_position, stash  # noqa: E402

SHAPES = {
    "MLP rows: 32 x 64 float + 32 labels": ((64,), torch.float32, 32),
    "CIFAR-like: 64 x 3x32x32 float + 64 labels": ((3, 32, 32), torch.float32, 64),
    "tokens: 16 x 1024 long + 16 labels": ((1024,), torch.long, 16),
}


def per_batch(loader: DataLoader, note: stash.StepStash | None, batches: int) -> float:
    """Seconds per batch to iterate ``loader`` (and, with ``note``, digest and stash each batch)."""
    done, start = 0, time.perf_counter()
    while done < batches:
        for batch in loader:
            if note is not None:
                note.put(done, data_position.encode([(0, data_position.digest(batch))]))
            done += 1
            if done == batches:
                break
    return (time.perf_counter() - start) / batches


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--batches", type=int, default=300)
    args = p.parse_args()
    note = stash.StepStash(tempfile.mkdtemp(), stash.FETCH, 0)
    print(f"| batch | DataLoader alone (us/batch) | with the notes (us/batch) | added (us) | ratio |")
    print("| --- | --- | --- | --- | --- |")
    for name, (shape, dtype, size) in SHAPES.items():
        n = size * 40
        x = torch.randn(n, *shape) if dtype.is_floating_point else torch.randint(0, 50000, (n, *shape))
        loader = DataLoader(TensorDataset(x, torch.zeros(n, dtype=torch.long)), batch_size=size, shuffle=True)
        alone, noted = [], []
        for _ in range(args.reps):
            alone.append(per_batch(loader, None, args.batches))
            noted.append(per_batch(loader, note, args.batches))
        a, b = statistics.median(alone) * 1e6, statistics.median(noted) * 1e6
        print(f"| {name} | {a:.1f} | {b:.1f} | {b - a:.1f} | {b / a:.3f}x |")


if __name__ == "__main__":
    main()
