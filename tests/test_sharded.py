"""Sharded jobs under jit-run: a rank is never resumed from another rank's shard.

Real torchrun jobs over gloo, from the user's side (tests/sharded_programs/train_sharded.py):

- FSDP2 on 2 ranks, rank 1 killed, the memory tier off: its shard has no
  replica, so the job says so and starts afresh; the final parameters equal a
  fault-free run's.  (With the memory tier, the default, it resumes from host
  memory instead: tests/test_memory_tier.py.)
- HSDP on 4 ranks (replicate x shard = 2 x 2), rank 1 killed: rank 3 holds the
  same shard, so every rank resumes from the JIT checkpoint of its own shard,
  redoes one minibatch and ends bit-for-bit like a fault-free run.
- DDP with ZeroRedundancyOptimizer on 2 ranks, the memory tier off: rank 1 is
  preempted (every rank saves), later killed (its optimizer shard has no
  replica): the job falls back to the preemption's complete checkpoint, never
  a wrong resume.

Before shard identities, the FSDP and HSDP jobs resumed rank 1 from rank 0's
checkpoint and reported success with wrong parameters, and the ZeRO job
crashed loading rank 0's optimizer shard into rank 1 until torchrun gave up.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import REPO, run_jit

pytestmark = pytest.mark.slow

PROGRAM = REPO / "tests" / "sharded_programs" / "train_sharded.py"
STEPS = 10
RESUMING = re.compile(r"^\[jitckpt rank (\d+)\] resuming from minibatch (\d+): (\S+)$", re.M)


def fault_free_sha(tmp_path: Path, mode: str, nproc: int) -> str:
    """Final-parameter hash of the job without a failure.

    Under jit-run rather than plain torchrun: a gloo job under plain torchrun
    sometimes aborts at exit ("terminate called without an active exception",
    see docs/design.md, "The end of a finished script"), which jit-run handles.
    """
    result = run_jit(tmp_path / "fault-free", nproc=nproc, max_restarts=0, script=PROGRAM,
                     args=["--mode", mode, "--steps", str(STEPS)])
    assert result.returncode == 0 and result.sha, result.output[-4000:]
    assert not list((tmp_path / "fault-free").glob("step-*")), "a fault-free run saved a JIT checkpoint"
    return result.sha


def run_sharded(tmp_path: Path, mode: str, nproc: int, *faults: str, memory_tier: str = "auto"):
    """The job with jit-run; ``memory_tier="off"``: without the memory tier's snapshots (tests/test_memory_tier.py
    covers them), so that a lost shard has no copy anywhere."""
    args = ["--mode", mode, "--steps", str(STEPS)] + [a for f in faults for a in ("--fault", f)]
    return run_jit(tmp_path / "ckpt", nproc=nproc, script=PROGRAM, args=args, jit_options=["--memory-tier", memory_tier])


def resumes(output: str) -> list[tuple[int, int, Path]]:
    """(rank, minibatch, checkpoint directory) of every 'resuming from' line, in order."""
    return [(int(rank), int(step), Path(path)) for rank, step, path in RESUMING.findall(output)]


def lines_with(output: str, text: str) -> list[str]:
    """The lines the ranks printed (not the report's) that hold ``text``."""
    return [line for line in output.splitlines() if text in line and line.startswith("[jitckpt rank")]


def test_fsdp_lost_shard_is_said_once_and_the_job_starts_afresh(tmp_path):
    expected = fault_free_sha(tmp_path, "fsdp", 2)
    result = run_sharded(tmp_path, "fsdp", 2, "1:5:KILL", memory_tier="off")
    assert result.returncode == 0, result.output[-4000:]
    assert resumes(result.output) == [], "a rank was resumed although rank 1's shard has no copy"
    assert result.sha == expected, "parameters differ from the fault-free run\n" + result.output[-4000:]
    # rank 0 saved minibatch 5; that checkpoint holds rank 0's shard and nobody else's
    meta = json.loads((tmp_path / "ckpt" / "step-00000005" / "rank-00000" / "jitckpt-meta.json").read_text())
    assert meta["replicas"] == "0" and "FSDP2" in meta["shard"], meta
    lost = lines_with(result.output, "no surviving copy")
    assert len(lost) == 2, result.output[-4000:]  # one line on each rank, the same words
    for rank, line in zip((0, 1), sorted(lost)):
        assert line.startswith(f"[jitckpt rank {rank}] warning: skipping ") and line.endswith(
            "step-00000005: no surviving copy of the shard of rank 1 (parameters (FSDP2/DTensor) shard 1/2): no rank "
            "holding it saved this step; falling back to the newest checkpoint that covers every shard"), line
    assert len(lines_with(result.output, "covers every shard of this job: a fresh start from minibatch 0")) == 2
    (failure,) = result.report["failures"]
    assert any("no surviving copy of the shard of rank 1" in why for why in failure["unusable_checkpoints"]), failure
    assert failure["restarted_fresh"] and failure["minibatches_redone"] == 6, failure


def test_hsdp_rank_resumes_from_the_replica_of_its_own_shard_bit_exact(tmp_path):
    expected = fault_free_sha(tmp_path, "hsdp", 4)
    result = run_sharded(tmp_path, "hsdp", 4, "1:5:KILL")
    assert result.returncode == 0, result.output[-4000:]
    loaded = {rank: path for rank, _, path in resumes(result.output)}
    assert {rank: step for rank, step, _ in resumes(result.output)} == {0: 5, 1: 5, 2: 5, 3: 5}, result.output[-4000:]
    # mesh [[0, 1], [2, 3]] split along dim 1: ranks 0 and 2 hold shard 0, ranks 1 and 3 shard 1
    assert loaded[1].name == "rank-00003", loaded
    for rank, path in loaded.items():
        meta = json.loads((path / "jitckpt-meta.json").read_text())
        assert meta["replicas"] == ("0,2" if rank % 2 == 0 else "1,3"), (rank, meta)
        assert meta["shard"].endswith(f"#{rank % 2}"), (rank, meta["shard"])
    assert not lines_with(result.output, "no surviving copy")
    (failure,) = result.report["failures"]
    assert failure["resumed_from_minibatch"] == 5 and failure["minibatches_redone"] == 1, failure
    assert result.sha == expected, "parameters differ from the fault-free run\n" + result.output[-4000:]


def test_zero_lost_optimizer_shard_falls_back_to_the_last_complete_checkpoint(tmp_path):
    expected = fault_free_sha(tmp_path, "zero", 2)
    # attempt 0: rank 1 is preempted at minibatch 3 (SIGTERM: both ranks save);
    # attempt 1: rank 1 is killed at minibatch 6 (only rank 0 saves)
    result = run_sharded(tmp_path, "zero", 2, "1:3:TERM:0", "1:6:KILL:1", memory_tier="off")
    assert result.returncode == 0, result.output[-4000:]
    done = resumes(result.output)
    assert sorted((rank, step, path.name) for rank, step, path in done) == [
        (0, 3, "rank-00000"), (0, 3, "rank-00000"), (1, 3, "rank-00001"), (1, 3, "rank-00001")], done
    lost = lines_with(result.output, "no surviving copy")
    assert len(lost) == 2 and all(
        "step-00000006: no surviving copy of the shard of rank 1 (optimizer state (ZeroRedundancyOptimizer) shard 1/2)"
        in line for line in lost), lost
    first, second = result.report["failures"]
    assert first["resumed_from_minibatch"] == 3 and second["resumed_from_minibatch"] == 3, result.report
    assert result.sha == expected, "parameters differ from the fault-free run\n" + result.output[-4000:]
