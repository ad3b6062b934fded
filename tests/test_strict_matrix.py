"""Issue 18's bit-exact matrix on the strict ``ncclorder`` test backend (tests/nccl_order).

Five ways of training, each under jit-run on ``--backend ncclorder`` (the host
runs ahead of a device queue, errors surface on Works, as on NCCL), against
three faults of jit-run's ``--fault`` (``kill``: SIGKILL, ``hang``: SIGSTOP,
``term``: SIGTERM, a preemption notice) in four phases (forward, backward,
all-reduce, optimizer step), rank 1 at minibatch 4 of 8:

========  =================================================  =====
mode      script                                             ranks
========  =================================================  =====
ddp       tests/user_programs/clip_and_die.py (DDP, no_sync)   3
manual    the same, ``--grad-sync manual`` (no DDP: the        3
          script all-reduces every ``p.grad`` itself)
fsdp      tests/sharded_programs/train_sharded.py --mode fsdp  3
hsdp      the same, --mode hsdp (2 x 2 mesh)                   4
zero      the same, --mode zero (DDP + ZeroRedundancyOptimizer) 3
========  =================================================  =====

Every case must end bit-exact or refuse loudly, never with wrong parameters.
Which of them is EXPECTED is decided per case (``EXPECTED`` below), from what
jitckpt does with each loss (tests/test_sharded.py):

- ``resume``: the job completes (exit 0, outcome ``completed``) after resuming
  from the JIT checkpoint of minibatch 4 or 5 (5 when the replicas finished the
  step of minibatch 4), one minibatch redone.  Every ``term`` (every rank
  saves its own state), and every ``kill``/``hang`` of a replicated rank:
  DDP, manual all-reduce, HSDP (rank 3 holds rank 1's shard).
- ``memory``: the job completes (exit 0, outcome ``completed``) after
  resuming at minibatch 4, rank 1's shard from the memory tier's snapshot in
  host memory (``jitckpt.worker.memory_snapshots``): ``kill``/``hang`` of
  rank 1 in FSDP2 (its parameter shard has no replica) and ZeRO (its
  optimizer-state shard has none).  At most two minibatches redone as the
  report counts them (a rank lost at its optimizer step: its peers went on
  into minibatch 5, which lacks its shard).  Before the memory tier these
  cases started afresh from minibatch 0 (``--memory-tier off`` still does:
  tests/test_sharded.py).
- ``refuse``: non-zero exit or outcome ``stopped``, with a reason line.  No
  case of this matrix expects it: every loss here is recoverable bit-exact.

Bit-exact is checked against the fault-free run of the same mode and world
size on plain ``gloo`` (plain torchrun): the final full-parameter SHA-256
(DDP, manual, ZeRO) and, for the sharded modes, every rank's
``rank R local parameters sha256`` (its own shards; DTensor cannot gather on
``ncclorder``, so FSDP2/HSDP print no full hash there): equal shard by shard
is equal.

Only ``DEFAULT`` (4 cases: each mode but DDP, which tests/test_nccl_ordering.py
covers, once; kill, hang and term each in a different phase) runs by default;
the rest is marked ``matrix``: ``python3 -m pytest -m matrix tests/test_strict_matrix.py``.

The default manual-all-reduce case is issue 18's defect 1: rank 1 freezes at
the entry of its gradient all-reduce of minibatch 4, so the other ranks' all-
reduces never finish, while on NCCL rules their host runs ahead to
``optimizer.step()``.  Fixed in d4831ba (every collective holds the optimizer
pre-step); before it, this case completed with wrong parameters (the evidence
is in ``test_default``'s docstring).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import REPO, TEARDOWN_ABORT, _job_key, computed_once, reference_sha, run_jit, run_plain

CLIP = REPO / "tests" / "user_programs" / "clip_and_die.py"
SHARDED = REPO / "tests" / "sharded_programs" / "train_sharded.py"
STEPS = 8
RANK = 1
STEP = 4

MODES: dict[str, tuple[Path, int, list[str]]] = {
    "ddp": (CLIP, 3, ["--steps", str(STEPS), "--accum", "2"]),
    "manual": (CLIP, 3, ["--steps", str(STEPS), "--accum", "2", "--grad-sync", "manual"]),
    "fsdp": (SHARDED, 3, ["--mode", "fsdp", "--steps", str(STEPS)]),
    "hsdp": (SHARDED, 4, ["--mode", "hsdp", "--steps", str(STEPS)]),
    "zero": (SHARDED, 3, ["--mode", "zero", "--steps", str(STEPS)]),
}
KINDS = ("kill", "hang", "term")
PHASES = ("forward", "backward", "allreduce", "optimizer")


def expected(mode: str, kind: str, phase: str) -> str:
    """The expectation table (see the module docstring); the phase does not change it."""
    if kind == "term":
        return "resume"  # a preemption notice: every rank saves its own state at the next safe point
    if mode in ("fsdp", "zero"):
        return "memory"  # rank 1's shard (FSDP2 parameters / ZeRO optimizer state) has no copy but in memory
    return "resume"  # ddp, manual: replicated; hsdp: rank 3 holds rank 1's shard


EXPECTED = {(m, k, p): expected(m, k, p) for m in MODES for k in KINDS for p in PHASES}

DEFAULT = [
    ("manual", "hang", "allreduce"),  # issue 18 defect 1: optimizer.step() ahead of a hung all-reduce
    ("fsdp", "kill", "backward"),
    ("hsdp", "term", "optimizer"),
    ("zero", "hang", "forward"),
]

# Cases seen ending with WRONG parameters, not fixed yet (docs/verification.md, "Strict-backend matrix (issue 18)").
WRONG: dict[tuple[str, str, str], str] = {
    # (mode, kind, phase): why the case ends with wrong parameters (an xfail(strict=True) until fixed).  Found and
    # fixed on 2026-11-26: ("zero", "term", "forward") resumed "completed" with other parameters: the save of
    # "start of minibatch 4" read parameters whose ZeRO broadcast of minibatch 3 was still on the device
    # (JitRuntime._wait_for_earlier_minibatches).
}

LOCAL_SHA = re.compile(r"rank (\d+) local parameters sha256 ([0-9a-f]{64})")  # no anchors: ranks' lines can be fused
FULL_SHA = re.compile(r"final parameters sha256 ([0-9a-f]{64})")


def shas(output: str) -> dict[str, str]:
    """{"full": ..., "0": ..., "1": ...}: the last full hash and every rank's last local hash in ``output``."""
    found = {rank: sha for rank, sha in LOCAL_SHA.findall(output)}
    full = FULL_SHA.findall(output)
    if full:
        found["full"] = full[-1]
    return found


