"""Monte-Carlo simulation of the failure-cost model: the spread of the wasted GPU-hours, not just the mean.

``simulate`` draws the failure histories of many runs (exponential or
Weibull times between failures, stationary), charges each approach of
:mod:`jitckpt.plan.cost_model` for them with the same per-failure terms as
the closed form, and returns a ``MonteCarloResult`` of three
``WasteDistribution``s, each with its closed-form mean beside it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

from jitckpt.plan.cost_model import (
    GPUS,
    SECONDS_PER_DAY,
    SECONDS_PER_HOUR,
    failure_rate_per_second,
    optimal_frequency_per_second,
    wasted_time_per_unit_jit_transparent,
    wasted_time_per_unit_jit_user,
    wasted_time_per_unit_periodic_optimal,
)
from jitckpt.validate import fraction, positive_int, positive_number

__all__ = ["WasteDistribution", "MonteCarloResult", "simulate"]

# Upper bound on the number of failure times held in memory at once (per array).
_MAX_CELLS = 2_000_000


@dataclass(frozen=True)
class WasteDistribution:
    """Simulated wasted GPU-hours of one approach over many runs, with its closed-form mean."""

    approach: str
    samples_gpu_hours: np.ndarray = field(repr=False)
    closed_form_gpu_hours: float

    @property
    def mean(self) -> float:
        """Sample mean of wasted GPU-hours."""
        return float(np.mean(self.samples_gpu_hours))

    @property
    def std(self) -> float:
        """Sample standard deviation (ddof=1) of wasted GPU-hours."""
        if self.samples_gpu_hours.size < 2:
            return 0.0
        return float(np.std(self.samples_gpu_hours, ddof=1))

    @property
    def standard_error(self) -> float:
        """Standard error of :attr:`mean`."""
        return self.std / math.sqrt(self.samples_gpu_hours.size)

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0-100) of wasted GPU-hours."""
        return float(np.percentile(self.samples_gpu_hours, q))

    def summary(self) -> dict[str, float]:
        """Mean, std, min, p50, p90, p99, max and the closed-form expectation, in GPU-hours."""
        return {
            "closed_form": self.closed_form_gpu_hours,
            "mean": self.mean,
            "std": self.std,
            "min": float(np.min(self.samples_gpu_hours)),
            "p50": self.percentile(50),
            "p90": self.percentile(90),
            "p99": self.percentile(99),
            "max": float(np.max(self.samples_gpu_hours)),
        }


@dataclass(frozen=True)
class MonteCarloResult:
    """Outcome of :func:`simulate` for one job size."""

    gpus: int
    days: float
    trials: int
    weibull_shape: Optional[float]
    seed: Optional[int]
    checkpoint_interval_s: float
    failures: np.ndarray = field(repr=False)
    periodic: WasteDistribution
    jit_user: WasteDistribution
    jit_transparent: WasteDistribution

    @property
    def approaches(self) -> tuple[WasteDistribution, WasteDistribution, WasteDistribution]:
        """The three distributions, periodic first."""
        return (self.periodic, self.jit_user, self.jit_transparent)

    def as_dict(self) -> dict[str, object]:
        """JSON-friendly summary (no raw samples)."""
        return {
            "gpus": self.gpus,
            "days": self.days,
            "trials": self.trials,
            "weibull_shape": self.weibull_shape,
            "seed": self.seed,
            "checkpoint_interval_seconds": self.checkpoint_interval_s,
            "mean_failures": float(np.mean(self.failures)),
            "wasted_gpu_hours": {d.approach: d.summary() for d in self.approaches},
        }


#: Draws an array of the given shape (gaps between failures, seconds).
Sampler = Callable[[tuple[int, ...]], np.ndarray]


