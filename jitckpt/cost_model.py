"""Failure-cost model of periodic and just-in-time checkpointing.

This is the analysis of section 5 ("Failure Overhead Analysis") of Gupta et
al., "Just-In-Time Checkpointing: Low Cost Error Recovery from Deep Learning
Training Failures", EuroSys 2024, turned into code, plus a Monte-Carlo
simulator that draws actual failure histories under the same assumptions.

Notation and units (the paper's symbols):

* ``N`` - number of GPUs of the job.
* ``f`` - failure rate of *one* GPU.  The public functions take it in
  **failures per GPU per day** (the unit the paper quotes, e.g. 2e-3 for
  "2 failures per day on ~1000 GPUs"); it is converted to per second inside.
* ``o`` - cost of one checkpoint, seconds (all GPUs pause for it).
* ``r`` - fixed recovery cost per failure, seconds (restart, initialisation,
  restore of the checkpoint), paid by every GPU.
* ``m`` - minibatch (iteration) time, seconds.
* ``o_jit`` - steady-state overhead of JIT checkpointing (API interception /
  replay logging), dimensionless: seconds lost per second of training, i.e.
  the per-minibatch overhead divided by the minibatch time.
* ``c`` - periodic checkpoint frequency.  Internally per second; the
  ``*_per_hour`` functions report it per hour.

The "wasted time per unit time" ``w`` of every approach is dimensionless: the
wasted GPU time per GPU per second of *useful* training.  Equation 6 turns it
into the wasted fraction of the total run time, ``w / (1 + w)`` (the paper
writes ``W/(1+W)`` there, meaning this dimensionless ``w``).

Every function is pure and raises :class:`ValueError` on nonsense input
(non-finite, zero or negative rates and costs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional

import numpy as np

SECONDS_PER_HOUR = 3600.0
SECONDS_PER_DAY = 86400.0

__all__ = [
    "SECONDS_PER_HOUR",
    "SECONDS_PER_DAY",
    "failure_rate_per_second",
    "optimal_frequency_per_second",
    "optimal_frequency_per_hour",
    "wasted_time_per_unit_periodic",
    "wasted_time_per_unit_periodic_optimal",
    "wasted_fraction",
    "wasted_fraction_periodic",
    "wasted_time_per_unit_jit_user",
    "wasted_fraction_jit_user",
    "wasted_time_per_unit_jit_transparent",
    "wasted_fraction_jit_transparent",
    "PlanRow",
    "plan_row",
    "WasteDistribution",
    "MonteCarloResult",
    "simulate",
]


# --------------------------------------------------------------------------
# validation helpers
# --------------------------------------------------------------------------


def _checked_float(name: str, value: float, accept: Callable[[float], bool], expected: str) -> float:
    """Return ``value`` as a float if it is a finite number that ``accept`` allows, else raise ValueError."""
    try:
        number = float(value) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or not accept(number):
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return number


def _positive(name: str, value: float) -> float:
    """Return ``value`` as a float if it is finite and > 0, else raise ValueError."""
    return _checked_float(name, value, lambda x: x > 0.0, "a positive finite number")


def _fraction(name: str, value: float) -> float:
    """Return ``value`` as a float if 0 <= value < 1, else raise ValueError."""
    return _checked_float(name, value, lambda x: 0.0 <= x < 1.0, "a fraction in [0, 1)")


def _gpus(n_gpus: int) -> int:
    """Return ``n_gpus`` if it is a positive integer, else raise ValueError."""
    if isinstance(n_gpus, bool) or not isinstance(n_gpus, (int, np.integer)) or n_gpus <= 0:
        raise ValueError(f"number of GPUs must be a positive integer, got {n_gpus!r}")
    return int(n_gpus)


# --------------------------------------------------------------------------
# closed form (paper section 5)
# --------------------------------------------------------------------------


def failure_rate_per_second(failures_per_gpu_per_day: float) -> float:
    """Convert a per-GPU failure rate from failures/day to failures/second."""
    return _positive("failure rate", failures_per_gpu_per_day) / SECONDS_PER_DAY


def optimal_frequency_per_second(
    n_gpus: int, failures_per_gpu_per_day: float, checkpoint_cost_s: float
) -> float:
    """Optimal periodic checkpoint frequency c* = sqrt(N f / (2 o)), per second (eq. 3).

    It minimises eq. 1, ``W = N t (c o + N f r + N f / (2 c))``: the steady
    checkpointing cost ``c o`` against the work redone after a failure, on
    average half a checkpoint interval ``1 / (2 c)``.
    """
    n = _gpus(n_gpus)
    f = failure_rate_per_second(failures_per_gpu_per_day)
    o = _positive("checkpoint cost", checkpoint_cost_s)
    return math.sqrt(n * f / (2.0 * o))


def optimal_frequency_per_hour(
    n_gpus: int, failures_per_gpu_per_day: float, checkpoint_cost_s: float
) -> float:
    """Optimal periodic checkpoint frequency c* (eq. 3), in checkpoints per hour."""
    return optimal_frequency_per_second(n_gpus, failures_per_gpu_per_day, checkpoint_cost_s) * SECONDS_PER_HOUR


def wasted_time_per_unit_periodic(
    n_gpus: int,
    failures_per_gpu_per_day: float,
    checkpoint_cost_s: float,
    restore_cost_s: float,
    frequency_per_hour: Optional[float] = None,
) -> float:
    """Wasted GPU time per GPU per unit of useful time with periodic checkpointing (eq. 1 / (N t)).

    ``w = c o + N f r + N f / (2 c)``; ``frequency_per_hour`` is ``c`` (per
    hour) and defaults to the optimum c* of eq. 3, where this equals eq. 5.
    """
    n = _gpus(n_gpus)
    f = failure_rate_per_second(failures_per_gpu_per_day)
    o = _positive("checkpoint cost", checkpoint_cost_s)
    r = _positive("restore cost", restore_cost_s)
    if frequency_per_hour is None:
        c = optimal_frequency_per_second(n, failures_per_gpu_per_day, o)
    else:
        c = _positive("checkpoint frequency", frequency_per_hour) / SECONDS_PER_HOUR
    return c * o + n * f * r + n * f / (2.0 * c)


def wasted_time_per_unit_periodic_optimal(
    n_gpus: int, failures_per_gpu_per_day: float, checkpoint_cost_s: float, restore_cost_s: float
) -> float:
    """w* = 2 sqrt(N f o / 2) + N f r (eq. 5): periodic checkpointing at c*, dimensionless.

    The first sqrt term is the steady checkpointing overhead, the second the
    expected redone work (equal at the optimum), ``N f r`` the fixed recovery.
    """
    n = _gpus(n_gpus)
    f = failure_rate_per_second(failures_per_gpu_per_day)
    o = _positive("checkpoint cost", checkpoint_cost_s)
    r = _positive("restore cost", restore_cost_s)
    half = math.sqrt(n * f * o / 2.0)
    return half + n * f * r + half


def wasted_fraction(wasted_per_unit_time: float) -> float:
    """Eq. 6: wasted fraction of the total run time, w / (1 + w).

    ``wasted_per_unit_time`` is the dimensionless wasted time per GPU per unit
    of useful time; a run of useful length ``t`` takes ``t (1 + w)`` in total.
    """
    w = float(wasted_per_unit_time)
    if not math.isfinite(w) or w < 0.0:
        raise ValueError(f"wasted time per unit time must be finite and >= 0, got {wasted_per_unit_time!r}")
    return w / (1.0 + w)


def wasted_fraction_periodic(
    n_gpus: int, failures_per_gpu_per_day: float, checkpoint_cost_s: float, restore_cost_s: float
) -> float:
    """Wasted time fraction of periodic checkpointing at the optimal frequency c* (eqs. 5 and 6)."""
    return wasted_fraction(
        wasted_time_per_unit_periodic_optimal(n_gpus, failures_per_gpu_per_day, checkpoint_cost_s, restore_cost_s)
    )


def wasted_time_per_unit_jit_user(
    n_gpus: int,
    failures_per_gpu_per_day: float,
    checkpoint_cost_s: float,
    restore_cost_s: float,
    minibatch_s: float,
    jit_overhead: float = 0.0,
    checkpoint_stalls_job: bool = False,
) -> float:
    """User-level JIT checkpointing: ``w = f o + o_jit + N f r + N f m / 2`` (eq. 7 / (N t)).

    One checkpoint per failure instead of periodic ones, and only half a
    minibatch of work redone on average.

    ``checkpoint_stalls_job``: the paper's eq. 7 charges the on-failure
    checkpoint as ``f o`` per GPU per unit time (``o`` GPU-seconds per job
    failure in total).  If every GPU of the job waits while the JIT checkpoint
    is written - as it does for the restart - the term is ``N f o`` instead
    (``o`` seconds on each of the ``N`` GPUs per failure).  ``False`` (default)
    follows the paper.
    """
    n = _gpus(n_gpus)
    f = failure_rate_per_second(failures_per_gpu_per_day)
    o = _positive("checkpoint cost", checkpoint_cost_s)
    r = _positive("restore cost", restore_cost_s)
    m = _positive("minibatch time", minibatch_s)
    o_jit = _fraction("JIT overhead", jit_overhead)
    checkpoint_term = (n if checkpoint_stalls_job else 1) * f * o
    return checkpoint_term + o_jit + n * f * r + n * f * m / 2.0


def wasted_fraction_jit_user(
    n_gpus: int,
    failures_per_gpu_per_day: float,
    checkpoint_cost_s: float,
    restore_cost_s: float,
    minibatch_s: float,
    jit_overhead: float = 0.0,
    checkpoint_stalls_job: bool = False,
) -> float:
    """Wasted time fraction of user-level JIT checkpointing (eq. 7 turned into a fraction as in eq. 6)."""
    return wasted_fraction(
        wasted_time_per_unit_jit_user(
            n_gpus,
            failures_per_gpu_per_day,
            checkpoint_cost_s,
            restore_cost_s,
            minibatch_s,
            jit_overhead,
            checkpoint_stalls_job,
        )
    )


def wasted_time_per_unit_jit_transparent(
    n_gpus: int, failures_per_gpu_per_day: float, minibatch_s: float, jit_overhead: float = 0.0
) -> float:
    """Transparent JIT checkpointing, transient errors: ``w = o_jit + N f m / 2`` (eq. 8 / (N t)).

    The process is never restarted (no ``r``) and GPU state is reset in place
    (no checkpoint copy), so only the replayed partial minibatch is lost.
    """
    n = _gpus(n_gpus)
    f = failure_rate_per_second(failures_per_gpu_per_day)
    m = _positive("minibatch time", minibatch_s)
    o_jit = _fraction("transparent JIT overhead", jit_overhead)
    return o_jit + n * f * m / 2.0


def wasted_fraction_jit_transparent(
    n_gpus: int, failures_per_gpu_per_day: float, minibatch_s: float, jit_overhead: float = 0.0
) -> float:
    """Wasted time fraction of transparent JIT checkpointing (eq. 8 turned into a fraction as in eq. 6)."""
    return wasted_fraction(wasted_time_per_unit_jit_transparent(n_gpus, failures_per_gpu_per_day, minibatch_s, jit_overhead))


@dataclass(frozen=True)
class PlanRow:
    """Closed-form results for one job size (one line of ``jit-run plan``)."""

    gpus: int
    optimal_frequency_per_hour: float
    wasted_fraction_periodic: float
    wasted_fraction_jit_user: float
    wasted_fraction_jit_transparent: float

    @property
    def checkpoint_interval_s(self) -> float:
        """Seconds between periodic checkpoints at c*."""
        return SECONDS_PER_HOUR / self.optimal_frequency_per_hour

    def as_dict(self) -> dict[str, float | int]:
        """The row as the JSON object printed by ``jit-run plan --json``."""
        return {
            "gpus": self.gpus,
            "optimal_frequency_per_hour": self.optimal_frequency_per_hour,
            "wasted_fraction_periodic": self.wasted_fraction_periodic,
            "wasted_fraction_jit_user": self.wasted_fraction_jit_user,
            "wasted_fraction_jit_transparent": self.wasted_fraction_jit_transparent,
        }


def plan_row(
    n_gpus: int,
    failures_per_gpu_per_day: float,
    checkpoint_cost_s: float,
    restore_cost_s: float,
    minibatch_s: float,
    jit_overhead: float = 0.0,
    transparent_overhead: Optional[float] = None,
    checkpoint_stalls_job: bool = False,
) -> PlanRow:
    """Compute c* and the three wasted fractions for one job size.

    ``transparent_overhead`` defaults to ``jit_overhead``.
    """
    if transparent_overhead is None:
        transparent_overhead = jit_overhead
    return PlanRow(
        gpus=_gpus(n_gpus),
        optimal_frequency_per_hour=optimal_frequency_per_hour(n_gpus, failures_per_gpu_per_day, checkpoint_cost_s),
        wasted_fraction_periodic=wasted_fraction_periodic(
            n_gpus, failures_per_gpu_per_day, checkpoint_cost_s, restore_cost_s
        ),
        wasted_fraction_jit_user=wasted_fraction_jit_user(
            n_gpus,
            failures_per_gpu_per_day,
            checkpoint_cost_s,
            restore_cost_s,
            minibatch_s,
            jit_overhead,
            checkpoint_stalls_job,
        ),
        wasted_fraction_jit_transparent=wasted_fraction_jit_transparent(
            n_gpus, failures_per_gpu_per_day, minibatch_s, transparent_overhead
        ),
    )


# --------------------------------------------------------------------------
# Monte Carlo
# --------------------------------------------------------------------------

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


def _gap_sampler(rng: np.random.Generator, mean_gap_s: float, weibull_shape: Optional[float]):
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
    n = _gpus(n_gpus)
    f = failure_rate_per_second(failures_per_gpu_per_day)
    o = _positive("checkpoint cost", checkpoint_cost_s)
    r = _positive("restore cost", restore_cost_s)
    m = _positive("minibatch time", minibatch_s)
    horizon = _positive("training length (days)", days) * SECONDS_PER_DAY
    if isinstance(trials, bool) or not isinstance(trials, (int, np.integer)) or trials < 1:
        raise ValueError(f"trials must be a positive integer, got {trials!r}")
    if weibull_shape is not None:
        weibull_shape = _positive("Weibull shape", weibull_shape)
    o_user = _fraction("JIT overhead", jit_overhead)
    o_transparent = _fraction(
        "transparent JIT overhead", jit_overhead if transparent_overhead is None else transparent_overhead
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
