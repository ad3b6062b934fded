"""Closed-form failure-cost model of periodic and just-in-time checkpointing.

This is the analysis of section 5 ("Failure Overhead Analysis") of Gupta et
al., "Just-In-Time Checkpointing: Low Cost Error Recovery from Deep Learning
Training Failures", EuroSys 2024, turned into code: the optimal periodic
checkpoint frequency c* and the wasted time of each approach, and
``plan_row``, one line of ``jit-run plan``.  ``jitckpt.plan.monte_carlo``
draws actual failure histories under the same assumptions.

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
(non-finite, zero or negative rates and costs), with the message of
:mod:`jitckpt.validate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from jitckpt.validate import check_number, fraction, positive_int, positive_number, share

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
    "wasted_time_per_unit_sharded_memory_tier",
    "backstop_frequency_per_hour",
    "PlanRow",
    "plan_row",
]

#: What the number of GPUs is called in error messages.
GPUS = "number of GPUs"


def failure_rate_per_second(failures_per_gpu_per_day: float) -> float:
    """Convert a per-GPU failure rate from failures/day to failures/second."""
    return positive_number(failures_per_gpu_per_day, "failure rate") / SECONDS_PER_DAY


def optimal_frequency_per_second(
    n_gpus: int, failures_per_gpu_per_day: float, checkpoint_cost_s: float
) -> float:
    """Optimal periodic checkpoint frequency c* = sqrt(N f / (2 o)), per second (eq. 3).

    It minimises eq. 1, ``W = N t (c o + N f r + N f / (2 c))``: the steady
    checkpointing cost ``c o`` against the work redone after a failure, on
    average half a checkpoint interval ``1 / (2 c)``.
    """
    n = positive_int(n_gpus, GPUS)
    f = failure_rate_per_second(failures_per_gpu_per_day)
    o = positive_number(checkpoint_cost_s, "checkpoint cost")
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
    n = positive_int(n_gpus, GPUS)
    f = failure_rate_per_second(failures_per_gpu_per_day)
    o = positive_number(checkpoint_cost_s, "checkpoint cost")
    r = positive_number(restore_cost_s, "restore cost")
    if frequency_per_hour is None:
        c = optimal_frequency_per_second(n, failures_per_gpu_per_day, o)
    else:
        c = positive_number(frequency_per_hour, "checkpoint frequency") / SECONDS_PER_HOUR
    return c * o + n * f * r + n * f / (2.0 * c)


def wasted_time_per_unit_periodic_optimal(
    n_gpus: int, failures_per_gpu_per_day: float, checkpoint_cost_s: float, restore_cost_s: float
) -> float:
    """w* = 2 sqrt(N f o / 2) + N f r (eq. 5): periodic checkpointing at c*, dimensionless.

    The first sqrt term is the steady checkpointing overhead, the second the
    expected redone work (equal at the optimum), ``N f r`` the fixed recovery.
    """
    n = positive_int(n_gpus, GPUS)
    f = failure_rate_per_second(failures_per_gpu_per_day)
    o = positive_number(checkpoint_cost_s, "checkpoint cost")
    r = positive_number(restore_cost_s, "restore cost")
    half = math.sqrt(n * f * o / 2.0)
    return half + n * f * r + half


def wasted_fraction(wasted_per_unit_time: float) -> float:
    """Eq. 6: wasted fraction of the total run time, w / (1 + w).

    ``wasted_per_unit_time`` is the dimensionless wasted time per GPU per unit
    of useful time; a run of useful length ``t`` takes ``t (1 + w)`` in total.
    """
    w = check_number(wasted_per_unit_time, "wasted time per unit time", at_least=0)
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
    n = positive_int(n_gpus, GPUS)
    f = failure_rate_per_second(failures_per_gpu_per_day)
    o = positive_number(checkpoint_cost_s, "checkpoint cost")
    r = positive_number(restore_cost_s, "restore cost")
    m = positive_number(minibatch_s, "minibatch time")
    o_jit = fraction(jit_overhead, "JIT overhead")
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
    n = positive_int(n_gpus, GPUS)
    f = failure_rate_per_second(failures_per_gpu_per_day)
    m = positive_number(minibatch_s, "minibatch time")
    o_jit = fraction(jit_overhead, "transparent JIT overhead")
    return o_jit + n * f * m / 2.0


def wasted_fraction_jit_transparent(
    n_gpus: int, failures_per_gpu_per_day: float, minibatch_s: float, jit_overhead: float = 0.0
) -> float:
    """Wasted time fraction of transparent JIT checkpointing (eq. 8 turned into a fraction as in eq. 6)."""
    return wasted_fraction(wasted_time_per_unit_jit_transparent(n_gpus, failures_per_gpu_per_day, minibatch_s, jit_overhead))


def wasted_time_per_unit_sharded_memory_tier(
    n_gpus: int,
    failures_per_gpu_per_day: float,
    checkpoint_cost_s: float,
    restore_cost_s: float,
    minibatch_s: float,
    snapshot_overhead: float,
    unprotected_fraction: float,
    jit_overhead: float = 0.0,
) -> float:
    """A sharded job (no replica of its state) with the memory tier, periodic checkpoints as its backstop.

    Without the tier a sharded job gains nothing from JIT: a lost rank's shard
    has no copy, every failure falls back to the newest periodic checkpoint,
    and the waste is periodic checkpointing's.  With the tier, the share
    ``1 - h`` of failures it survives costs what a JIT failure costs (the JIT
    save ``f o``, the restart ``N f r``, half a minibatch redone ``N f m / 2``);
    the share ``h`` beyond it (more losses than its scheme tolerates; with
    snapshots on the rank's own host only, a lost host) falls back to a
    periodic checkpoint: ``N f h (r + 1 / (2 c))``, with ``c o`` to write them.
    At the backstop's optimum ``c = sqrt(N f h / (2 o))`` those two terms sum
    to ``sqrt(2 N f h o)``.  The snapshots cost ``o_snap`` (their seconds per
    minibatch over the minibatch's) all the time::

        w = o_snap + o_jit + (1 - h) f o + N f r + N f (1 - h) m / 2 + sqrt(2 N f h o)
    """
    n = positive_int(n_gpus, GPUS)
    f = failure_rate_per_second(failures_per_gpu_per_day)
    o = positive_number(checkpoint_cost_s, "checkpoint cost")
    r = positive_number(restore_cost_s, "restore cost")
    m = positive_number(minibatch_s, "minibatch time")
    o_snap = fraction(snapshot_overhead, "snapshot overhead")
    h = share(unprotected_fraction, "unprotected fraction")
    o_jit = fraction(jit_overhead, "JIT overhead")
    return o_snap + o_jit + (1.0 - h) * f * o + n * f * r + n * f * (1.0 - h) * m / 2.0 + math.sqrt(2.0 * n * f * h * o)


def backstop_frequency_per_hour(n_gpus: int, failures_per_gpu_per_day: float, checkpoint_cost_s: float,
                                unprotected_fraction: float) -> float:
    """The periodic backstop's optimal frequency beside the memory tier, ``sqrt(N f h / (2 o))`` per hour
    (0 when the tier survives every failure, ``h = 0``)."""
    h = share(unprotected_fraction, "unprotected fraction")
    return math.sqrt(h) * optimal_frequency_per_hour(n_gpus, failures_per_gpu_per_day, checkpoint_cost_s)


@dataclass(frozen=True)
class PlanRow:
    """Closed-form results for one job size (one line of ``jit-run plan``)."""

    gpus: int
    optimal_frequency_per_hour: float
    wasted_fraction_periodic: float
    wasted_fraction_jit_user: float
    wasted_fraction_jit_transparent: float
    # A sharded job with the memory tier (None unless asked for): its wasted fraction and its backstop's c.
    wasted_fraction_sharded_memory_tier: Optional[float] = None
    backstop_frequency_per_hour: Optional[float] = None

    @property
    def checkpoint_interval_s(self) -> float:
        """Seconds between periodic checkpoints at c*."""
        return SECONDS_PER_HOUR / self.optimal_frequency_per_hour

    def as_dict(self) -> dict[str, float | int]:
        """The row as the JSON object printed by ``jit-run plan --json``."""
        row: dict[str, float | int] = {
            "gpus": self.gpus,
            "optimal_frequency_per_hour": self.optimal_frequency_per_hour,
            "wasted_fraction_periodic": self.wasted_fraction_periodic,
            "wasted_fraction_jit_user": self.wasted_fraction_jit_user,
            "wasted_fraction_jit_transparent": self.wasted_fraction_jit_transparent,
        }
        if self.wasted_fraction_sharded_memory_tier is not None and self.backstop_frequency_per_hour is not None:
            row["wasted_fraction_sharded_memory_tier"] = self.wasted_fraction_sharded_memory_tier
            row["backstop_frequency_per_hour"] = self.backstop_frequency_per_hour
        return row


def plan_row(
    n_gpus: int,
    failures_per_gpu_per_day: float,
    checkpoint_cost_s: float,
    restore_cost_s: float,
    minibatch_s: float,
    jit_overhead: float = 0.0,
    transparent_overhead: Optional[float] = None,
    checkpoint_stalls_job: bool = False,
    sharded: Optional[tuple[float, float]] = None,
) -> PlanRow:
    """Compute c* and the three wasted fractions for one job size.

    ``transparent_overhead`` defaults to ``jit_overhead``.  ``sharded``:
    (snapshot overhead, unprotected fraction) of a sharded job's memory tier,
    which adds its wasted fraction and its backstop's frequency.
    """
    memory_tier = None
    if sharded is not None:
        snapshot_overhead, unprotected = sharded
        memory_tier = (
            wasted_fraction(wasted_time_per_unit_sharded_memory_tier(
                n_gpus, failures_per_gpu_per_day, checkpoint_cost_s, restore_cost_s, minibatch_s,
                snapshot_overhead, unprotected, jit_overhead)),
            backstop_frequency_per_hour(n_gpus, failures_per_gpu_per_day, checkpoint_cost_s, unprotected),
        )
    if transparent_overhead is None:
        transparent_overhead = jit_overhead
    return PlanRow(
        gpus=positive_int(n_gpus, GPUS),
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
        wasted_fraction_sharded_memory_tier=None if memory_tier is None else memory_tier[0],
        backstop_frequency_per_hour=None if memory_tier is None else memory_tier[1],
    )