def gloo_reference(mode: str) -> dict[str, str]:
    """The fault-free run of ``mode`` on plain gloo under plain torchrun: its hashes (computed once per run)."""
    script, nproc, args = MODES[mode]
    if script == CLIP:
        return {"full": reference_sha(nproc=nproc, args=args, script=script)}

    def compute() -> str:
        for _ in range(3):
            result = run_plain(nproc, args, script)
            found = shas(result.output)
            complete = "full" in found and all(str(r) in found for r in range(nproc))  # gloo gathers: both
            if complete and (result.returncode == 0 or TEARDOWN_ABORT in result.output):
                return json.dumps(found, sort_keys=True)
        raise AssertionError("the fault-free reference run failed three times:\n" + result.output[-3000:])

    return json.loads(computed_once("strict-matrix-reference", _job_key(nproc, args, script), compute))


def run_case(tmp_path: Path, mode: str, kind: str, phase: str):
    script, nproc, args = MODES[mode]
    return run_jit(tmp_path / "ckpt", nproc=nproc, script=script, args=[*args, "--backend", "ncclorder"],
                   fault=f"rank={RANK},step={STEP},phase={phase},kind={kind}")


def check(tmp_path: Path, mode: str, kind: str, phase: str) -> None:
    reference = gloo_reference(mode)
    result = run_case(tmp_path, mode, kind, phase)
    tail = result.output[-4000:]
    report = result.report
    want = EXPECTED[(mode, kind, phase)]
    got = shas(result.output)
    if want == "refuse":  # kept for the table's completeness: no case expects it today
        assert result.returncode != 0 or (report and report["outcome"] == "stopped"), tail
        assert "stopped" in result.output or "failed" in result.output, tail
        return
    assert result.returncode == 0, f"expected a bit-exact {want}, got exit {result.returncode}\n{tail}"
    assert report is not None and report["outcome"] == "completed", (report and report["outcome"], tail)
    # Never completed with wrong parameters: the full hash where there is one, and every rank's shards.
    _, nproc, _ = MODES[mode]
    if MODES[mode][0] == SHARDED:
        local = {k: v for k, v in got.items() if k != "full"}
        assert sorted(local) == sorted(str(r) for r in range(nproc)), f"a rank printed no local hash\n{tail}"
        wrong = sorted(r for r in local if local[r] != reference[r])
        assert not wrong, f"WRONG PARAMETERS: ranks {wrong}' shards differ from the fault-free gloo run\n{tail}"
    if "full" in reference and (MODES[mode][0] == CLIP or mode == "zero"):
        assert got.get("full") == reference["full"], f"WRONG PARAMETERS: differ from the fault-free gloo run\n{tail}"
    failures = report["failures"]
    assert failures, report
    if want == "memory":
        assert not any(f["restarted_fresh"] for f in failures), report
        # Rank 1's shard was saved by no one (the replicas saved without it, or refused to save because a
        # collective of the previous minibatch's optimizer step, ZeRO's broadcast, never completed): its
        # snapshot of the start of minibatch 4, taken at its first forward, is in host memory.
        assert failures[0]["resumed_from_minibatch"] == STEP and RANK in failures[0]["memory_tier_ranks"], failures[0]
        assert failures[0]["minibatches_redone"] is not None and failures[0]["minibatches_redone"] <= 2, failures[0]
    else:
        assert not any(f["restarted_fresh"] for f in failures), report
        # A preemption notice lets the rank reach its next safe point first; its collectives already issued then
        # complete as it leaves (ProcessGroupNCCL's shutdown flushes them), so its peers may get one minibatch
        # further before they see it gone, and resume from there (found: rank 1 saved 5, ranks 0 and 2 saved 6).
        latest = STEP + 2 if kind == "term" else STEP + 1
        assert STEP <= failures[0]["resumed_from_minibatch"] <= latest, failures[0]
        assert failures[0]["minibatches_redone"] is not None and failures[0]["minibatches_redone"] <= 1, failures[0]
        assert "no surviving copy" not in result.output, tail


