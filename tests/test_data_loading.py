"""Data loading: a StatefulDataLoader script written as torchdata documents it resumes bit-exact under jit-run.

tests/user_programs/stateful_loader.py is a 3-rank DDP job whose loader has 2
workers that augment every sample at random (torch and Python generators),
a shuffled DistributedSampler and per-rank seeds, with dropout.  It saves and
loads ``loader.state_dict()`` itself.  A rank kills or freezes itself after
fetching a batch (mid-epoch, at the first batch of an epoch), or dies inside
its optimizer step (mid-epoch, or in an epoch's last minibatch, so that the
replicas save the start of a new epoch), after taking a batch between backward() and the step, or
while a loader has an iterator that has not yielded yet; each run must end with the fault-free run's
parameters.
Without the torchdata adapter (jitckpt/adapters/torchdata_loader.py) each of
these ends with wrong parameters while reporting success: the saved position
is one batch ahead, a replacement rank gets its replica's seeds, and the
workers' generators restart from the seed.
"""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch

from conftest import REPO, plant_code, reference_sha, run_jit
from jitckpt.store import safe_codec

SCRIPT = REPO / "tests" / "user_programs" / "stateful_loader.py"
NPROC = 3


@pytest.fixture(scope="module")
def loader_reference() -> dict[tuple[str, ...], str]:
    """Fault-free plain-torchrun hashes, per script-argument tuple (computed on first use)."""
    return {}


def _reference(cache: dict[tuple[str, ...], str], args: list[str]) -> str:
    key = tuple(args)
    if key not in cache:
        cache[key] = reference_sha(NPROC, args, SCRIPT)
    return cache[key]


@pytest.mark.parametrize(
    "die, fault, extra",
    [
        pytest.param("1:5:kill", "", []),  # mid-epoch, SIGKILL (loader workers of a warm worker)
        ("2:8:stop", "", []),  # the first batch of the second epoch, frozen (hang)
        ("", "rank=1,step=5,phase=optimizer,kind=kill", []),  # inside the optimizer step: replicas save i+1
        ("", "rank=0,step=7,phase=optimizer,kind=kill", []),  # ... of an epoch's last minibatch: i+1 is a new epoch
        ("1:5:kill", "", ["--workers", "0"]),  # augmentation drawn in the main process
    ],
    ids=["kill-mid-epoch", "hang-first-batch-of-epoch", "kill-in-optimizer-step", "kill-in-last-step-of-epoch",
         "no-workers"],
)
def test_stateful_dataloader_script_resumes_bit_exact(tmp_path, loader_reference, die, fault, extra):
    args = [*extra, *(["--die", die] if die else [])]
    expected = _reference(loader_reference, extra)
    result = run_jit(tmp_path / "ckpt", fault=fault, nproc=NPROC, args=args, script=SCRIPT)
    assert result.returncode == 0, result.output[-4000:]
    # every rank's loader got the rank's own state (or, at an epoch's start, its own seeds again)
    assert result.output.count("data loader #0: ") >= NPROC, result.output[-4000:]
    assert "were lost" not in result.output, result.output[-4000:]
    assert result.sha == expected, result.output[-4000:]


# 72 samples over 3 ranks in batches of 4: 6 minibatches per epoch, so minibatch 9 is the fourth of epoch 1.
SIX_PER_EPOCH = ["--samples", "72"]


@pytest.mark.parametrize("where", ["hook", "wrapped"])
def test_a_rank_killed_inside_its_optimizer_step_in_the_second_epoch_resumes_with_its_own_loader_state(
        tmp_path, loader_reference, where):
    """Rank 0 SIGKILLs itself inside ``optimizer.step()`` of minibatch 9 (the fourth of epoch 1); its replicas
    save minibatch 10, which rank 0 never reached.  ``hook``: from the optimizer's own step pre-hook, after
    torch's global ones; ``wrapped``: in a wrapper the script put around ``optimizer.step``, before any hook.
    Before the fix the wrapped kill left rank 0 with no loader state for minibatch 10: it took rank 1's
    position, seeds and worker RNG, and the job reported success with other parameters."""
    expected = _reference(loader_reference, SIX_PER_EPOCH)
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=SCRIPT,
                     args=[*SIX_PER_EPOCH, "--die-in-step", f"0:9:{where}"])
    assert "rank 0: dying (kill) inside optimizer.step() of minibatch 9" in result.output, result.output[-4000:]
    assert result.returncode == 0, result.output[-4000:]
    assert "JIT checkpoint of minibatch 10 committed" in result.output, result.output[-4000:]
    for rank in range(NPROC):
        assert (f"[jitckpt rank {rank}] data loader #0: resuming with rank {rank}'s own position, seeds and worker "
                f"RNG for minibatch 10") in result.output, result.output[-4000:]
    assert result.report is not None and result.report["outcome"] == "completed", result.report
    assert result.sha == expected, result.output[-4000:]


