"""Failures placed in the user's own code, outside every jitckpt hook, end bit-exact.

A rank that dies between the end of its backward and the start of
``optimizer.step()`` (gradient clipping, ``loss.item()``) never reaches the
optimizer pre-step hook.  Its replicas finish minibatch i and save i+1, so the
dead rank's own RNG state for i+1 must already have been captured: jitckpt
does that when minibatch i's first gradient collective is issued (its forward
passes are over by then).
"""

from __future__ import annotations


import pytest

from conftest import REPO, reference_sha, run_jit

pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "user_programs" / "clip_and_die.py"
ARGS = ["--steps", "16", "--accum", "2"]


def _fault_free_sha(*extra: str) -> str:
    return reference_sha(nproc=3, args=[*ARGS, *extra], script=SCRIPT)


@pytest.fixture(scope="module")
def clip_fault_free_sha() -> str:
    return _fault_free_sha()


def test_random_numbers_drawn_before_the_first_minibatch_do_not_shift_the_redone_one(tmp_path):
    """The script creates a DataLoader iterator (a draw from the global generator) after
    jit_get_checkpoint_path() and before its first minibatch: the redone minibatch must still
    draw the dropout masks of the fault-free run."""
    expected = _fault_free_sha("--loader-before-loop")
    result = run_jit(tmp_path / "ckpt", nproc=3, script=SCRIPT, args=[*ARGS, "--loader-before-loop"],
                     fault="rank=1,step=6,phase=forward,kind=kill")
    assert result.returncode == 0, result.output[-4000:]
    (failure,) = result.report["failures"]
    assert failure["resumed_from_minibatch"] == 6 and failure["minibatches_redone"] == 1, failure
    assert result.sha == expected, "parameters differ from the fault-free run\n" + result.output[-4000:]


@pytest.mark.parametrize("how", ["kill", "stop"])
def test_death_between_backward_and_step_resumes_with_the_right_random_numbers(tmp_path, clip_fault_free_sha, how):
    step = 6
    result = run_jit(tmp_path / "ckpt", nproc=3, script=SCRIPT, args=[*ARGS, "--die", f"1:{step}:{how}"])
    assert result.returncode == 0, result.output[-4000:]
    (failure,) = result.report["failures"]
    # The replicas finished minibatch 6 (its all-reduce was complete) and saved 7.
    assert failure["resumed_from_minibatch"] == step + 1, failure
    assert "no RNG state for rank" not in result.output, result.output[-4000:]
    assert result.sha == clip_fault_free_sha, "parameters differ from the fault-free run\n" + result.output[-4000:]


def test_a_peer_frozen_before_an_object_collective_is_caught_by_the_hang_timeout(tmp_path):
    """broadcast_object_list calls broadcast through distributed_c10d's own namespace: it must be watched too."""
    expected = _fault_free_sha("--object-collective")
    result = run_jit(tmp_path / "ckpt", nproc=3, script=SCRIPT, args=[*ARGS, "--object-collective", "--die", "1:6:stop-before-broadcast"],
                     timeout=240)
    assert result.returncode == 0, result.output[-4000:]
    (failure,) = result.report["failures"]
    assert any(d["how"] == "hang" for d in failure["detected_by"]), failure
    assert failure["resumed_from_minibatch"] == 6 and failure["minibatches_redone"] == 1, failure
    assert result.sha == expected, "parameters differ from the fault-free run\n" + result.output[-4000:]
