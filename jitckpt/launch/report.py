"""The recovery report: what failed, who noticed, and what each recovery cost.

Built by jit-run from the job's event log (``jitckpt.eventlog``) once torchrun
exits; printed as a table and written as JSON.  The ``summary`` block feeds
``jit-run plan --from-report`` (checkpoint cost, restore cost, minibatch time).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from jitckpt import config
from jitckpt.store.private import make_missing_dirs, write_private_file
from jitckpt.store.shard import format_ranks

REPORT_VERSION = 1


def _of(records: list[dict], kind: str, attempt: int | None = None) -> list[dict]:
    return [e for e in records if e["event"] == kind and (attempt is None or e.get("attempt") == attempt)]


# jitckpt's own worker exit statuses, each with the event the worker records before it exits with it.
_OWN_EXITS = {
    config.JIT_SAVED_EXIT_CODE: "jit_saved",
    config.JIT_SAVE_FAILED_EXIT_CODE: "jit_save_failed",
    config.RESUME_REFUSED_EXIT_CODE: "resume_refused",
}


def _own_exit(records: list[dict], failure: dict) -> bool:
    """True if the worker of an agent's ``worker_failed`` event exited with jitckpt's status for what it recorded.

    The status alone says nothing: a script may exit with 75, 76 or 77 itself.
    """
    event = _OWN_EXITS.get(failure.get("exitcode"))  # type: ignore[arg-type]
    pid = failure.get("worker_pid")
    return event is not None and pid is not None and any(e["event"] == event and e.get("pid") == pid for e in records)


def _failure_record(records: list[dict], attempt: int, agent_failures: list[dict], window: tuple[float, float]) -> dict[str, Any]:
    injected = _of(records, "fault_injected")
    injected = [e for e in injected if _attempt_of_pid(records, e["pid"]) == attempt]
    detections = _of(records, "jit_detected", attempt)
    saves = _of(records, "jit_saved", attempt)
    save_failures = _of(records, "jit_save_failed", attempt)
    real_failures = [f for f in agent_failures if not _own_exit(records, f)]
    frozen = [e for e in records if e["event"] == "worker_frozen_killed" and window[0] <= e["time"] <= window[1]]

    what: list[str] = []
    for e in injected:
        what.append(f"rank {e['rank']}: injected {e['kind']} in {e['phase']} of minibatch {e['step']}")
    for f in real_failures:
        code = f.get("exitcode")
        how = f"killed by signal {-code}" if isinstance(code, int) and code < 0 else f"exited with status {code}"
        what.append(f"rank {f['rank']}: {how}")
    for e in frozen:
        when = (f"after {e['seconds']:g}s stopped with no failure seen (its peers had nothing left to wait for it in)"
                if e.get("seconds") is not None else "at teardown")
        what.append(f"rank {e['rank']}: hung (process frozen), killed by jit-run {when}")
    for e in _of(records, "resume_refused", attempt):
        what.append(f"rank {e['rank']}: refused to resume from minibatch {e.get('step')}: {e['reason']}")

    candidates = [e["time"] for e in injected] + [f["time"] for f in real_failures]
    candidates += [d["collective_since"] for d in detections if d.get("collective_since")]
    failed_at = min(candidates) if candidates else None
    first_detection = min((d["time"] for d in detections), default=None)
    last_save = max((s["time"] for s in saves), default=None)

    next_starts = _of(records, "worker_start", attempt + 1)
    restarted_at = max((e["time"] for e in next_starts), default=None)
    resumed = _of(records, "resumed", attempt + 1)
    first_steps = _of(records, "first_step_done", attempt + 1)
    resumed_at = max((e["time"] for e in first_steps), default=None)
    resumed_step = min((e["step"] for e in resumed), default=None)
    fresh = bool(_of(records, "fresh_start", attempt + 1))
    unusable = _unusable(records, attempt + 1) if fresh else []
    warm = _of(records, "warm_start", attempt + 1)  # restarted from the template (jitckpt.launch.warm_start)

    furthest = max([d["step"] for d in detections] + [e["step"] for e in injected], default=None)
    # A failure nobody detected (a worker frozen after its peers finished): the minibatches they completed.
    completed = max((e["step"] for e in _of(records, "worker_exit", attempt)), default=None)
    if furthest is not None and resumed_step is not None:
        redone = furthest - resumed_step + 1
    elif furthest is not None and fresh:
        redone = furthest + 1
    elif completed is not None and (resumed_step is not None or fresh):
        redone = max(0, completed - (resumed_step or 0))
    else:
        redone = None
    # Resumed at the job's last minibatch (the failure struck after its last step): nothing is trained again.
    final = max((e["step"] for e in _of(records, "worker_exit")), default=None)
    if redone is not None and final is not None and (resumed_step is not None or fresh):
        redone = min(redone, max(0, final - (resumed_step or 0)))

    def span(a: float | None, b: float | None) -> float | None:
        return None if a is None or b is None else round(max(0.0, b - a), 3)

    return {
        "attempt": attempt,
        "what_failed": what,
        "detected_by": [
            {"rank": d["rank"], "how": d["reason"], "detail": d["detail"], "minibatch": d["step"], "phase": d["phase"]}
            for d in sorted(detections, key=lambda d: d["rank"])
        ],
        "saves": [
            {"rank": s["rank"], "minibatch": s["step"], "seconds": round(s["seconds"], 3), "path": s["path"]}
            for s in sorted(saves, key=lambda s: s["rank"])
        ],
        "save_failures": [{"rank": s["rank"], "error": s["error"]} for s in save_failures],
        "detect_seconds": span(failed_at, first_detection),
        "save_seconds": round(max(s["seconds"] for s in saves), 3) if saves else None,
        "save_wall_seconds": span(first_detection, last_save),
        "restart_seconds": span(last_save or first_detection or failed_at, restarted_at),
        "warm_ranks": sorted(e["rank"] for e in warm),
        "restarted_ranks": len(next_starts),
        "resume_seconds": span(restarted_at, resumed_at),
        "resumed_from_minibatch": resumed_step,
        # ranks whose state came from the memory tier's snapshots (jitckpt.store.memory), not from a JIT save
        "memory_tier_ranks": sorted(e["rank"] for e in resumed if e.get("memory_tier")),
        "restarted_fresh": fresh,
        # why the job resumed from the step before the newest saved (a rank's own state there not known)
        "held_back": sorted({e["held_back"] for e in resumed if e.get("held_back")}),
        "unusable_checkpoints": unusable,
        "minibatches_redone": redone,
    }


_NAMED_REASONS = 8


def _unusable(records: list[dict], attempt: int) -> list[str]:
    """Why the checkpoints on disk were passed over by the ranks of ``attempt`` that started afresh (deduplicated)."""
    reasons: list[str] = []
    for e in _of(records, "checkpoints_unusable", attempt):
        for why in e.get("reasons") or [f"minibatch(es) {', '.join(map(str, e.get('steps', [])))}: not usable"]:
            if why not in reasons:
                reasons.append(why)
    return reasons[:_NAMED_REASONS] + ([f"... and {len(reasons) - _NAMED_REASONS} more"]
                                       if len(reasons) > _NAMED_REASONS else [])


def _start(records: list[dict], attempts: list[int]) -> dict[str, Any]:
    """How the first attempt began: at minibatch 0, or from a checkpoint an earlier run left; what it passed over."""
    first = attempts[0] if attempts else 0
    resumed = _of(records, "resumed", first)
    return {
        "resumed_from_minibatch": min((e["step"] for e in resumed), default=None),
        "unusable_checkpoints": _unusable(records, first),
    }


def _attempt_of_pid(records: list[dict], pid: int) -> int | None:
    for e in records:
        if e["event"] == "worker_start" and e["pid"] == pid:
            return e["attempt"]
    return None


def build(records: list[dict], exit_code: int, command: list[str]) -> dict[str, Any]:
    """The report as a JSON-able dict; ``exit_code`` is torchrun's, the report's own is what jit-run exits with."""
    attempts = sorted({e["attempt"] for e in _of(records, "worker_start")})
    agent_failures = _of(records, "worker_failed")
    failures = []
    for attempt in attempts:
        starts = [e["time"] for e in _of(records, "worker_start", attempt)]
        window_end = min((e["time"] for e in _of(records, "worker_start", attempt + 1)), default=float("inf"))
        window = (min(starts, default=0.0), window_end)
        in_window = [f for f in agent_failures if window[0] <= f["time"] <= window[1]]
        ended_by_failure = (
            _of(records, "jit_detected", attempt)
            or [e for e in _of(records, "fault_injected") if _attempt_of_pid(records, e["pid"]) == attempt]
            or attempt + 1 in attempts
            or in_window  # the last attempt, ended by a failed worker (torchrun's restarts spent, or none)
        )
        if not ended_by_failure:
            continue
        failures.append(_failure_record(records, attempt, in_window, window))

    exits = [e for e in _of(records, "worker_exit") if e.get("mean_minibatch_seconds")]
    minibatch = statistics.fmean(e["mean_minibatch_seconds"] for e in exits) if exits else None
    saves = [f["save_seconds"] for f in failures if f["save_seconds"] is not None]
    restores = [
        f["restart_seconds"] + f["resume_seconds"]
        for f in failures
        if f["restart_seconds"] is not None and f["resume_seconds"] is not None
    ]
    final_steps = [e["step"] for e in _of(records, "worker_exit")]
    # DESIGN decision 15: a resume known not to be bit-exact stops the job, or is named in the outcome.
    stopped_because = [f"rank {e['rank']}: {e['reason']}" for e in _of(records, "resume_refused")]
    not_bit_exact = [f"rank {e['rank']}, minibatch {e.get('step')}: {e['reason']}" for e in _of(records, "resume_inexact")]
    if stopped_because:
        outcome = "stopped"
    elif exit_code != 0:
        outcome = "failed"
    else:
        outcome = "completed, not bit-exact" if not_bit_exact else "completed"
    return {
        "report_version": REPORT_VERSION,
        "command": command,
        "outcome": outcome,
        "stopped_because": stopped_because,
        "not_bit_exact": not_bit_exact,
        # jit-run's exit status: torchrun's, or its own for a job it stopped (a requeue wrapper tells them apart)
        "exit_code": config.JOB_STOPPED_EXIT_CODE if stopped_because else exit_code,
        "torchrun_exit_code": exit_code,
        "attempts": len(attempts),
        "start": _start(records, attempts),
        "restarts": max(0, len(attempts) - 1),
        "final_minibatch": max(final_steps) if final_steps else None,
        "failures": failures,
        "crashes_after_finishing": [
            {"rank": e.get("rank"), "attempt": e.get("attempt"), "signal": e.get("signal")}
            for e in _of(records, "worker_crashed_after_finishing")
        ],
        "summary": {
            "failures": len(failures),
            "minibatches_redone": sum(f["minibatches_redone"] or 0 for f in failures),
            "checkpoint_cost_seconds": round(statistics.fmean(saves), 3) if saves else None,
            "restore_cost_seconds": round(statistics.fmean(restores), 3) if restores else None,
            "minibatch_seconds": round(minibatch, 6) if minibatch is not None else None,
        },
    }


def _fmt(value: Any, unit: str = "s") -> str:
    return "-" if value is None else f"{value:.2f}{unit}" if isinstance(value, float) else str(value)


def _warm_note(failure: dict[str, Any]) -> str:
    warm, restarted = len(failure.get("warm_ranks", [])), failure.get("restarted_ranks", 0)
    return f" ({warm} of {restarted} workers warm)" if restarted else ""


def render(report: dict[str, Any]) -> str:
    """A human-readable version of the report."""
    lines = ["", "=" * 72, "jitckpt recovery report", "=" * 72]
    lines.append(f"outcome: {report['outcome']} (exit code {report['exit_code']}), attempts: {report['attempts']}, "
                 f"restarts: {report['restarts']}, final minibatch: {_fmt(report['final_minibatch'])}")
    for why in report.get("stopped_because", []):
        lines.append(f"stopped: {why} (a resume that is not bit-exact is refused; jit-run --allow-inexact-resume "
                     f"lets it go on)")
    for why in report.get("not_bit_exact", []):
        lines.append(f"not bit-exact (--allow-inexact-resume): {why}")
    start = report.get("start") or {}
    if start.get("resumed_from_minibatch") is not None:
        lines.append(f"started: from minibatch {start['resumed_from_minibatch']} (a checkpoint an earlier run left)")
    elif start.get("unusable_checkpoints"):
        lines.append("started: from minibatch 0, passing over the checkpoints on disk, none usable:")
        lines += [f"  unusable: {why}" for why in start["unusable_checkpoints"]]
    if not report["failures"]:
        lines.append("no failures.")
    for n, f in enumerate(report["failures"], 1):
        lines.append(f"--- failure {n} (attempt {f['attempt']}) ---")
        for what in f["what_failed"] or ["(cause not observed)"]:
            lines.append(f"  failed:   {what}")
        for d in f["detected_by"]:
            lines.append(f"  detected: rank {d['rank']} by {d['how']} at minibatch {d['minibatch']} ({d['phase']}): {d['detail']}")
        for s in f["saves"]:
            lines.append(f"  saved:    rank {s['rank']} minibatch {s['minibatch']} in {s['seconds']:.2f}s -> {s['path']}")
        for s in f["save_failures"]:
            lines.append(f"  save failed: rank {s['rank']}: {s['error']}")
        resumed = "fresh start" if f["restarted_fresh"] else f"minibatch {_fmt(f['resumed_from_minibatch'])}"
        if f.get("memory_tier_ranks"):
            resumed += f" (rank(s) {format_ranks(f['memory_tier_ranks'])} from host-memory snapshots)"
        lines.append(
            f"  time to detect {_fmt(f['detect_seconds'])}, save {_fmt(f['save_seconds'])}, "
            f"restart {_fmt(f['restart_seconds'])}{_warm_note(f)}, resume {_fmt(f['resume_seconds'])}; "
            f"resumed from {resumed}, minibatches redone: {_fmt(f['minibatches_redone'])}"
        )
        lines += [f"  held back: {why}" for why in f.get("held_back", [])]
        lines += [f"  unusable: {why}" for why in f.get("unusable_checkpoints", [])]
    for c in report.get("crashes_after_finishing", []):
        lines.append(f"note: rank {c['rank']} finished its script in attempt {c['attempt']}, then died from signal "
                     f"{c['signal']} during interpreter shutdown; counted as finished (not restarted)")
    s = report["summary"]
    lines.append(f"summary: {s['failures']} failure(s), {s['minibatches_redone']} minibatch(es) redone, "
                 f"checkpoint cost {_fmt(s['checkpoint_cost_seconds'])}, restore cost {_fmt(s['restore_cost_seconds'])}, "
                 f"minibatch {_fmt(s['minibatch_seconds'])}")
    lines.append("=" * 72)
    return "\n".join(lines)


def write(report: dict[str, Any], path: Path) -> None:
    """Write the report to ``path`` atomically, owner-only (with any folder it creates)."""
    make_missing_dirs(path.parent)  # a folder that exists is the user's (/tmp, a shared project folder): left as it is
    tmp = path.with_suffix(".tmp")
    write_private_file(tmp, json.dumps(report, indent=2).encode())
    tmp.replace(path)
