#!/usr/bin/env python3
"""What capturing the script's own generators costs (jitckpt/worker/private_rng.py), per RNG capture.

Under jit-run, the RNG state the next minibatch starts with is captured at
every collective and optimizer pre-step (``rng_state.capture``), and the
generators the script made itself (``torch.Generator``, ``random.Random``,
``numpy.random.default_rng``) ride in it.  This prints the time of one
capture with none of them, with one of each kind, and with all three, when
nothing was drawn since the last capture and when each was drawn from (the
draws' own time subtracted), interleaved (one round of each case, then the
next round) so machine load hits all alike.  Median of --reps rounds.

    python benchmarks/own_generators.py          # 7 rounds of 2000 captures per case
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jitckpt.worker import private_rng, rng_state  # noqa: E402

private_rng.install()
_keep: dict[str, Any] = {}  # the generators of the case being timed (the registry only holds weak references)


def make(kinds: tuple[str, ...]) -> list[Callable[[], Any]]:
    """Make one generator per kind (from this file, so they are tracked); return a draw from each."""
    _keep.clear()
    draws: list[Callable[[], Any]] = []
    if "torch" in kinds:
        _keep["torch"] = torch.Generator().manual_seed(1)
        draws.append(lambda: torch.rand(1, generator=_keep["torch"]))
    if "random" in kinds:
        _keep["random"] = random.Random(2)
        draws.append(lambda: _keep["random"].random())
    if "numpy" in kinds:
        _keep["numpy"] = numpy.random.default_rng(3)
        draws.append(lambda: _keep["numpy"].random())
    return draws


def per_capture(draws: list[Callable[[], Any]], moved: bool, n: int) -> float:
    """Microseconds per capture (with ``moved``: each generator drawn from before it, the draws' time taken off)."""
    start = time.perf_counter()
    for _ in range(n):
        if moved:
            for draw in draws:
                draw()
        rng_state.capture()
    total = time.perf_counter() - start
    if moved:
        start = time.perf_counter()
        for _ in range(n):
            for draw in draws:
                draw()
        total -= time.perf_counter() - start
    return total / n * 1e6


CASES = {
    "none of the script's own": (),
    "one torch.Generator": ("torch",),
    "one random.Random": ("random",),
    "one numpy default_rng": ("numpy",),
    "one of each": ("torch", "random", "numpy"),
}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--captures", type=int, default=2000)
    args = p.parse_args()
    times: dict[tuple[str, bool], list[float]] = {(case, moved): [] for case in CASES for moved in (False, True)}
    for _ in range(args.reps):
        for case, kinds in CASES.items():
            draws = make(kinds)
            for moved in (False, True):
                times[(case, moved)].append(per_capture(draws, moved, args.captures))
    base = {moved: statistics.median(times[("none of the script's own", moved)]) for moved in (False, True)}
    print(f"torch {torch.__version__}, numpy {numpy.__version__}, {args.reps} rounds of {args.captures} captures, medians")
    print("| generators | capture, nothing drawn (us) | added (us) | capture, each drawn from (us) | added (us) |")
    print("| --- | --- | --- | --- | --- |")
    for case in CASES:
        still, moved = statistics.median(times[(case, False)]), statistics.median(times[(case, True)])
        print(f"| {case} | {still:.1f} | {still - base[False]:.1f} | {moved:.1f} | {moved - base[True]:.1f} |")


if __name__ == "__main__":
    main()
