"""Failures at an epoch's end, in the most common loop: a plain DataLoader made anew each epoch, drawing as it goes.

Between one epoch's last optimizer step and the next epoch's first batch the
script makes a new DataLoader iterator, which draws its base seed (and, with
workers, seeds them from it) from the global generator; an evaluation may
draw there too.  The RNG state a redone minibatch starts with is recorded at
the step before; the fault-free run drew between.  Before, every one of the
bit-exact cases below ended with other parameters than the fault-free run
and reported ``completed`` (tests/user_programs/epoch_boundary.py: 3 ranks,
4 minibatches per epoch, so minibatch 8 starts epoch 2).
"""

from __future__ import annotations

import pytest

from conftest import REPO, reference_sha, run_jit

pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "user_programs" / "epoch_boundary.py"
NPROC = 3


def _reference(extra: list[str]) -> str:
    return reference_sha(nproc=NPROC, args=extra, script=SCRIPT)


@pytest.mark.parametrize("workers, die", [
    ("0", "1:8:kill-forward"),   # the rank made the new iterator and took its first batch, then died
    ("0", "2:7:stop-epoch-end"),  # frozen after its last step of epoch 1, before the new iterator
    ("2", "0:8:kill-forward"),   # workers seeded from the new iterator's base seed, augmenting in them
], ids=["in-process-killed-at-the-first-batch", "in-process-frozen-between-epochs", "workers-killed-at-the-first-batch"])
def test_an_epochs_first_minibatch_is_redone_with_the_random_numbers_of_the_fault_free_run(tmp_path, workers, die):
    extra = ["--workers", workers]
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=SCRIPT, args=[*extra, "--die", die])
    assert result.returncode == 0, result.output[-4000:]
    (failure,) = result.report["failures"]
    assert failure["resumed_from_minibatch"] == 8 and failure["minibatches_redone"] == 1, failure
    assert result.report["outcome"] == "completed", result.report
    assert result.sha == _reference(extra), result.output[-4000:]


@pytest.mark.parametrize("extra, die", [
    (["--eval-before-loop"], "1:5:kill-forward"),
    (["--eval-before-loop"], "1:6:kill-step"),
    (["--barrier-before-loop", "--no-augment"], "1:5:kill-forward"),
    (["--wrap-after-load", "--barrier-before-loop", "--no-augment"], "2:6:kill-step"),
], ids=["evaluation-killed-before-a-forward", "evaluation-killed-before-a-step", "barrier-no-augmentation",
        "ddp-wrapped-after-load-and-barrier"])
def test_what_the_script_runs_before_its_loop_is_not_the_redone_minibatch(tmp_path, extra, die):
    """After jit_get_checkpoint_path() and the load, the script evaluates where it starts (eval mode, no_grad,
    an all-reduce of its metric), or waits in a barrier, or wraps DDP then (its broadcast), then skips to its
    position in the epoch by iterating.  The redone minibatch's RNG state is put back at its fetches and its
    first training forward, never at an evaluation's forward or at a collective, and those do not end the check
    of its data.  Before, the evaluation's forward or the collective took the state, the new iterator drew its
    seed from it, and the fetches after it did not put it back: with augmented samples the job stopped, without
    (only the dropout masks differ) it reported ``completed`` with other parameters."""
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=SCRIPT, args=[*extra, "--die", die])
    assert result.returncode == 0, result.output[-4000:]
    (failure,) = result.report["failures"]
    assert failure["minibatches_redone"] == 1, failure
    assert result.sha == _reference(extra), result.output[-4000:]


