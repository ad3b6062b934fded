"""`jit-run plan`'s command line: the argument parser, the tables, the plot and ``main(argv, out)``.

Evaluates the failure-cost model (:mod:`jitckpt.plan.cost_model`) for one or
more job sizes, and optionally simulates the spread of the wasted GPU-hours
(:mod:`jitckpt.plan.monte_carlo`).  Every number given on the command line
is checked by :mod:`jitckpt.validate`.

Exit status: 0 on success, 2 on bad usage or input (argparse style, one line
on stderr), 1 when the run itself fails (e.g. ``--plot`` without matplotlib,
or the picture cannot be written).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional, Sequence, TextIO

from jitckpt.plan.cost_model import SECONDS_PER_HOUR, PlanRow, plan_row
from jitckpt.plan.monte_carlo import MonteCarloResult, simulate
from jitckpt.validate import argparse_type, fraction, non_negative_int, positive_int, positive_number, share

PROG = "jit-run plan"

# Recovery-report keys (written by `jit-run`) -> (our flag, human name).
_REPORT_FIELDS: dict[str, tuple[str, str]] = {
    "checkpoint_cost": ("checkpoint_cost_seconds", "--checkpoint-cost"),
    "restore_cost": ("restore_cost_seconds", "--restore-cost"),
    "minibatch": ("minibatch_seconds", "--minibatch"),
}


class _UsageError(Exception):
    """Bad input detected after argument parsing; reported via parser.error (exit 2)."""


# --------------------------------------------------------------------------
# argument types
# --------------------------------------------------------------------------


def _gpu_list(text: str) -> list[int]:
    """``--gpus``: a comma-separated list of whole numbers > 0, such as ``8,1024``."""
    parts = [part.strip() for part in text.split(",")]
    if not text.strip() or any(not part for part in parts):
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated list of GPU counts such as 8,1024, got {text!r}"
        )
    where = f" (in {text!r})" if len(parts) > 1 else ""
    try:
        return [positive_int(part, "each GPU count") for part in parts]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}{where}") from None

_fraction = argparse_type(fraction)


def _overhead(text: str) -> float:
    """``--jit-overhead``, ``--transparent-overhead``: a fraction of the training time, not a percentage."""
    try:
        return _fraction(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (a fraction: 0.001 for 0.1%)") from None


def _build_parser() -> argparse.ArgumentParser:
    """The argument parser of `jit-run plan`."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=(
            "Estimate the GPU time lost to failures with periodic checkpointing at its optimal\n"
            "frequency c* versus user-level and transparent just-in-time (JIT) checkpointing,\n"
            "using the failure-cost model of the JIT-checkpointing paper (EuroSys'24, sec. 5).\n"
            "Wasted fractions are wasted time / total run time (eq. 6)."
        ),
        epilog=(
            "examples:\n"
            "  jit-run plan --gpus 4,1024,8192 --checkpoint-cost 5 --restore-cost 9.9 \\\n"
            "               --minibatch 0.418 --failure-rate 0.002\n"
            "  jit-run plan --from-report jit-report.json --gpus 1024 --failure-rate 0.002 --json\n"
            "  jit-run plan --gpus 1024 --checkpoint-cost 5 --restore-cost 9.9 --minibatch 0.418 \\\n"
            "               --failure-rate 0.002 --monte-carlo --days 30 --plot waste.png\n"
            "\n"
            "exit status: 0 ok, 2 bad usage or input, 1 run failed (e.g. --plot without matplotlib)"
        ),
    )
    model = parser.add_argument_group("job and cluster")
    model.add_argument(
        "--gpus",
        required=True,
        type=_gpu_list,
        metavar="N[,N...]",
        help="job size(s) to evaluate, comma-separated number(s) of GPUs",
    )
    model.add_argument(
        "--checkpoint-cost",
        type=argparse_type(positive_number),
        metavar="S",
        help="seconds every GPU pauses to write one checkpoint (o)",
    )
    model.add_argument(
        "--restore-cost",
        type=argparse_type(positive_number),
        metavar="S",
        help="fixed seconds per failure to restart, initialise and restore a checkpoint (r)",
    )
    model.add_argument(
        "--minibatch",
        type=argparse_type(positive_number),
        metavar="S",
        help="seconds per training iteration (m)",
    )
    model.add_argument(
        "--failure-rate",
        required=True,
        type=argparse_type(positive_number),
        metavar="F",
        help="failures per GPU per day (f); e.g. 0.002 = 2 failures/day on 1000 GPUs",
    )
    model.add_argument(
        "--jit-overhead",
        type=_overhead,
        default=0.0,
        metavar="FRACTION",
        help="steady-state slowdown of JIT checkpointing as a fraction of training time "
        "(per-minibatch overhead seconds / minibatch seconds; 0.001 = 0.1%%); default 0",
    )
    model.add_argument(
        "--transparent-overhead",
        type=_overhead,
        default=None,
        metavar="FRACTION",
        help="steady-state slowdown of transparent JIT, if different from --jit-overhead",
    )
    model.add_argument(
        "--jit-checkpoint-stalls-job",
        action="store_true",
        help="charge the on-failure JIT checkpoint to all N GPUs (N*f*o) instead of the "
        "paper's eq. 7 term f*o; a more conservative user-level JIT estimate",
    )
    model.add_argument(
        "--from-report",
        metavar="REPORT.json",
        help="take --checkpoint-cost, --restore-cost and --minibatch from the 'summary' of a "
        "recovery report written by jit-run (flags given explicitly win)",
    )
    model.add_argument("--json", action="store_true", help="print JSON instead of a table")

    sharded = parser.add_argument_group(
        "sharded jobs (FSDP2, ZeRO: no replica of a rank's state)",
        "a lost rank's shard has no copy for a JIT save: without the memory tier every failure falls\n"
        "back to a periodic checkpoint (the periodic column); with it, the failures it survives cost\n"
        "what a JIT failure costs and the rest fall back to a periodic backstop at its own optimum",
    )
    sharded.add_argument(
        "--snapshot-overhead",
        type=_overhead,
        default=None,
        metavar="FRACTION",
        help="the memory tier's steady-state cost: seconds of one snapshot per minibatch over the minibatch's "
        "seconds (printed by jit-run, measured by benchmarks/memory_tier.py); adds the column",
    )
    sharded.add_argument(
        "--unprotected-fraction",
        type=argparse_type(share),
        default=None,
        metavar="H",
        help="share of failures beyond the tier's tolerance (required with --snapshot-overhead): with one "
        "copy of every snapshot on the next host of a ring, the share of failures that take two "
        "neighbouring hosts at once; with xor, two hosts of one group (or its parity's host); with rs k+m, "
        "more than m hosts of one group of k+m (single-node job: that take its host)",
    )

    mc = parser.add_argument_group(
        "Monte Carlo",
        "simulate many runs of a fixed length of useful training and report the spread of\n"
        "the wasted GPU-hours (same failure history for all approaches in each run)",
    )
    mc.add_argument("--monte-carlo", action="store_true", help="run the Monte-Carlo simulation")
    mc.add_argument(
        "--days",
        type=argparse_type(positive_number),
        metavar="D",
        help="useful training length per run, in days (required with --monte-carlo)",
    )
    mc.add_argument(
        "--trials",
        type=argparse_type(positive_int),
        default=2000,
        metavar="T",
        help="number of simulated runs (default 2000)",
    )
    mc.add_argument(
        "--weibull-shape",
        type=argparse_type(positive_number),
        default=None,
        metavar="K",
        help="Weibull shape of the times between job failures, scaled to the same mean rate "
        "(K<1: bursty, K=1: exponential, K>1: regular); default exponential",
    )
    mc.add_argument(
        "--seed",
        type=argparse_type(non_negative_int),
        default=0,
        metavar="S",
        help="random seed (default 0; same seed, same result)",
    )
    mc.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also write the distributions (cumulative, log scale) as a PNG; needs matplotlib",
    )
    return parser