def test_loaders_that_had_not_moved_or_not_yielded_resume_with_the_ranks_own_state(tmp_path, loader_reference):
    """Two more loaders mixed into the loss, their iterators made before training: ``aux`` last gave a batch at
    minibatch 3, ``late`` gives its first at minibatch 9.  Rank 1 dies in minibatch 5: its replacement needs its
    own state of both, which no fetch in minibatch 5 recorded.  Before, the stash held only the loaders that
    fetched in the minibatch: the replacement took its replica's ``aux`` and ``late`` states and the job ended
    with other parameters."""
    expected = _reference(loader_reference, ["--aux"])
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=SCRIPT, args=["--aux", "--die", "1:5:kill"])
    assert result.returncode == 0, result.output[-4000:]
    for loader in (1, 2):
        assert f"[jitckpt rank 1] data loader #{loader}: resuming with rank 1's own position" in result.output, \
            result.output[-4000:]
    assert result.sha == expected, result.output[-4000:]


def lose_rank_state(step_dir, folder: str, rank: int) -> None:
    """What a lost host leaves: no copy of ``rank``'s own state of one kind (``folder``: ``jitckpt-loader``,
    ``jitckpt-rng``) in any replica's checkpoint of the step (each copy's file and metadata entry removed)."""
    name = f"{folder}/rank-{rank:05d}.bin"
    for replica in sorted(step_dir.glob("rank-*")):
        meta_path = replica / "jitckpt-meta.json"
        meta = json.loads(meta_path.read_text())
        if name in meta["files"]:
            del meta["files"][name]
            (replica / name).unlink()
            meta_path.write_text(json.dumps(meta))
    assert not list(step_dir.glob(f"rank-*/{name}"))


def test_a_rank_whose_own_loader_state_is_lost_stops_the_job_with_the_reason(tmp_path, loader_reference):
    """Rank 0's own loader state for the resumed minibatch is in no checkpoint and no stash (its host lost):
    the job stops at once, naming the rank, the minibatch and the option, and the report says why; it never
    resumes with a replica's data position.  With --allow-inexact-resume it goes on, and the report says
    "not bit-exact"."""
    ckpt = tmp_path / "ckpt"
    args = [*SIX_PER_EPOCH, "--die-in-step", "0:9:wrapped"]
    first = run_jit(ckpt, nproc=NPROC, max_restarts=0, script=SCRIPT, args=args)
    assert first.returncode != 0 and (ckpt / "step-00000010").is_dir(), first.output[-4000:]
    assert not (ckpt / "step-00000010" / "rank-00000").exists()  # rank 0 died: only its replicas saved
    lose_rank_state(ckpt / "step-00000010", "jitckpt-loader", 0)
    kept = tmp_path / "ckpt-copy"
    shutil.copytree(ckpt, kept)

    stopped = run_jit(ckpt, nproc=NPROC, max_restarts=2, script=SCRIPT, args=SIX_PER_EPOCH)
    assert stopped.returncode == 77, (stopped.returncode, stopped.output[-4000:])  # jit-run's status for a stop
    assert "final parameters sha256" not in stopped.output, stopped.output[-4000:]
    assert "[jitckpt rank 0] data loader #0: resuming with" not in stopped.output, stopped.output[-4000:]
    assert ("rank 0's own data-loader state (data loader #0) for minibatch 10 is in no checkpoint and no "
            "stash") in stopped.output, stopped.output[-4000:]
    assert "--allow-inexact-resume" in stopped.output, stopped.output[-4000:]
    report = stopped.report
    assert report is not None and report["outcome"] == "stopped", report
    assert report["attempts"] == 1, report  # stopped at once: torchrun's restarts are not spent on it
    assert any("rank 0" in why and "minibatch 10" in why for why in report["stopped_because"]), report
    assert "outcome: stopped" in stopped.output and "not bit-exact" in stopped.output, stopped.output[-3000:]

    allowed = run_jit(kept, nproc=NPROC, max_restarts=0, script=SCRIPT, args=SIX_PER_EPOCH,
                      jit_options=["--allow-inexact-resume"])
    assert allowed.returncode == 0, allowed.output[-4000:]
    assert allowed.report is not None and allowed.report["outcome"] == "completed, not bit-exact", allowed.report
    assert any("rank 0" in why for why in allowed.report["not_bit_exact"]), allowed.report
    assert "completed, not bit-exact" in allowed.output, allowed.output[-3000:]


