"""A JIT save never holds a step half applied (paper §3.3), with the optimizers scripts really use.

Real 3-rank torchrun jobs under jit-run (gloo, CPU), scripts in
tests/user_programs/ written the way a user writes them, each with a fault
it places in its own code in the first attempt.  Every job must end with the
final parameters of a fault-free plain torchrun run, bit for bit, and every
JIT checkpoint it wrote must hold exactly the state its label claims: the
script's own step counter equal to the label, and the parameters those of
the fault-free run at the start of that minibatch (``--trace``).

- ZeroRedundancyOptimizer: its step updates the local shard, then broadcasts
  the parameters.  A peer lost in between leaves a half-applied step: no
  save (the job falls back); a preemption notice there lets the step finish
  and saves the next minibatch.
- LBFGS (``optimizer.step(closure)``): a peer lost in the closure's first
  evaluation (nothing applied) is saved as the start of the minibatch; in a
  later one (parameters moved) the save is refused.
- A GAN (two optimizers): a minibatch spans both steps; a peer lost between
  them is never saved as "D at i+1, G at i".
- GradScaler skipping steps (inf gradients): the count stays the script's.
- A DataLoader worker killed on one rank: its error surfaces anywhere in
  the main thread, also inside a collective after the update.
- A preemption while the training thread waits in a collective jitckpt does
  not track: the save does not race the forward pass that follows it.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from conftest import REPO, TEARDOWN_ABORT, JobResult, run_jit, run_plain

sys.path.insert(0, str(REPO / "tests" / "user_programs"))

pytestmark = pytest.mark.slow

PROGRAMS = REPO / "tests" / "user_programs"
NPROC = 3
TRACE = re.compile(r"^trace minibatch (\d+) sha256 ([0-9a-f]{64})$", re.M)


class Reference:
    """A fault-free plain torchrun run: its final checksum and its parameters at every minibatch start."""

    def __init__(self, script: str, args: list[str]) -> None:
        self.script = PROGRAMS / script
        self.args = args
        for _ in range(3):  # as conftest.reference_sha: tolerate torch's teardown abort, retry other failures
            result = run_plain(NPROC, [*args, "--trace"], self.script)
            if result.sha and (result.returncode == 0 or TEARDOWN_ABORT in result.output):
                break
        else:
            raise AssertionError("the fault-free reference run failed three times:\n" + result.output[-3000:])
        self.sha = result.sha
        self.starts = {int(step): sha for step, sha in TRACE.findall(result.output)}

    def run(self, tmp_path: Path, die: str, *extra: str, timeout: float = 240) -> JobResult:
        return run_jit(tmp_path / "ckpt", nproc=NPROC, script=self.script, args=[*self.args, *extra, "--die", die],
                       timeout=timeout)

    def check(self, result: JobResult, ckpt: Path) -> list[int]:
        """Bit-exact end, and every JIT checkpoint holds what its label says; returns the labels found."""
        import torch
        from jobkit import STATE_FILE, parameters_sha256

        assert result.returncode == 0, result.output[-4000:]
        labels = []
        for state_file in sorted(ckpt.glob(f"step-*/rank-*/{STATE_FILE}")):
            label = int(state_file.parent.parent.name.split("-")[1])
            state = torch.load(state_file)
            where = f"{state_file.relative_to(ckpt)}"
            assert state["step"] == label, f"{where}: the script was at minibatch {state['step']}\n" + result.output[-4000:]
            assert parameters_sha256(state["models"]) == self.starts[label], (
                f"{where} does not hold the start of minibatch {label} (a half-applied step?)\n" + result.output[-4000:])
            labels.append(label)
        assert result.sha == self.sha, "parameters differ from the fault-free run\n" + result.output[-4000:]
        return labels


def _failure(result: JobResult) -> dict:
    (failure,) = result.report["failures"]
    return failure


# ----- ZeroRedundancyOptimizer ---------------------------------------------------------------

ZERO_STEP = 5


@pytest.fixture(scope="module")
def zero() -> Reference:
    return Reference("zero_step.py", ["--steps", "9", "--accum", "1"])


@pytest.mark.parametrize("where", ["in-step", "stop-in-step", "before-step"])
def test_zero_peer_lost_in_its_step_is_never_saved_half_applied(tmp_path, zero, where):
    """Rank 2 is lost inside ZeRO's step (between its local update and the parameter broadcast)
    or just before it.  Its shard has no copy but its snapshot in the memory tier, from which every
    rank resumes (tests/test_memory_tier.py); what matters here is that the healthy ranks never
    commit their half-applied state."""
    result = zero.run(tmp_path, f"2:{ZERO_STEP}:{where}")
    zero.check(result, tmp_path / "ckpt")
    if where != "before-step":  # (there a peer may still park before its step: a consistent save)
        assert "refusing to save minibatch" in result.output, result.output[-4000:]


def test_zero_preempted_in_its_step_finishes_the_step_and_saves_the_next_minibatch(tmp_path, zero):
    result = zero.run(tmp_path, f"0:{ZERO_STEP}:preempt-in-step")
    labels = zero.check(result, tmp_path / "ckpt")
    assert labels == [ZERO_STEP + 1] * NPROC, labels
    failure = _failure(result)
    assert failure["resumed_from_minibatch"] == ZERO_STEP + 1, failure


# ----- LBFGS: a closure optimizer -----------------------------------------------------------

@pytest.fixture(scope="module")
def lbfgs() -> Reference:
    return Reference("closure_step.py", ["--steps", "8", "--dropout", "0"])


def test_closure_peer_lost_before_any_update_saves_the_start_of_the_minibatch(tmp_path, lbfgs):
    result = lbfgs.run(tmp_path, "2:4:1")
    labels = lbfgs.check(result, tmp_path / "ckpt")
    assert labels == [4, 4], labels
    failure = _failure(result)
    assert failure["resumed_from_minibatch"] == 4 and failure["minibatches_redone"] == 1, failure


def test_closure_peer_lost_after_an_update_is_refused(tmp_path, lbfgs):
    result = lbfgs.run(tmp_path, "2:4:2")
    assert lbfgs.check(result, tmp_path / "ckpt") == []
    assert "refusing to save minibatch 4" in result.output, result.output[-4000:]
    assert _failure(result)["restarted_fresh"], result.report


# ----- a GAN: two optimizers per minibatch --------------------------------------------------

@pytest.fixture(scope="module")
def gan() -> Reference:
    return Reference("gan.py", ["--steps", "9"])


@pytest.mark.parametrize("where,resumed", [("before-d-backward", 5), ("between-steps", None), ("after-g-step", 6)])
def test_gan_minibatch_spans_both_optimizers(tmp_path, gan, where, resumed):
    result = gan.run(tmp_path, f"2:5:{where}")
    labels = gan.check(result, tmp_path / "ckpt")
    failure = _failure(result)
    if resumed is None:  # D at 6 with G at 5 is no minibatch start: refused, the job starts afresh
        assert labels == [] and failure["restarted_fresh"], (labels, failure)
        assert "refusing to save minibatch 5" in result.output, result.output[-4000:]
    else:
        assert labels == [resumed, resumed], labels
        assert failure["resumed_from_minibatch"] == resumed and failure["minibatches_redone"] == 1, failure
        assert "no RNG state for rank" not in result.output


# ----- GradScaler skipping steps -------------------------------------------------------------

def test_steps_the_grad_scaler_skips_still_count(tmp_path):
    """Inf gradients in minibatches 3 and 7 make the scaler skip those steps; rank 1 dies between
    backward and scaler.step of minibatch 7.  Its replicas save the start of 8, labelled 8."""
    amp = Reference("amp_skipped_steps.py", ["--steps", "10", "--inf-steps", "3,7"])
    result = amp.run(tmp_path, "1:7:between-backward-and-step")
    labels = amp.check(result, tmp_path / "ckpt")
    assert labels == [8, 8], labels
    failure = _failure(result)
    assert failure["resumed_from_minibatch"] == 8 and failure["minibatches_redone"] == 1, failure
    assert "no RNG state for rank" not in result.output


# ----- a DataLoader worker killed ------------------------------------------------------------

def test_data_loader_worker_killed_mid_step(tmp_path):
    """Rank 1's DataLoader worker is killed right before its optimizer step; torch's error surfaces in
    rank 1's main thread wherever it is (often inside the all-reduce of the optimizer's post-hook,
    after the update).  Rank 1 never commits that state; its peers save the start of minibatch 6."""
    loader = Reference("loader_worker_dies.py", ["--steps", "9", "--accum", "1"])
    result = loader.run(tmp_path, "1:5:before-step")
    labels = loader.check(result, tmp_path / "ckpt")
    assert 5 not in labels, labels
    assert "DataLoader worker" in result.output, result.output[-4000:]


# ----- an untracked collective and the "in collective" heuristic ----------------------------

def test_preempted_while_blocked_in_an_untracked_collective(tmp_path):
    """Rank 0 is preempted and then blocks in ``dist.monitored_barrier()`` (not tracked), its peers 1.5 s
    late; its save takes 2 s.  The old rule (innermost frame in torch/distributed: safe) let the save
    run while the barrier completed and the forward pass updated the BatchNorm statistics it was
    writing; now the thread parks at that forward."""
    bn = Reference("preempted_in_barrier.py", ["--steps", "8", "--accum", "1", "--batchnorm", "--slow-save", "2"])
    result = bn.run(tmp_path, "0:4:preempt")
    labels = bn.check(result, tmp_path / "ckpt")
    assert labels == [4, 4, 4], labels
    assert _failure(result)["resumed_from_minibatch"] == 4