# --------------------------------------------------------------------------
# report handling
# --------------------------------------------------------------------------


def _load_report(path: str) -> dict[str, Any]:
    """Return the 'summary' object of a recovery report, or raise _UsageError."""
    try:
        with open(path, encoding="utf-8") as handle:
            report = json.load(handle)
    except FileNotFoundError:
        raise _UsageError(f"--from-report: no such file: {path}") from None
    except OSError as exc:
        raise _UsageError(f"--from-report: cannot read {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _UsageError(f"--from-report: {path} is not valid JSON ({exc})") from None
    if not isinstance(report, dict) or not isinstance(report.get("summary"), dict):
        raise _UsageError(f"--from-report: {path} has no 'summary' object; is it a jit-run recovery report?")
    return report["summary"]


def _resolve_costs(args: argparse.Namespace) -> None:
    """Fill checkpoint_cost / restore_cost / minibatch from the report where no flag was given."""
    summary = _load_report(args.from_report) if args.from_report else None
    for attr, (key, flag) in _REPORT_FIELDS.items():
        if getattr(args, attr) is not None:
            continue
        value = None if summary is None else summary.get(key)
        if value is None:
            if summary is None:
                raise _UsageError(f"missing {flag} S (or take it from a report with --from-report REPORT.json)")
            raise _UsageError(
                f"{args.from_report} does not contain a measured summary.{key}; pass {flag} S"
            )
        what = f"{args.from_report}: summary.{key}"
        try:
            if isinstance(value, str):  # JSON text is not a measurement, even when it reads as one
                raise ValueError(f"{what} must be a JSON number, got {value!r}")
            setattr(args, attr, positive_number(value, what))
        except ValueError as exc:
            raise _UsageError(f"{exc}; pass {flag} S") from None


# --------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------


def _duration(seconds: float) -> str:
    """Human-readable duration such as '10m50s' or '2h53m'."""
    if seconds < 60:
        return f"{seconds:.1f}s"
    if seconds < 3600:
        minutes, secs = divmod(int(round(seconds)), 60)
        return f"{minutes}m{secs:02d}s"
    if seconds < 86400 * 2:
        hours, minutes = divmod(int(round(seconds / 60)), 60)
        return f"{hours}h{minutes:02d}m"
    return f"{seconds / 86400:.1f}d"


def _gpu_hours(value: float) -> str:
    """GPU-hours with one decimal, or three significant digits below 100."""
    return f"{value:.1f}" if abs(value) >= 100 or value == 0 else f"{value:#.3g}"


def _percent(value: float) -> str:
    """A fraction as a percentage with four decimals."""
    return f"{100.0 * value:.4f}%"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], out: TextIO) -> None:
    """Write ``rows`` under ``headers``, every column right-aligned to its widest cell."""
    widths = [max(len(headers[i]), *(len(row[i]) for row in rows)) for i in range(len(headers))]
    out.write("  ".join(h.rjust(w) for h, w in zip(headers, widths)).rstrip() + "\n")
    for row in rows:
        out.write("  ".join(cell.rjust(w) for cell, w in zip(row, widths)).rstrip() + "\n")