def _gap_sampler(
    rng: np.random.Generator, mean_gap_s: float, weibull_shape: Optional[float]
) -> tuple[Sampler, Callable[[int], np.ndarray]]:
    """Return (draw_gaps(shape), draw_first(n)) for a stationary renewal process with mean gap ``mean_gap_s``.

    Exponential gaps when ``weibull_shape`` is None, else Weibull gaps with
    that shape k and scale ``mean_gap_s / Gamma(1 + 1/k)`` so the mean matches.
    The first arrival is drawn from the equilibrium (forward-recurrence)
    distribution, so the process is stationary: the job starts at a random
    moment of the cluster's failure history, and the expected number of
    failures in any window of length L is exactly ``L / mean_gap_s``.
    """
    if weibull_shape is None:

        def gaps(size: tuple[int, ...]) -> np.ndarray:
            return rng.exponential(mean_gap_s, size)

        def first(n: int) -> np.ndarray:
            return rng.exponential(mean_gap_s, n)  # memoryless: same law

        return gaps, first

    k = weibull_shape
    scale = mean_gap_s / math.gamma(1.0 + 1.0 / k)

    def weibull_gaps(size: tuple[int, ...]) -> np.ndarray:
        return scale * rng.weibull(k, size)

    def weibull_first(n: int) -> np.ndarray:
        # Forward recurrence time = U * X where X is length-biased Weibull.
        # With y = (x/scale)^k, the length-biased density x f(x)/mean becomes
        # Gamma(1 + 1/k, 1) in y, hence X = scale * Y^(1/k).
        y = rng.gamma(1.0 + 1.0 / k, 1.0, n)
        return rng.random(n) * scale * y ** (1.0 / k)

    return weibull_gaps, weibull_first


def _failure_times(
    rng: np.random.Generator, trials: int, horizon_s: float, mean_gap_s: float, weibull_shape: Optional[float]
) -> np.ndarray:
    """Failure times of ``trials`` independent runs as a (trials, K) array of increasing times.

    Every row extends past ``horizon_s``; entries beyond it are not failures
    of the run and must be masked by the caller.
    """
    gaps, first = _gap_sampler(rng, mean_gap_s, weibull_shape)
    expected = horizon_s / mean_gap_s
    if weibull_shape is None:
        cv2 = 1.0
    else:
        k = weibull_shape
        cv2 = math.exp(math.lgamma(1.0 + 2.0 / k) - 2.0 * math.lgamma(1.0 + 1.0 / k)) - 1.0
    block = int(math.ceil(expected + 6.0 * math.sqrt(max(expected, 1.0) * min(max(cv2, 1.0), 25.0)) + 8.0))
    times = np.empty((trials, block))
    times[:, 0] = first(trials)
    times[:, 1:] = gaps((trials, block - 1))
    np.cumsum(times, axis=1, out=times)
    while bool(np.any(times[:, -1] <= horizon_s)):
        extra = gaps((trials, block))
        np.cumsum(extra, axis=1, out=extra)
        extra += times[:, -1:]
        times = np.concatenate([times, extra], axis=1)
    return times