def test_an_evaluation_that_draws_between_epochs_is_repeated_from_the_ranks_own_record(tmp_path):
    """The evaluation after epoch 1 draws its noise from the global generator, then the ranks meet in its
    all-reduce.  Rank 1 dies at minibatch 8's forward, after the evaluation and the new iterator: every rank
    recorded its state right before that iterator, and puts it back there."""
    extra = ["--eval-draws"]
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=SCRIPT, args=[*extra, "--die", "1:8:kill-forward"])
    assert result.returncode == 0, result.output[-4000:]
    assert result.report["failures"][0]["resumed_from_minibatch"] == 8, result.report
    assert result.sha == _reference(extra), result.output[-4000:]


def test_draws_between_epochs_that_a_rank_never_saw_stop_the_job(tmp_path):
    """Rank 2 freezes before the evaluation; the others draw its noise and wait in its all-reduce, where
    they save minibatch 8.  The resumed run does not evaluate again, and no rank knows its state after those
    draws: the job stops with the reason (before: ``completed`` with other parameters); with
    --allow-inexact-resume it goes on and says so."""
    extra = ["--eval-draws"]
    args = [*extra, "--die", "2:7:stop-epoch-end"]
    stopped = run_jit(tmp_path / "ckpt", nproc=NPROC, script=SCRIPT, args=args)
    assert stopped.returncode == 77, (stopped.returncode, stopped.output[-4000:])
    assert stopped.report["outcome"] == "stopped", stopped.report
    assert "random numbers were drawn between minibatch 7's optimizer step and that iterator" in stopped.output, \
        stopped.output[-4000:]
    allowed = run_jit(tmp_path / "ckpt-allowed", nproc=NPROC, script=SCRIPT, args=args,
                      jit_options=["--allow-inexact-resume"])
    assert allowed.returncode == 0, allowed.output[-4000:]
    assert allowed.report["outcome"] == "completed, not bit-exact", allowed.report
    assert allowed.sha is not None and allowed.sha != _reference(extra), allowed.output[-4000:]


def test_a_save_before_an_epoch_ends_evaluation_that_earlier_epochs_ran_stops_the_job(tmp_path):
    """The script all-reduces its loss after every optimizer step, then evaluates (drawing noise) at each epoch's
    end.  Rank 1 dies between its backward and its optimizer step of minibatch 7, the last of epoch 1; the
    others step and wait in the logging all-reduce, where they save minibatch 8, before the evaluation.  No rank
    sees that evaluation's draws, and the resumed run does not evaluate again; but epoch 0's end drew at the
    same point: the job stops with the reason (before: ``completed`` with other parameters)."""
    extra = ["--eval-draws", "--log-allreduce"]
    stopped = run_jit(tmp_path / "ckpt", nproc=NPROC, script=SCRIPT, args=[*extra, "--die", "1:7:kill-step"])
    assert stopped.returncode == 77, (stopped.returncode, stopped.output[-4000:])
    assert stopped.report["outcome"] == "stopped", stopped.report
    assert "where every earlier epoch's end drew random numbers (an evaluation?)" in stopped.output, \
        stopped.output[-4000:]


@pytest.mark.parametrize("extra, exact", [([], True), (["--eval-draws"], False)], ids=["no-evaluation", "evaluation"])
def test_a_save_before_the_first_epochs_end_is_exact_or_found_out_at_the_next_epochs_end(tmp_path, extra, exact):
    """Rank 1 dies before its optimizer step of minibatch 3, the last of epoch 0; the others step and save
    minibatch 4 in the logging all-reduce, before the epoch's end.  No rank saw that gap, and no epoch has ended
    before it to tell whether it draws.  Without an evaluation there the job ends bit-exact.  With one that
    draws, the resumed run (which does not evaluate again) has diverged: before, it ended ``completed`` with
    other parameters; now the next epoch's end, which draws, shows it, and the job stops with the reason."""
    args = [*extra, "--log-allreduce"]
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=SCRIPT, args=[*args, "--die", "1:3:kill-step"])
    if exact:
        assert result.returncode == 0, result.output[-4000:]
        assert result.report["failures"][0]["resumed_from_minibatch"] == 4, result.report
        assert result.sha == _reference(args), result.output[-4000:]
    else:
        assert result.returncode == 77, (result.returncode, result.output[-4000:])
        assert result.report["outcome"] == "stopped", result.report
        assert "but the same kind of gap before minibatch 8 drew" in result.output, result.output[-4000:]
        assert "final parameters sha256" not in result.output