def _print_plan(args: argparse.Namespace, rows: list[PlanRow], out: TextIO) -> None:
    """The model's inputs, then one table row per job size."""
    transparent = args.jit_overhead if args.transparent_overhead is None else args.transparent_overhead
    source = f" (costs from {args.from_report})" if args.from_report else ""
    out.write(
        f"Failure-cost model (JIT-checkpointing paper, sec. 5){source}:\n"
        f"  checkpoint o = {args.checkpoint_cost:g} s, restore r = {args.restore_cost:g} s, "
        f"minibatch m = {args.minibatch:g} s, failure rate f = {args.failure_rate:g} per GPU per day\n"
        f"  JIT steady-state overhead: {args.jit_overhead:g} (user-level), {transparent:g} (transparent)"
        f"{'; JIT checkpoint stalls all GPUs' if args.jit_checkpoint_stalls_job else ''}\n"
    )
    if args.snapshot_overhead is not None:
        out.write(
            f"  sharded job, memory tier: snapshot overhead {args.snapshot_overhead:g}, "
            f"{args.unprotected_fraction:g} of failures beyond it (they fall back to a periodic backstop); "
            f"without the tier a sharded job wastes what periodic@c* does\n"
        )
    out.write("\n")
    headers = [
        "GPUs",
        "job failures/day",
        "c* (/hour)",
        "checkpoint every",
        "wasted: periodic@c*",
        "JIT user-level",
        "JIT transparent",
    ]
    table = [
        [
            str(row.gpus),
            f"{row.gpus * args.failure_rate:.4g}",
            f"{row.optimal_frequency_per_hour:.2f}",
            _duration(row.checkpoint_interval_s),
            _percent(row.wasted_fraction_periodic),
            _percent(row.wasted_fraction_jit_user),
            _percent(row.wasted_fraction_jit_transparent),
        ]
        for row in rows
    ]
    if args.snapshot_overhead is not None:
        headers.append("sharded: memory tier")
        for line, row in zip(table, rows):
            assert row.wasted_fraction_sharded_memory_tier is not None and row.backstop_frequency_per_hour is not None
            backstop = (f" (backstop every {_duration(SECONDS_PER_HOUR / row.backstop_frequency_per_hour)})"
                        if row.backstop_frequency_per_hour > 0 else " (no backstop)")
            line.append(_percent(row.wasted_fraction_sharded_memory_tier) + backstop)
    _table(headers, table, out)