@pytest.mark.parametrize("workers", ["2", "0"], ids=["worker-augmentation", "in-process-augmentation"])
def test_a_batch_taken_after_backward_is_in_the_state_of_a_rank_killed_inside_its_optimizer_step(
        tmp_path, loader_reference, workers):
    """After backward() of minibatch 5 the script takes the loader's next batch to log a metric on it (a probe),
    then rank 0 is SIGKILLed in a wrapper around ``optimizer.step``, before torch's step hooks; its replicas save
    minibatch 6, which starts after the probe batch.  Before, rank 0's own state for minibatch 6 was the one
    recorded at its all-reduce, before the probe: its replacement trained minibatch 6 on the probe batch (and,
    with the batch augmented in the main process, drew from a state before its augmentation), and the job
    reported success with other parameters."""
    extra = ["--workers", workers, "--probe-at", "5"]
    expected = _reference(loader_reference, extra)
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=SCRIPT, args=[*extra, "--die-in-step", "0:5:wrapped"])
    assert "rank 0: dying (kill) inside optimizer.step() of minibatch 5" in result.output, result.output[-4000:]
    assert result.returncode == 0, result.output[-4000:]
    assert "[jitckpt rank 0] data loader #0: resuming with rank 0's own position" in result.output, \
        result.output[-4000:]
    assert result.report["outcome"] == "completed", result.report
    assert result.sha == expected, result.output[-4000:]


@pytest.mark.parametrize("die, late_resumes", [
    ("1:5:kill", "resuming with rank 1's own position"),
    ("1:3:stop", "rank 1's loader had not started by minibatch 3 (no iterator yet); it starts afresh, as it did"),
], ids=["iterator-made", "no-iterator-yet"])
def test_a_loader_whose_iterator_was_made_but_has_not_yielded_keeps_its_seeds(tmp_path, loader_reference, die,
                                                                               late_resumes):
    """The two extra loaders (2 workers each) get their iterators at minibatch 3, where each draws its workers'
    base seed from the rank's generator; ``late`` yields its first batch at minibatch 9.  Rank 1 dies in
    minibatch 5: every rank resumes ``late`` from its iterator's state, seeds included.  Before, ``late`` was
    recorded as not started: every rank resumed it afresh, with a base seed drawn again (from another generator
    state), and the job ended with other parameters.  Frozen at the start of minibatch 3, before the iterators
    exist, both start afresh and make them in minibatch 3 as the fault-free run did.  (Frozen, not killed: a
    kill there makes torchrun SIGTERM the other ranks while they start their new iterators' workers, whose
    deaths torch's DataLoader turns into an error in the training thread before the JIT save is done.)"""
    extra = ["--aux", "--prefetch-at", "3"]
    expected = _reference(loader_reference, extra)
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=SCRIPT, args=[*extra, "--die", die])
    assert result.returncode == 0, result.output[-4000:]
    assert f"[jitckpt rank 1] data loader #2: {late_resumes}" in result.output, result.output[-4000:]
    assert result.sha == expected, result.output[-4000:]


def test_a_second_loaders_first_batch_does_not_move_the_rng_state_the_minibatch_starts_with(
        tmp_path, loader_reference):
    """In minibatch 7 the ``aux`` loader gives its batch after the main batch's forward pass (which drew its
    dropout masks).  Rank 1 is killed in that minibatch's backward; every rank resumes minibatch 7.  Before, the
    ``aux`` batch's fetch recorded the RNG state after the main forward as the one minibatch 7 starts with, on
    every rank: the redone minibatch drew other dropout masks and the job ended with other parameters."""
    expected = _reference(loader_reference, ["--aux"])
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, script=SCRIPT, args=["--aux"],
                     fault="rank=1,step=7,phase=backward,kind=kill")
    assert result.returncode == 0, result.output[-4000:]
    (failure,) = result.report["failures"]
    assert failure["resumed_from_minibatch"] == 7, failure
    assert result.sha == expected, result.output[-4000:]