def simulate(
    n_gpus: int,
    failures_per_gpu_per_day: float,
    checkpoint_cost_s: float,
    restore_cost_s: float,
    minibatch_s: float,
    days: float,
    trials: int = 2000,
    weibull_shape: Optional[float] = None,
    seed: Optional[int] = 0,
    jit_overhead: float = 0.0,
    transparent_overhead: Optional[float] = None,
    checkpoint_stalls_job: bool = False,
) -> MonteCarloResult:
    """Simulate ``trials`` runs of ``days`` days of *useful* training on ``n_gpus`` GPUs.

    Failures of the job form a stationary renewal process with mean rate
    ``N f`` (exponential inter-arrival times, or Weibull with shape
    ``weibull_shape`` scaled to the same mean), indexed by useful training
    time as in the paper's section 5.  Every run uses the same failure
    history for the three approaches (common random numbers):

    * periodic at c*: checkpoints every ``tau = 1/c*`` seconds of useful work
      (``floor(L / tau)`` of them, ``N o`` GPU-seconds each); a failure at
      useful time ``t`` costs ``N (r + (t mod tau))`` GPU-seconds.
    * user-level JIT: ``N L o_jit`` steady overhead; a failure costs
      ``o + N r + N (t mod m)`` GPU-seconds (``N o + ...`` with
      ``checkpoint_stalls_job``), the per-failure terms of eq. 7.
    * transparent JIT: ``N L o_jit`` steady overhead; a failure costs
      ``N (t mod m)`` GPU-seconds (eq. 8).

    Like the closed form, failures during checkpointing or recovery are not
    modelled (first-order model).  Returns wasted GPU-hours per run.
    """
    n = positive_int(n_gpus, GPUS)
    f = failure_rate_per_second(failures_per_gpu_per_day)
    o = positive_number(checkpoint_cost_s, "checkpoint cost")
    r = positive_number(restore_cost_s, "restore cost")
    m = positive_number(minibatch_s, "minibatch time")
    horizon = positive_number(days, "training length (days)") * SECONDS_PER_DAY
    trials = positive_int(trials, "trials")
    if weibull_shape is not None:
        weibull_shape = positive_number(weibull_shape, "Weibull shape")
    o_user = fraction(jit_overhead, "JIT overhead")
    o_transparent = fraction(
        jit_overhead if transparent_overhead is None else transparent_overhead, "transparent JIT overhead"
    )

    tau = 1.0 / optimal_frequency_per_second(n, failures_per_gpu_per_day, o)
    mean_gap = 1.0 / (n * f)
    rng = np.random.default_rng(seed)

    failures = np.empty(trials, dtype=np.int64)
    sum_mod_tau = np.empty(trials)
    sum_mod_m = np.empty(trials)
    expected = horizon / mean_gap
    per_row = int(expected + 6.0 * math.sqrt(expected + 1.0) + 8.0)
    chunk = max(1, _MAX_CELLS // max(per_row, 1))
    for start in range(0, trials, chunk):
        stop = min(trials, start + chunk)
        times = _failure_times(rng, stop - start, horizon, mean_gap, weibull_shape)
        inside = times <= horizon
        failures[start:stop] = inside.sum(axis=1)
        sum_mod_tau[start:stop] = np.where(inside, np.mod(times, tau), 0.0).sum(axis=1)
        sum_mod_m[start:stop] = np.where(inside, np.mod(times, m), 0.0).sum(axis=1)

    n_checkpoints = math.floor(horizon / tau)
    periodic_s = n * o * n_checkpoints + n * (r * failures + sum_mod_tau)
    jit_o_per_failure = (n if checkpoint_stalls_job else 1) * o
    user_s = n * horizon * o_user + (jit_o_per_failure + n * r) * failures + n * sum_mod_m
    transparent_s = n * horizon * o_transparent + n * sum_mod_m

    def closed(w: float) -> float:
        return n * horizon * w / SECONDS_PER_HOUR

    w_periodic = wasted_time_per_unit_periodic_optimal(n, failures_per_gpu_per_day, o, r)
    w_user = wasted_time_per_unit_jit_user(n, failures_per_gpu_per_day, o, r, m, o_user, checkpoint_stalls_job)
    w_transparent = wasted_time_per_unit_jit_transparent(n, failures_per_gpu_per_day, m, o_transparent)
    return MonteCarloResult(
        gpus=n,
        days=float(days),
        trials=int(trials),
        weibull_shape=weibull_shape,
        seed=seed,
        checkpoint_interval_s=tau,
        failures=failures,
        periodic=WasteDistribution("periodic", periodic_s / SECONDS_PER_HOUR, closed(w_periodic)),
        jit_user=WasteDistribution("jit_user", user_s / SECONDS_PER_HOUR, closed(w_user)),
        jit_transparent=WasteDistribution("jit_transparent", transparent_s / SECONDS_PER_HOUR, closed(w_transparent)),
    )