_APPROACH_LABELS = {
    "periodic": "periodic @ c*",
    "jit_user": "JIT user-level",
    "jit_transparent": "JIT transparent",
}


def _print_monte_carlo(args: argparse.Namespace, results: list[MonteCarloResult], out: TextIO) -> None:
    """The simulation's set-up, then the wasted GPU-hours of each approach per job size."""
    law = "exponential" if args.weibull_shape is None else f"Weibull (shape k = {args.weibull_shape:g})"
    out.write(
        f"\nMonte Carlo: {args.trials} runs of {args.days:g} days of useful training each, "
        f"{law} times between failures, seed {args.seed}.\n"
        "Wasted GPU-hours per run ('closed form' = expectation from the equations):\n\n"
    )
    headers = ["GPUs", "failures (mean)", "approach", "closed form", "mean", "std", "p50", "p90", "p99", "max"]
    table = []
    for result in results:
        for index, dist in enumerate(result.approaches):
            stats = dist.summary()
            table.append(
                [
                    str(result.gpus) if index == 0 else "",
                    f"{float(result.failures.mean()):.1f}" if index == 0 else "",
                    _APPROACH_LABELS[dist.approach],
                    *(_gpu_hours(stats[key]) for key in ("closed_form", "mean", "std", "p50", "p90", "p99", "max")),
                ]
            )
    _table(headers, table, out)


def _plot(path: str, args: argparse.Namespace, results: list[MonteCarloResult]) -> None:
    """Write empirical CDFs of the wasted GPU-hours, one panel per job size."""
    import matplotlib  # noqa: PLC0415 - optional dependency, imported lazily

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    import numpy as np  # noqa: PLC0415

    colors = {"periodic": "tab:red", "jit_user": "tab:blue", "jit_transparent": "tab:green"}
    fig, axes = plt.subplots(len(results), 1, figsize=(8, 3.2 * len(results)), squeeze=False)
    law = "exponential" if args.weibull_shape is None else f"Weibull k={args.weibull_shape:g}"
    for ax, result in zip(axes[:, 0], results):
        for dist in result.approaches:
            samples = np.sort(dist.samples_gpu_hours)
            cdf = np.arange(1, samples.size + 1) / samples.size
            positive = samples > 0
            if not positive.any():
                continue  # nothing wasted in any run: nothing to draw on a log axis
            ax.step(
                samples[positive],
                cdf[positive],
                where="post",
                color=colors[dist.approach],
                label=f"{_APPROACH_LABELS[dist.approach]} (mean {_gpu_hours(dist.mean)})",
            )
            if dist.closed_form_gpu_hours > 0:
                ax.axvline(dist.closed_form_gpu_hours, color=colors[dist.approach], linestyle=":", linewidth=1)
        ax.set_xscale("log")
        ax.set_ylim(0, 1.02)
        ax.set_ylabel("fraction of runs")
        ax.set_title(f"{result.gpus} GPUs, {args.days:g} days useful training, {args.trials} runs, {law}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right", fontsize="small")
    axes[-1, 0].set_xlabel("wasted GPU-hours per run (dotted: closed-form mean)")
    fig.tight_layout()
    try:
        fig.savefig(path, format="png")
    finally:
        plt.close(fig)


