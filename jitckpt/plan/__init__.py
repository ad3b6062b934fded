"""`jit-run plan`: what do failures cost, with periodic vs just-in-time checkpointing?

Evaluates the failure-cost model of the JIT-checkpointing paper (Gupta et
al., EuroSys'24, section 5) for one or more job sizes, and optionally
simulates the spread of the wasted GPU-hours with Monte Carlo.

Exit status of `jit-run plan`: 0 on success, 2 on bad usage or input
(argparse style, one line on stderr), 1 when the run itself fails (e.g.
``--plot`` without matplotlib, or the picture cannot be written).

The modules, each importing only those below it:

* ``cli``         -- the argument parser, the tables, the plot and ``main(argv, out)``;
* ``monte_carlo`` -- the simulation: ``simulate``, ``MonteCarloResult``, ``WasteDistribution``;
* ``cost_model``  -- the closed-form formulas (c*, wasted time of each approach) and ``plan_row``.

Numbers are checked by :mod:`jitckpt.validate`, the project's one validator.
"""

from jitckpt.plan import cost_model, monte_carlo
from jitckpt.plan.cli import main
from jitckpt.plan.cost_model import (
    SECONDS_PER_DAY,
    SECONDS_PER_HOUR,
    PlanRow,
    failure_rate_per_second,
    optimal_frequency_per_hour,
    optimal_frequency_per_second,
    plan_row,
    wasted_fraction,
    wasted_fraction_jit_transparent,
    wasted_fraction_jit_user,
    wasted_fraction_periodic,
    wasted_time_per_unit_jit_transparent,
    wasted_time_per_unit_jit_user,
    wasted_time_per_unit_periodic,
    wasted_time_per_unit_periodic_optimal,
)
from jitckpt.plan.monte_carlo import MonteCarloResult, WasteDistribution, simulate

__all__ = ["main", "cost_model", "monte_carlo", *cost_model.__all__, *monte_carlo.__all__]