NOISE_SCRIPT = REPO / "tests" / "user_programs" / "noise_before_forward.py"


@pytest.mark.parametrize("workers, die", [("0", "1:4"), ("0", "2:8"), ("2", "1:4")],
                         ids=["in-process-augmentation", "second-epoch", "worker-augmentation"])
def test_random_numbers_drawn_between_fetch_and_forward_repeat(tmp_path, loader_reference, workers, die):
    """A plain DataLoader, input noise drawn before the forward, skip-to-position by iterating: bit-exact.

    The redone minibatch's RNG state goes back when its batch is fetched (the
    last fetch before its first forward), not at the forward: before this,
    each of these runs ended with wrong parameters and reported success."""
    extra = ["--workers", workers]
    key = ("noise", *extra)
    if key not in loader_reference:
        loader_reference[key] = reference_sha(NPROC, extra, NOISE_SCRIPT)
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, args=[*extra, "--die", die], script=NOISE_SCRIPT)
    assert result.returncode == 0, result.output[-4000:]
    assert "resuming from minibatch" in result.output
    assert result.sha == loader_reference[key], result.output[-4000:]


def test_a_script_that_does_not_skip_to_its_position_is_stopped_not_reported_a_success(tmp_path, loader_reference):
    """A plain DataLoader script that, on resume, starts the epoch's iterator afresh instead of skipping to its
    saved position (``--no-skip``).  Before, the job reported ``completed`` and ended with other parameters than
    the fault-free run: the redone minibatch and every one after it trained on other batches.  Each rank now
    compares the batches its redone minibatch took with those the failed run took (digests in its stash and the
    checkpoint), before it contributes to the minibatch: the job stops with the reason; with
    --allow-inexact-resume it goes on and the report says "not bit-exact" (and the parameters do differ)."""
    extra = ["--workers", "0"]
    key = ("noise", *extra)
    if key not in loader_reference:
        loader_reference[key] = reference_sha(NPROC, extra, NOISE_SCRIPT)
    args = [*extra, "--no-skip", "--die", "1:4"]
    stopped = run_jit(tmp_path / "ckpt", nproc=NPROC, args=args, script=NOISE_SCRIPT)
    assert stopped.returncode == 77, (stopped.returncode, stopped.output[-4000:])
    assert "final parameters sha256" not in stopped.output, stopped.output[-4000:]
    refusals = re.findall(r"rank (\d)'s data loader took none of the 1 batch\(es\) that minibatch 4 took from it",
                          stopped.output)
    assert sorted(set(refusals)) == ["0", "1", "2"], stopped.output[-4000:]
    assert stopped.report is not None and stopped.report["outcome"] == "stopped", stopped.report
    assert any("took none of the" in why for why in stopped.report["stopped_because"]), stopped.report

    allowed = run_jit(tmp_path / "ckpt-allowed", nproc=NPROC, args=args, script=NOISE_SCRIPT,
                      jit_options=["--allow-inexact-resume"])
    assert allowed.returncode == 0, allowed.output[-4000:]
    assert allowed.report["outcome"] == "completed, not bit-exact", allowed.report
    assert allowed.sha is not None and allowed.sha != loader_reference[key], allowed.output[-4000:]