def _params(default: bool) -> list:
    cases = []
    for mode in MODES:
        for kind in KINDS:
            for phase in PHASES:
                if ((mode, kind, phase) in DEFAULT) == default:
                    marks = [] if default else [pytest.mark.matrix]
                    if (mode, kind, phase) in WRONG:
                        marks.append(pytest.mark.xfail(strict=True, reason=WRONG[(mode, kind, phase)]))
                    cases.append(pytest.param(mode, kind, phase, marks=marks, id=f"{mode}-{kind}-{phase}"))
    return cases


@pytest.mark.slow
@pytest.mark.parametrize("mode,kind,phase", _params(default=True))
def test_default(tmp_path, mode, kind, phase):
    """The covering subset that runs by default (see the module docstring).

    ``manual-hang-allreduce`` fails on the code before d4831ba, and with wrong parameters: on a copy of
    this tree with d4831ba~1's jitckpt/worker/instrument.py and runtime.py (2026-11-26), ranks 0 and 2
    detected the hang (``torch.distributed.all_reduce in flight for 3.2s``), saved minibatch 4, the job
    resumed from it and reported ``completed (exit code 0)``, one minibatch redone, but its final
    parameters sha256 was 6756abd6...6be8e172 instead of the fault-free gloo run's 376a8571...54066c96:
    issue 18's defect 1 (before d4831ba a script's own all-reduce did not hold the optimizer pre-step, so
    ``optimizer.step()``, which the host reaches ahead of the hung all-reduce, was not held back before
    the save).  With d4831ba it ends bit-exact.
    """
    check(tmp_path, mode, kind, phase)


@pytest.mark.slow
@pytest.mark.parametrize("mode,kind,phase", _params(default=False))
def test_matrix(tmp_path, mode, kind, phase):
    check(tmp_path, mode, kind, phase)


def test_the_table_covers_the_matrix_and_the_default_subset_covers_what_it_must():
    assert len(EXPECTED) == len(MODES) * len(KINDS) * len(PHASES) == 60
    assert len(DEFAULT) <= 4 and {m for m, _, _ in DEFAULT} == set(MODES) - {"ddp"}
    assert {k for _, k, _ in DEFAULT} == set(KINDS)
    assert len({(k, p) for _, k, p in DEFAULT}) == len(DEFAULT)
    manual = [(k, p) for m, k, p in DEFAULT if m == "manual"]
    assert manual and manual[0][0] in ("kill", "hang") and manual[0][1] in ("optimizer", "allreduce")
    assert set(EXPECTED.values()) <= {"resume", "memory", "refuse"}
    assert not set(WRONG) & set(DEFAULT), "the default subset must pass"