# --------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None, out: Optional[TextIO] = None) -> int:
    """Run `jit-run plan` with ``argv`` (without the 'plan' word); returns the exit status."""
    out = sys.stdout if out is None else out
    parser = _build_parser()
    try:
        args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
        try:
            _resolve_costs(args)
            if not args.monte_carlo:
                for flag, given in (
                    ("--days", args.days is not None),
                    ("--plot", args.plot is not None),
                    ("--weibull-shape", args.weibull_shape is not None),
                ):
                    if given:
                        raise _UsageError(f"{flag} only applies together with --monte-carlo")
            elif args.days is None:
                raise _UsageError("--monte-carlo needs --days D (useful training length per run, in days)")
            if (args.snapshot_overhead is None) != (args.unprotected_fraction is None):
                raise _UsageError("--snapshot-overhead and --unprotected-fraction go together (a sharded job's "
                                  "memory tier: its cost and the share of failures beyond it)")
            sharded = None if args.snapshot_overhead is None else (args.snapshot_overhead, args.unprotected_fraction)
            rows = [
                plan_row(
                    n,
                    args.failure_rate,
                    args.checkpoint_cost,
                    args.restore_cost,
                    args.minibatch,
                    args.jit_overhead,
                    args.transparent_overhead,
                    args.jit_checkpoint_stalls_job,
                    sharded,
                )
                for n in args.gpus
            ]
        except (_UsageError, ValueError) as exc:
            parser.error(str(exc))
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2)
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)

    for row in rows:
        if row.optimal_frequency_per_hour * args.checkpoint_cost / SECONDS_PER_HOUR >= 0.5:
            print(
                f"{PROG}: warning: at {row.gpus} GPUs periodic checkpointing would spend half the time or more "
                "writing checkpoints; the first-order model is not reliable there",
                file=sys.stderr,
            )

    results: list[MonteCarloResult] = []
    if args.monte_carlo:
        results = [
            simulate(
                n,
                args.failure_rate,
                args.checkpoint_cost,
                args.restore_cost,
                args.minibatch,
                args.days,
                trials=args.trials,
                weibull_shape=args.weibull_shape,
                seed=args.seed,
                jit_overhead=args.jit_overhead,
                transparent_overhead=args.transparent_overhead,
                checkpoint_stalls_job=args.jit_checkpoint_stalls_job,
            )
            for n in args.gpus
        ]

    if args.json:
        payload = []
        for index, row in enumerate(rows):
            item: dict[str, Any] = row.as_dict()
            if results:
                item["monte_carlo"] = results[index].as_dict()
            payload.append(item)
        json.dump(payload, out, indent=2)
        out.write("\n")
    else:
        _print_plan(args, rows, out)
        if results:
            _print_monte_carlo(args, results, out)

    if args.plot:
        try:
            _plot(args.plot, args, results)
        except ImportError:
            print(
                f"{PROG}: error: --plot needs matplotlib, which is not installed; "
                "run `pip install matplotlib` (or `pip install jitckpt[plot]`)",
                file=sys.stderr,
            )
            return 1
        except OSError as exc:
            print(f"{PROG}: error: cannot write {args.plot}: {exc.strerror or exc}", file=sys.stderr)
            return 1
        if not args.json:
            out.write(f"\nwrote {args.plot}\n")
    return 0
