#!/usr/bin/env python3
"""What jitckpt does at each minibatch's start costs (data_position's forward notes, minibatch_gap's records).

Under jit-run, every minibatch's first training forward has its inputs
digested and noted in the rank's host stash (a resume from a step counter one
behind the checkpoint is refused: ``jitckpt/worker/data_position.py``), and
where the minibatch takes its data the RNG state is captured, compared with
the one stashed at the step before and stashed again
(``jitckpt/worker/minibatch_gap.py``: what was drawn between two minibatches).
This trains a small MLP in one process, the plain step and the step with
that work (the real classes, the real stash files), interleaved in rounds so
machine load hits both alike, and prints the median per-step time of each
and the difference.  The MLP step is about the cheapest there is, so the
ratio is an upper bound.

    python benchmarks/minibatch_start.py            # 7 rounds of 300 steps
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import types
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from jitckpt.worker import data_position, minibatch_gap, rng_state, stash  # noqa: E402


class _Runtime(types.SimpleNamespace):
    """The part of the JitRuntime the two classes use, with the real stash files."""

    def __init__(self, shm: Path) -> None:
        super().__init__(step=0, rank=0, resumed_from=None, located=True)
        self._stashes: dict[str, stash.StepStash] = {}
        self._rng = stash.StepStash(shm, stash.RNG, 0)
        self._by_step: dict[int, bytes] = {}
        self.shm = shm

    def stash_rank_state(self, kind: str, step: int, payload: bytes) -> None:
        if kind not in self._stashes:
            self._stashes[kind] = stash.StepStash(self.shm, kind, 0)
        self._stashes[kind].put(step, payload)

    def stash_rng(self, step: int, payload: bytes | None = None) -> None:
        payload = rng_state.capture() if payload is None else payload
        self._rng.put(step, payload)
        self._by_step = {s: p for s, p in self._by_step.items() if s >= self.step}
        self._by_step[step] = payload

    def rng_stashed_for(self, step: int) -> bytes | None:
        return self._by_step.get(step)


def steps(model: nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor, y: torch.Tensor, n: int,
          rt: _Runtime, new: bool) -> float:
    """Seconds per step of ``n`` steps, each stashing the next minibatch's RNG state as jit-run always has;
    with ``new``, also the minibatch-start work measured here."""
    notes = data_position.TakenBatches(rt) if new else None
    gap = minibatch_gap.MinibatchGap(rt) if new else None
    rt.gap = gap
    start = time.perf_counter()
    for _ in range(n):
        rt.stash_rng(rt.step + 1)  # (the optimizer pre-step hook's stash: in both)
        rt.step += 1
        if new:
            gap.minibatch_started()
            notes.minibatch_started()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    seconds = (time.perf_counter() - start) / n
    if notes is not None:
        notes._drop_hook()
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=300)
    args = p.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    plain, jit = [], []
    with tempfile.TemporaryDirectory() as shm:
        rt = _Runtime(Path(shm))
        steps(model, opt, x, y, 50, rt, True)  # (warm-up)
        for _ in range(args.rounds):
            plain.append(steps(model, opt, x, y, args.steps, rt, False))
            jit.append(steps(model, opt, x, y, args.steps, rt, True))
    a, b = statistics.median(plain), statistics.median(jit)
    print(f"torch {torch.__version__}, {args.rounds} interleaved rounds of {args.steps} steps, median per step")
    print(f"| step | ms | added us | ratio |")
    print(f"| --- | --- | --- | --- |")
    print(f"| MLP 64-128-1, batch 32, Adam, RNG stash per step | {a * 1e3:.3f} | | |")
    print(f"| ... and the minibatch-start notes and gap record | {b * 1e3:.3f} | {(b - a) * 1e6:+.1f} | {b / a:.3f} |")


if __name__ == "__main__":
    main()
