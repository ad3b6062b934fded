"""Soak run (only on request: `scripts/test.sh -m soak`): a longer job that fails
again and again, at random ranks, phases and kinds, and must still end bit-exact."""

from __future__ import annotations

import random

import pytest

from conftest import run_jit, reference_sha

pytestmark = [pytest.mark.soak, pytest.mark.timeout(2400)]  # the job alone may take 1200 s

STEPS = 120
FAILURES = 6


def test_many_random_failures_end_bit_exact(tmp_path):
    rng = random.Random(20261122)
    steps = sorted(rng.sample(range(3, STEPS - 3), FAILURES))
    faults = [
        f"rank={rng.randrange(4)},step={step},phase={rng.choice(['forward', 'backward', 'allreduce', 'optimizer'])},"
        f"kind={rng.choice(['kill', 'hang'])},attempt={attempt}"
        for attempt, step in enumerate(steps)
    ]
    args = ["--steps", str(STEPS)]
    baseline_sha = reference_sha(args=args)
    result = run_jit(tmp_path / "ckpt", fault=";".join(faults), max_restarts=FAILURES, args=args, timeout=1200)
    assert result.returncode == 0, result.output[-4000:]
    assert result.sha == baseline_sha, "; ".join(faults)
    assert result.report["restarts"] == FAILURES
    assert all(f["minibatches_redone"] == 1 for f in result.report["failures"]), result.report["failures"]