def test_notes_of_taken_batches_tell_batches_apart_and_decode_to_numbers_only():
    """The digest of a batch: equal batches agree, a batch with another sample or other augmentation differs,
    objects with an address in their repr do not make equal batches differ; the stored notes decode to
    numbers only, and anything else (a pickle, a torn file) is refused."""
    import pickle

    import numpy as np

    from jitckpt.worker import data_position as dp

    batch = (torch.arange(8.0).reshape(2, 4), torch.ones(2), {"path": "a.png", "n": 3})
    same = (batch[0].clone(), batch[1].clone(), {"path": "a.png", "n": 3})
    assert dp.digest(batch) == dp.digest(same)
    assert dp.digest(batch) != dp.digest((batch[0] + 1e-6, batch[1], batch[2]))
    assert dp.digest(batch) != dp.digest((batch[0], batch[1], {"path": "b.png", "n": 3}))
    assert dp.digest([object()]) == dp.digest([object()])
    assert dp.digest({"x": np.zeros(3)}) != dp.digest({"x": np.ones(3)})
    big = torch.zeros(1 << 20)
    other = big.clone()
    other[-1] = 1.0  # (the last bytes are read: a batch whose last sample differs)
    assert dp.digest(big) != dp.digest(other)
    assert dp.digest({"a": 1, "b": 2}) == dp.digest({"b": 2, "a": 1})  # (a dict built from a set)
    nested = torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)], layout=torch.jagged)
    assert dp.digest([nested]) == dp.digest([torch.nested.nested_tensor([torch.ones(2), torch.ones(3)],
                                                                       layout=torch.jagged)])  # (types only)
    channels_last = torch.randn(4, 3, 8, 8).to(memory_format=torch.channels_last)
    assert dp.digest(channels_last) == dp.digest(channels_last.clone())
    assert dp.digest(channels_last) != dp.digest(torch.cat([channels_last[:3], channels_last[:1]]))
    entries = [(0, b"12345678"), (dp.NO_KEY, b"abcdefgh")]
    assert dp.decode(dp.encode(entries)) == entries
    for bad in (pickle.dumps(entries), dp.encode(entries)[:-3], b"", dp.MAGIC + b"\0" * 12 * (dp.MAX_ENTRIES + 1)):
        with pytest.raises(dp.DataPositionError):
            dp.decode(bad)


class _Iterator:
    def __init__(self, key: int) -> None:
        self._jitckpt_loader_key = key


def _redo(expected: list, events: list) -> list[str]:
    """Refusals of a redone minibatch 5 that failed with ``expected`` (key, batch) taken, given ``events``:
    ("batch", key, batch), "barrier" (a collective), "forward" (a module's forward), "step" (optimizer step)."""
    import types

    from jitckpt.worker import data_position as dp

    rt = types.SimpleNamespace(step=5, resumed_from=5, rank=0, stash_rank_state=lambda *args: None)
    batches, refusals = dp.TakenBatches(rt), []
    batches.arm([(key, dp.digest(batch)) for key, batch in expected], refusals.append)
    try:
        for event in events:
            if event[0] == "batch":
                batches.yielded(_Iterator(event[1]), event[2])
            elif event == "forward":
                torch.nn.Identity()(torch.zeros(1))
            else:
                batches.minibatch_committed(collective=event == "barrier")
    finally:
        batches._drop_hook()  # (the window's forward hook, if the comparison has not ended)
    return refusals


def test_the_redone_minibatch_is_compared_before_it_contributes_what_comes_from_the_data():
    """The comparison ends at the redone minibatch's first collective after a module's forward began (not at a
    barrier after loading or between skipping and the real batch), or at its optimizer step; it refuses when
    a loader took none of the failed run's batches, and not for a skip by iterating, a loader that took
    nothing since the resume (evaluation), or a minibatch that took only some of its micro-batches again
    before its first collective."""
    b = [[i, i + 1] for i in range(0, 20, 2)]
    assert len(_redo([(0, b[2])], ["barrier", ("batch", 0, b[0]), "forward", "barrier"])) == 1  # the epoch restarted
    assert len(_redo([(0, b[2])], [("batch", 0, b[0]), "step"])) == 1  # (no module: at the optimizer step)
    skip = [("batch", 0, b[0]), ("batch", 0, b[1])]
    assert _redo([(0, b[2])], ["barrier", *skip, "barrier", ("batch", 0, b[2]), "forward", "barrier"]) == []
    assert _redo([(1, ["eval"]), (0, b[2])], [("batch", 0, b[2]), "forward", "barrier"]) == []
    assert _redo([(0, b[2]), (0, b[3])], [("batch", 0, b[2]), "forward", "barrier"]) == []  # 2 micro-batches
    assert "took none of the 1 batch(es) that minibatch 5 took" in _redo(
        [(0, b[2]), (1, ["aux", 1])], [("batch", 0, b[2]), ("batch", 1, ["aux", 2]), "forward", "step"])[0]


