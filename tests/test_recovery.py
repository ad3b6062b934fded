"""The central acceptance test: after any recovery the final parameters are bit-for-bit
those of a fault-free run with the same seed (real 4-rank torchrun jobs, gloo, CPU)."""

from __future__ import annotations

import json

import pytest

from conftest import reference_sha, run_jit

pytestmark = pytest.mark.slow


# 3 ranks (run_jit's and reference_sha's default): rank 2 fails, ranks 0 and 1 are its replicas.

# (kind, phase, step): each failure kind at several points of a minibatch.
MATRIX = [
    ("kill", "forward", 5),
    ("kill", "backward", 12),
    ("kill", "allreduce", 17),
    ("kill", "optimizer", 9),
    ("hang", "forward", 14),
    ("hang", "backward", 7),
    ("hang", "allreduce", 19),
    ("hang", "optimizer", 11),
    ("raise", "backward", 15),
    # Minibatch 1, whose first forward is where DDP rebuilds its gradient buckets (the order of minibatch 0's
    # backward): a save before that rebuild must still record the layout minibatch 1 all-reduces with.
    ("kill", "forward", 1),
    ("kill", "optimizer", 0),
    ("hang", "backward", 1),
]


def _check_single_recovery(result, fault_free_sha, kind, phase, step):
    assert result.returncode == 0, result.output[-4000:]
    assert result.sha == fault_free_sha, "parameters differ from the fault-free run\n" + result.output[-4000:]
    report = result.report
    assert report["outcome"] == "completed" and report["restarts"] == 1
    (failure,) = report["failures"]
    # Paper §3.3: a failure in the optimizer step lets the replicas finish that
    # step, so they save (and the job resumes at) the next minibatch.
    expected = step + 1 if phase == "optimizer" else step
    assert failure["resumed_from_minibatch"] == expected, failure
    assert failure["minibatches_redone"] == 1, failure
    assert {d["rank"] for d in failure["detected_by"]} == {0, 1}, failure
    if kind == "hang":
        assert any(d["how"] == "hang" for d in failure["detected_by"]), failure
    # A survivor on a busy host may not yet have seen the all-reduce of the minibatch before complete: it saves
    # that one (consistent too: tests/test_user_code_faults.py places it), and the newest complete one wins.
    saved = sorted(s["minibatch"] for s in failure["saves"])
    assert len(saved) == 2 and saved[-1] == expected and saved[0] in (expected - 1, expected), failure
    for key in ("detect_seconds", "save_seconds", "restart_seconds", "resume_seconds"):
        assert failure[key] is not None and failure[key] >= 0, (key, failure)


@pytest.mark.parametrize("kind,phase,step", MATRIX, ids=[f"{k}-{p}-{s}" for k, p, s in MATRIX])
def test_bit_exact_after_recovery(tmp_path, fault_free_sha, kind, phase, step):
    result = run_jit(tmp_path / "ckpt", fault=f"rank=2,step={step},phase={phase},kind={kind}")
    _check_single_recovery(result, fault_free_sha, kind, phase, step)


def test_failure_during_the_jit_save(tmp_path, fault_free_sha):
    """Rank 2 dies; rank 1 dies while saving.  Its torn save is ignored, a replica's is used.

    Rank 0 saves 10, or 9 if its host was too busy for it to see the all-reduce of 9 complete in time
    (placed on purpose in tests/test_user_code_faults.py); the job resumes from rank 0's save."""
    result = run_jit(tmp_path / "ckpt", fault="rank=2,step=10,phase=backward,kind=kill;rank=1,step=10,phase=save,kind=kill")
    assert result.returncode == 0, result.output[-4000:]
    assert result.sha == fault_free_sha
    (failure,) = result.report["failures"]
    ((saver, saved),) = [(s["rank"], s["minibatch"]) for s in failure["saves"]]
    assert saver == 0 and saved in (9, 10) and failure["resumed_from_minibatch"] == saved, failure
    torn = list((tmp_path / "ckpt" / "step-00000010").glob(".rank-00001.partial-*"))
    assert torn, "the killed save should have left a hidden partial directory"
    assert not (tmp_path / "ckpt" / "step-00000010" / "rank-00001").exists()


def test_second_failure_after_restart(tmp_path, fault_free_sha):
    """A failure in attempt 0 and another in attempt 1: two recoveries, still bit-exact."""
    faults = "rank=2,step=6,phase=backward,kind=kill;rank=0,step=16,phase=forward,kind=hang,attempt=1"
    result = run_jit(tmp_path / "ckpt", fault=faults, max_restarts=3)
    assert result.returncode == 0, result.output[-4000:]
    assert result.sha == fault_free_sha
    first, second = result.report["failures"]
    assert first["resumed_from_minibatch"] == 6 and second["resumed_from_minibatch"] == 16
    assert {d["rank"] for d in second["detected_by"]} == {1, 2}
    assert result.report["summary"]["minibatches_redone"] == 2


def test_more_failures_than_max_restarts(tmp_path):
    """Failures beyond --max-restarts: jit-run exits non-zero cleanly, with the report."""
    faults = "rank=2,step=4,phase=backward,kind=kill;rank=1,step=8,phase=forward,kind=kill,attempt=1"
    result = run_jit(tmp_path / "ckpt", fault=faults, max_restarts=1)
    assert result.returncode != 0
    assert "jitckpt recovery report" in result.output
    assert "the job failed" in result.output
    report = result.report
    assert report["outcome"] == "failed" and report["restarts"] == 1
    assert len(report["failures"]) == 2
    # the second JIT checkpoint is on disk, ready for a manual rerun
    assert (tmp_path / "ckpt" / "step-00000008").is_dir()
    assert "Traceback (most recent call last):\n  File \"" + "/jitckpt/launcher.py" not in result.output


# BatchNorm's running statistics are buffers that every forward pass updates:
# the save must hold them as of the start of the saved minibatch.
BATCHNORM_MATRIX = [("kill", "backward", 6), ("hang", "allreduce", 10), ("kill", "optimizer", 13)]


@pytest.fixture(scope="module")
def fault_free_sha_batchnorm() -> str:
    return reference_sha(args=["--batchnorm"])


@pytest.mark.parametrize("kind,phase,step", BATCHNORM_MATRIX, ids=[f"{k}-{p}-{s}" for k, p, s in BATCHNORM_MATRIX])
def test_bit_exact_with_batchnorm_statistics(tmp_path, fault_free_sha_batchnorm, kind, phase, step):
    result = run_jit(tmp_path / "ckpt", fault=f"rank=2,step={step},phase={phase},kind={kind}", args=["--batchnorm"])
    _check_single_recovery(result, fault_free_sha_batchnorm, kind, phase, step)
    saved = step + 1 if phase == "optimizer" else step
    metas = [json.loads(p.read_text()) for p in (tmp_path / "ckpt").glob(f"step-{saved:08d}/rank-*/jitckpt-meta.json")]
    assert len(metas) == 2 and all(m["module_buffers_rewound"] for m in metas), metas