def test_a_save_before_an_epochs_end_that_draws_only_every_other_epoch_stops_the_job(tmp_path):
    """An evaluation after every other epoch (0, 2): rank 1 dies before its last step of epoch 1, the others save
    minibatch 8 in the logging all-reduce.  The only epoch end seen so far, epoch 0's, drew: the job stops with
    the reason rather than guess (here epoch 1's end would not have drawn: a refusal, never a wrong answer; had
    epoch 1's end been seen too, some drawing and some not, it would stop as well)."""
    args = ["--eval-draws", "--eval-every", "2", "--log-allreduce", "--die", "1:7:kill-step"]
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=SCRIPT, args=args)
    assert result.returncode == 77, (result.returncode, result.output[-4000:])
    assert "where every earlier epoch's end drew random numbers" in result.output, result.output[-4000:]


def test_an_assumption_about_an_unseen_gap_survives_a_second_failure(tmp_path):
    """As in the first-epoch case with an evaluation: minibatch 4 is resumed on the assumption that epoch 0's end
    drew nothing.  Before epoch 1 ends, rank 0 is killed in the forward of minibatch 5 (second attempt), and the
    job resumes from 5.  The assumption is carried in the records of minibatch 5 and still decided at epoch 1's
    end, which draws: the job stops (before this was carried, it ended ``completed`` with other parameters)."""
    args = ["--eval-draws", "--log-allreduce", "--die", "1:3:kill-step"]
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=SCRIPT, args=args, max_restarts=3,
                     fault="rank=0,step=5,phase=forward,kind=kill,attempt=1")
    assert result.returncode == 77, (result.returncode, result.output[-4000:])
    assert [f["resumed_from_minibatch"] for f in result.report["failures"][:2]] == [4, 5], result.report
    assert "an earlier resume (before the one at minibatch 5) took it that nothing drew" in result.output, \
        result.output[-4000:]


def test_a_script_one_step_behind_with_augmented_samples_is_stopped_by_the_sample_indices(tmp_path):
    """The script advances the step counter that save() stores only after its logging all-reduce: a save made
    there (rank 1 died before its step of minibatch 5) resumes one minibatch behind, and would apply minibatch 5
    twice.  Its samples are augmented with the redone run's random numbers, so the batch differs from the
    failed run's minibatch 5 by what it holds; before, the job ended ``completed`` with other parameters.  The
    sample indices of the batch are those of minibatch 5: the job stops with the advice."""
    args = ["--log-allreduce", "--count-after-logging", "--die", "1:5:kill-step"]
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=SCRIPT, args=args)
    assert result.returncode == 77, (result.returncode, result.output[-4000:])
    assert "the sample indices of its data loader's batch were those of minibatch 5" in result.output, \
        result.output[-4000:]
    assert "jitckpt.current_step()" in result.output


def test_a_rank_that_freezes_in_its_own_save_does_not_hold_the_teardown(tmp_path):
    """Rank 1 is killed at minibatch 5; rank 2 freezes a second into its JIT save, after torchrun's teardown
    began.  Before, the teardown waited the whole --save-grace for it (30 s here) and then torchrun killed
    it; jit-run's agent now kills a worker it sees stopped during the grace period, and rank 0's save is
    enough to resume bit-exact."""
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=SCRIPT, args=["--die", "1:5:kill-forward",
                                                                           "--freeze-in-save", "2"])
    assert result.returncode == 0, result.output[-4000:]
    (failure,) = result.report["failures"]
    assert "rank 2: hung (process frozen), killed by jit-run at teardown" in failure["what_failed"], failure
    assert failure["resumed_from_minibatch"] == 5, failure
    assert result.sha == _reference([]), result.output[-4000:]