def test_a_redone_minibatch_that_starts_from_the_data_of_the_one_before_is_refused():
    """After a failure in a collective issued after the optimizer step (a logging all-reduce), the checkpoint
    is the start of minibatch i+1 and the failed run noted nothing for it: the redone minibatch must not start
    from what minibatch i took (a script resuming from a step counter one behind).  Checked where i's data told
    it apart from i-1's (a loop over one fixed batch is not checked); a skip by iterating through i's batch to
    the next one is fine."""
    import types

    from jitckpt.worker import data_position as dp

    model = torch.nn.Linear(2, 1)
    fwd = dp.forward_key(model)
    x4, x5 = torch.ones(3, 2), torch.zeros(3, 2)
    previous, before = [(0, dp.digest([4])), (fwd, dp.digest((x4,)))], [(0, dp.digest([3])), (fwd, dp.digest((x5 + 2,)))]
    suspect = dp.suspects(previous, before, own=[])
    assert suspect == {0: {dp.digest([4])}, fwd: {dp.digest((x4,))}}
    assert dp.suspects(previous, previous, own=[]) == {}  # (one fixed batch: not told apart, not checked)
    assert dp.suspects(previous, None, own=[]) == {}  # (the minibatch before unknown)
    assert dp.suspects(previous, before, own=[(0, b"eval!!!!")]) == {fwd: {dp.digest((x4,))}}  # (noted: compared)

    def redo(events: list) -> list[str]:
        rt = types.SimpleNamespace(step=5, resumed_from=5, rank=0, stash_rank_state=lambda *args: None)
        batches, refusals = dp.TakenBatches(rt), []
        batches.arm([], refusals.append, suspect)
        try:
            for event in events:
                if event[0] == "batch":
                    batches.yielded(_Iterator(0), event[1])
                elif event[0] == "forward":
                    model(event[1])
                else:
                    batches.minibatch_committed(collective=True)
        finally:
            batches._drop_hook()
        return refusals

    (refusal,) = redo([("batch", [4]), ("forward", x4), ("allreduce",)])
    assert "started the redone minibatch 5 with the data of minibatch 4" in refusal and "current_step()" in refusal
    assert "Linear's forward" in redo([("batch", [9]), ("forward", x4), ("allreduce",)])[0]
    assert redo([("batch", [3]), ("batch", [4]), ("batch", [5]), ("forward", x5), ("allreduce",)]) == []
    model.eval()  # (an evaluation forward with the old inputs is not training on them)
    try:
        assert redo([("batch", [5]), ("forward", x4)]) == []
    finally:
        model.train()
    notes = dp.encode([(7, b"abcdefgh")], [(7, b"12345678")])
    assert dp.decode_notes(notes) == ([(7, b"abcdefgh")], [(7, b"12345678")]) and dp.decode(notes) == [(7, b"abcdefgh")]
    assert dp.decode_notes(dp.encode([(7, b"abcdefgh")])) == ([(7, b"abcdefgh")], None)
    for bad in (notes[:-1], dp.MAGIC2 + b"\xff\xff" + notes[12:]):
        with pytest.raises(dp.DataPositionError):
            dp.decode_notes(bad)


def test_a_minibatch_notes_its_batches_until_its_first_collective_after_one():
    """The failed run's side: a collective before the minibatch's first batch (a logging all-reduce) leaves its
    notes open; the first one after a batch ends them; the notes are in the stash under the minibatch."""
    import types

    from jitckpt.worker import data_position as dp

    written = {}
    rt = types.SimpleNamespace(step=3, resumed_from=None, rank=0,
                               stash_rank_state=lambda kind, step, payload: written.update({step: payload}))
    batches = dp.TakenBatches(rt)
    batches.minibatch_committed(collective=True)  # logging all-reduce of the last loss
    batches.yielded(_Iterator(7), [1, 2])
    batches.minibatch_committed(collective=True)  # the gradient all-reduce
    batches.yielded(_Iterator(7), [3, 4])  # (taken after it: the next minibatch's batch, not noted here)
    assert dp.decode(written[3]) == [(7, dp.digest([1, 2]))]
    rt.step = 4
    batches.yielded(_Iterator(7), [3, 4])
    assert dp.decode(written[4]) == [(7, dp.digest([3, 4]))]


def test_a_loader_made_anew_over_the_same_dataset_keeps_its_key():
    """Keys are the dataset's class and length: a loader made per epoch or to skip batches (accelerate's
    ``skip_first_batches``) is compared with the one the failed run used; another dataset is another loader."""
    from torch.utils.data import DataLoader, TensorDataset

    from jitckpt.worker import data_position as dp

    train = TensorDataset(torch.zeros(12, 2))
    assert dp.loader_key(DataLoader(train, batch_size=4)) == dp.loader_key(DataLoader(train, batch_size=2, shuffle=True))
    assert dp.loader_key(DataLoader(train)) != dp.loader_key(DataLoader(TensorDataset(torch.zeros(6, 2))))


def test_the_jit_checkpoint_carries_every_local_ranks_own_loader_state(tmp_path):
    result = run_jit(tmp_path / "ckpt", nproc=NPROC, args=["--die", "1:5:kill", "--epochs", "1"], script=SCRIPT)
    assert result.returncode == 0, result.output[-4000:]
    saved = sorted((tmp_path / "ckpt").glob("**/jitckpt-loader/rank-*.bin"))
    ranks_saved = {path.name for path in saved}
    assert {"rank-00000.bin", "rank-00001.bin", "rank-00002.bin"} <= ranks_saved
    for path in saved:
        states = safe_codec.decode(path.read_bytes())
        assert isinstance(states, dict) and 0 in states  # loader #0 of that rank
        assert isinstance(states[0]["_snapshot"], dict)


def test_safe_codec_round_trips_state_dicts_and_refuses_the_rest():
    value = {"a": 1, 2: (1.5, float("nan"), None, True), "t": torch.arange(6).reshape(2, 3), "b": b"\x00\xff",
             "big": 2**70, "half": torch.ones(3, dtype=torch.bfloat16), "empty": torch.zeros(0)}
    back = safe_codec.decode(safe_codec.encode(value))
    assert back["a"] == 1 and back["big"] == 2**70 and back["b"] == b"\x00\xff"
    assert back[2][0] == 1.5 and back[2][1] != back[2][1] and back[2][2:] == (None, True)
    assert torch.equal(back["t"], value["t"]) and back["t"].dtype == torch.int64
    assert torch.equal(back["half"], value["half"]) and back["empty"].shape == (0,)
    with pytest.raises(safe_codec.SafeCodecError, match="cannot be stored safely"):
        safe_codec.encode({"x": object()})


@pytest.mark.parametrize("payload", [b"\x80\x04\x95pickle", b"{}", b'{"format":"jitckpt-safe-codec-1","value":{"eval":"x"}}',
                                     b'{"format":"jitckpt-safe-codec-1","value":{"tensor":{"dtype":"float32","shape":[4],"data":"AAAA"}}}'])
def test_safe_codec_refuses_foreign_or_damaged_payloads(payload):
    with pytest.raises(safe_codec.SafeCodecError):
        safe_codec.decode(payload)


@pytest.mark.parametrize("prefix, refusal", [("jitckpt-loader/", "the data-loader state stored for rank"),
                                             ("jitckpt-fetch/", "the notes of taken batches stored for rank")],
                         ids=["loader-state", "notes-of-taken-batches"])
def test_a_planted_loader_state_is_refused_and_never_run(tmp_path, prefix, refusal):
    """Every replica's loader-state file (or notes of the batches taken) replaced by a pickle that runs code,
    the metadata checksums updated to match: the resume stops with an error naming the file, and the planted
    code never runs."""
    ckpt = tmp_path / "ckpt"
    saved = run_jit(ckpt, nproc=NPROC, max_restarts=0, args=["--die", "1:5:kill", "--epochs", "1"], script=SCRIPT)
    assert saved.returncode != 0 and (ckpt / "step-00000005").is_dir(), saved.output[-3000:]
    marker = tmp_path / "planted-code-ran"
    planted = plant_code(ckpt / "step-00000005", prefix, marker)
    assert planted >= NPROC
    second = run_jit(ckpt, nproc=NPROC, max_restarts=0, args=["--epochs", "1"], script=SCRIPT)
    assert not marker.exists(), "code planted in a checkpoint ran on resume"
    assert second.returncode != 0
    assert refusal in second.output and "unusable" in second.output, second.output[-4000:]