@pytest.mark.parametrize("die", ["1:11:kill-epoch-end", "2:11:kill-step"], ids=["after-it-ran-out", "before-its-last-step"])
def test_a_loader_shuffling_from_the_scripts_own_generator_resumes_an_epoch_bit_exact(tmp_path, die):
    """``DataLoader(shuffle=True, generator=g)`` with ``g`` made once: its ``RandomSampler`` draws one more
    permutation from ``g`` when the epoch's iterator runs out, after the epoch's last step (12 minibatches per
    epoch here).  A rank killed after that (at the epoch's end) resumes with ``g`` as it left it; one killed
    before its last optimizer step never drew it, and the draw is made again before the new epoch's iterator.
    Before, both ended ``completed`` with other parameters (the new epoch's permutation came from ``g`` one
    draw behind)."""
    extra = ["--loader-generator"]
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=SCRIPT, args=[*extra, "--die", die])
    assert result.returncode == 0, result.output[-4000:]
    (failure,) = result.report["failures"]
    assert failure["resumed_from_minibatch"] == 12 and failure["minibatches_redone"] == 1, failure
    assert result.sha == _reference(extra), "parameters differ from the fault-free run\n" + result.output[-4000:]


def test_gap_records_are_data_only_and_refuse_what_they_do_not_know():
    """The record of a minibatch's start is read back from checkpoints (untrusted): a fixed layout, every flag
    round-trips, a short record or a damaged or unannounced state is refused."""
    from jitckpt.worker import rng_state
    from jitckpt.worker.minibatch_gap import MAGIC, GapRecord, GapRecordError

    state = rng_state.capture()
    for record in (GapRecord(), GapRecord(7, state, refined=True), GapRecord(None, None, draws=True, evaluated=True),
                   GapRecord(3, None, ran_out=b"", own_moved=True, likely_draws=True),
                   GapRecord(3, state, ran_out=b"\0\0"),
                   GapRecord(3, None, before_evaluation=state, drew_before_evaluation=True, saved=True),
                   GapRecord(None, None, history=1 << 12), GapRecord(3, state, history=(1 << 11) | (1 << 14) | (1 << 16)),
                   GapRecord(None, None, refined=True, draws=True, at_step=state)):
        assert GapRecord.decode(record.encode()) == record
    from jitckpt.worker.minibatch_gap import MAGIC2, MAGIC3, _HEAD2, _HEAD3

    payload = GapRecord(7, state, evaluated=True).encode()
    old = MAGIC2 + _HEAD2.pack(7, 1 | 8 | 16, len(state), 0, 0) + state  # (the previous version's record)
    assert GapRecord.decode(old) == GapRecord(7, state, evaluated=True)
    three = MAGIC3 + _HEAD3.pack(7, 1 | 8 | 16 | (1 << 11), len(state), 0, 0) + state  # (and the one after it)
    assert GapRecord.decode(three) == GapRecord(7, state, evaluated=True, history=1 << 11)
    flags = len(MAGIC) + 4
    for bad in (payload[:flags], b"JITGAP0\0" + payload[len(MAGIC):],
                payload[:flags] + bytes([payload[flags] & ~8]) + payload[flags + 1:],   # a state, not announced
                payload[:-3],                                                           # a short one
                GapRecord(3, None, ran_out=b"\1\0").encode(),                          # a damaged own state
                GapRecord(3, None, before_evaluation=state[:-5]).encode(),             # a damaged capture
                GapRecord(None, None, at_step=state[:-5]).encode(),                     # ... at the step
                payload[:flags + 2] + bytes([payload[flags + 2] | 0x80]) + payload[flags + 3:]):  # an unknown flag
        with pytest.raises(GapRecordError):
            GapRecord.decode(bad)
