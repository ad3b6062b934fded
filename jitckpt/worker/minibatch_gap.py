"""The gap between two minibatches: random numbers drawn after one's optimizer step and before the next one's data.

The RNG state a minibatch starts with is stashed at the end of the one before
(its collectives, its optimizer step: ``JitRuntime.stash_next_rng``) and put
back, after a resume, where the redone minibatch takes its data (a DataLoader
fetch, its first module forward).  That is exact only if nothing draws in
between.  Two things do:

- **a new epoch's DataLoader iterator.**  Creating a plain ``DataLoader``
  iterator draws its base seed from the global generator (and a shuffling
  sampler its own seed at the first index).  In the fault-free run that draw
  comes after minibatch i-1's step, from its state; in a resumed run the
  script makes the iterator anew anyway.  So when minibatch i starts an
  epoch, this rank's state goes back right before the redone run makes the
  iterator of the same loader (``restore_before_iterator``), not at the
  fetch: the iterator then draws the same base seed (so non-persistent
  workers are seeded as in the fault-free run) and the batch the same
  numbers.  Minibatch i starts an epoch when the last batch minibatch i-1
  took was its iterator's last (every rank sees it, before its step);
- **anything else between the two minibatches** (an evaluation that draws, a
  second loader's iterator, the script's own draws after its step).  A rank
  that got as far as minibatch i's data stashes the state there instead (its
  first fetch from the loader minibatch i-1 took from, or its first training
  forward): what it then restores is exact.  A rank that did not (it died
  before, or the ranks that saved were stopped in that gap) has only the
  state at i-1's step, and the draws in between are not repeated by the
  resumed run: its resume is not exact, and it says so
  (``resume.inexact_resume``: the job stops, or goes on under
  ``--allow-inexact-resume``).  Whether such draws happened is known to
  every rank that watched the gap (the global generators compared with the
  stashed state; the script's own generators are left out, they have their
  own capture at the minibatch's start): each records it, a JIT save copies
  the records of its host's ranks into the checkpoint, and a resumed rank
  reads any rank's.

A framework adapter (``jitckpt.adapters``) stashes the state at its
framework's own start of a minibatch, where its resume restores it
(``framework_start``), and after an evaluation in the gap
(``framework_evaluated``); an evaluation that the failure interrupted,
which the framework would not run again, the Hugging Face adapter runs again
after the resume from each rank's state when it began (``settle_rerun``).

Each rank keeps one record per minibatch in its host stash
(``stash.GAP``): the key of the loader whose new iterator starts it, the RNG
state right before that iterator was made, and whether the state was
stashed again at the minibatch's data (or a framework's start of it, or
after a framework's evaluation) and whether draws were seen.  A fixed
binary format: a checkpoint is untrusted input.
"""

from __future__ import annotations

import dataclasses
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from jitckpt.worker import private_rng, rng_state, stash
from jitckpt.worker.data_position import NO_KEY, key_of, loader_key

if TYPE_CHECKING:
    from jitckpt.worker.runtime import JitRuntime

MAGIC = b"JITGAP4\0"
# loader key of the epoch's iterator (NO_KEY: none), flags, the lengths of the four states that follow: the RNG
# state right before that iterator (a capture), the script's own generators when the epoch's iterator ran out, the
# RNG state when a framework's evaluation began (a capture), the RNG state at the step before (a capture)
_HEAD = struct.Struct("<IIIIII")
# (earlier versions' records, read too: 11 flags and 3 states; 17 flags and 3 states)
MAGIC2, _HEAD2 = b"JITGAP2\0", struct.Struct("<IHIII")
MAGIC3, _HEAD3 = b"JITGAP3\0", struct.Struct("<IIIII")
(_EPOCH, _REFINED, _DRAWS, _BEFORE, _EVALUATED, _RAN_OUT, _OWN_MOVED, _LIKELY, _BEFORE_EVAL, _DREW_BEFORE_EVAL,
 _SAVED, _ENDS_DREW, _ENDS_QUIET, _STEPS_DREW, _STEPS_QUIET, _PENDING_ENDS, _PENDING_STEPS) = (1 << n for n in range(17))
_FLAGS = (1 << 17) - 1
_FLAGS2 = (1 << 11) - 1
# what the job has seen of the gaps of one kind (an epoch's end, between two minibatches of an epoch): some drew,
# some did not (a gap a rank watched to its end, before the next minibatch's data or the next epoch's iterator)
_HISTORY = {True: (_ENDS_DREW, _ENDS_QUIET), False: (_STEPS_DREW, _STEPS_QUIET)}
_PENDING = {True: _PENDING_ENDS, False: _PENDING_STEPS}
_HISTORY_FLAGS = _ENDS_DREW | _ENDS_QUIET | _STEPS_DREW | _STEPS_QUIET | _PENDING_ENDS | _PENDING_STEPS


class GapRecordError(ValueError):
    """A stored gap record not in jitckpt's format."""


@dataclass
class GapRecord:
    """What this rank saw between minibatch ``step - 1``'s optimizer step and minibatch ``step``'s data."""

    epoch_key: int | None = None        # the loader whose new iterator starts minibatch ``step`` (an epoch start)
    before_iterator: bytes | None = None  # the RNG state right before that iterator was made
    refined: bool = False                # the RNG stash of ``step`` was taken again at its data (exact)
                                         # (with a framework adapter: at the framework's own start of ``step``)
    draws: bool = False                  # the global generators moved in the gap (before the epoch's iterator)
    evaluated: bool = False              # the stash of ``step`` was taken again after a framework's evaluation
    # The script's own generators when the previous epoch's iterator ran out in the gap (its sampler may draw
    # from one there: torch's RandomSampler does), as private_rng captures them (b"": none); None: not seen.
    ran_out: bytes | None = None
    own_moved: bool = False              # ... and they had moved since the state stashed at the step
    # A JIT save came in this gap before the epoch's iterator, and an earlier epoch's end drew before its
    # iterator (an evaluation): draws likely follow, which no rank will see
    likely_draws: bool = False
    before_evaluation: bytes | None = None  # the RNG state when a framework's evaluation in the gap began
    drew_before_evaluation: bool = False    # ... which differed from the state at the step (a callback drew)
    saved: bool = False                  # the framework's own checkpoint save in the gap returned
    # What the job had seen of the gaps so far when the rank wrote the record (flags of _HISTORY: some epoch ends
    # drew, some did not; likewise the gaps within an epoch), and whether a resume's assumption that a gap no rank
    # saw drew nothing still waits for the next gap of its kind (flags of _PENDING); a resumed rank goes on with them
    history: int = 0
    # The RNG state at the step before, when something drew between it and this minibatch's data that this rank
    # watched (the state stashed for the minibatch is then the one at its data): a resumed rank starts from it, so
    # that the script's own loop makes those draws again (random inputs drawn before the forward)
    at_step: bytes | None = None

    def encode(self) -> bytes:
        flags = 0
        for flag, on in ((_EPOCH, self.epoch_key is not None), (_REFINED, self.refined), (_DRAWS, self.draws),
                         (_BEFORE, self.before_iterator is not None), (_EVALUATED, self.evaluated),
                         (_RAN_OUT, self.ran_out is not None), (_OWN_MOVED, self.own_moved),
                         (_LIKELY, self.likely_draws), (_BEFORE_EVAL, self.before_evaluation is not None),
                         (_DREW_BEFORE_EVAL, self.drew_before_evaluation), (_SAVED, self.saved)):
            flags |= flag if on else 0
        flags |= self.history & _HISTORY_FLAGS
        key = NO_KEY if self.epoch_key is None else self.epoch_key
        blobs = (self.before_iterator or b"", self.ran_out or b"", self.before_evaluation or b"", self.at_step or b"")
        return MAGIC + _HEAD.pack(key, flags, *(len(b) for b in blobs)) + b"".join(blobs)

    @classmethod
    def decode(cls, payload: bytes) -> "GapRecord":
        head, known = ((_HEAD, _FLAGS) if payload.startswith(MAGIC) else (_HEAD3, _FLAGS)
                       if payload.startswith(MAGIC3) else (_HEAD2, _FLAGS2))
        if not payload.startswith((MAGIC, MAGIC2, MAGIC3)) or len(payload) < len(MAGIC) + head.size:
            raise GapRecordError("not jitckpt's record of a minibatch's start (wrong header)")
        key, flags, *sizes = head.unpack_from(payload, len(MAGIC))
        start = len(MAGIC) + head.size
        if len(payload) != start + sum(sizes):
            raise GapRecordError("not jitckpt's record of a minibatch's start (wrong length)")
        blobs = []
        for size in sizes:
            blobs.append(payload[start:start + size])
            start += size
        state, ran_out, before_evaluation, *rest = blobs
        at_step = rest[0] if rest else b""
        if (flags & ~known or bool(state) != bool(flags & _BEFORE) or (ran_out and not flags & _RAN_OUT)
                or bool(before_evaluation) != bool(flags & _BEFORE_EVAL)):
            raise GapRecordError("not jitckpt's record of a minibatch's start (unknown flags)")
        try:
            for capture in (state, before_evaluation, at_step):
                if capture:
                    rng_state.decode(capture)
            if ran_out:
                private_rng.decode(ran_out)
        except (rng_state.RngStateError, private_rng.PrivateRngError) as exc:
            raise GapRecordError(f"its RNG state is unusable ({exc})") from None
        return cls(key if flags & _EPOCH else None, state or None, bool(flags & _REFINED), bool(flags & _DRAWS),
                   bool(flags & _EVALUATED), ran_out if flags & _RAN_OUT else None, bool(flags & _OWN_MOVED),
                   bool(flags & _LIKELY), before_evaluation or None, bool(flags & _DREW_BEFORE_EVAL),
                   bool(flags & _SAVED), flags & _HISTORY_FLAGS, at_step or None)


@dataclass
class _RerunOffer:
    """After a resume: what ``settle_rerun`` decides from (see ``arm_resume``)."""

    own: GapRecord | None
    own_state: bytes | None
    why: str | None          # why the resume is not exact if the framework runs nothing again
    records: list[GapRecord]  # every rank's record that this rank sees
    savers: list[GapRecord]   # the records of the ranks that wrote the checkpoints


def _global(payload: bytes) -> dict[int, list[bytes]]:
    """The global generators' records of an RNG capture (the script's own generators left out)."""
    return {kind: records for kind, records in rng_state.decode(payload).items() if kind != rng_state.PRIVATE}


def stateful(loader: Any) -> bool:
    """A loader that restores its own position and seeds (torchdata's ``StatefulDataLoader``): left to its adapter."""
    return hasattr(loader, "state_dict") and hasattr(loader, "load_state_dict")


def _plain(iterator: Any) -> bool:
    """An iterator made anew each epoch whose making draws (not a stateful loader's, nor persistent workers')."""
    return not getattr(iterator, "_jitckpt_stateful", False) and not getattr(iterator, "_persistent_workers", False)


class MinibatchGap:
    """This rank's records of the gaps, and after a resume the restore before the epoch's iterator."""

    def __init__(self, rt: "JitRuntime") -> None:
        self.rt = rt
        self._records: dict[int, GapRecord] = {}  # by minibatch (the current one and the next one)
        self._open_for: int | None = None          # the minibatch whose gap is open (its data not reached)
        self._fed_by: set[int] = set()             # loader keys the minibatch in progress took batches from
        self._train_keys: set[int] = set()         # ... and those the one before took from
        # After a resume at an epoch start: (loader key, the state to put back right before its iterator is made,
        # and what the previous epoch's iterator left in the script's own generators when it ran out: their
        # states (bytes), "draw" (replay the sampler's draw there: this rank died before it), or None)
        self._restore: tuple[int, bytes, bytes | str | None] | None = None
        self._refuse: Callable[[str], None] = lambda reason: None
        # After a resume that a framework adapter may settle by running the gap's work again (settle_rerun)
        self._rerun_offer: _RerunOffer | None = None
        self._savers_saved = False
        # What the job has seen of the gaps, and the assumption that waits for a gap (flags of _HISTORY and
        # _PENDING; a resumed rank takes them from the resumed minibatch's records)
        self._history = 0
        # After a resume whose redone minibatch's gap no rank watched to its end (the ranks that saved stopped in
        # a collective after the step before) and no gap of its kind had been seen: (that minibatch, whether it
        # starts an epoch).  The resume took it that nothing drew there; the next gap of the kind decides
        # (_check_assumption).
        self._unwatched: tuple[int, bool, bool] | None = None  # (... and whether an earlier resume assumed it)
        # A stateful loader (torchdata's) fed the training: its adapter places the RNG state itself, at its fetches.
        self._disabled = False


    # ----- the failed run's side ---------------------------------------------------------

    def _write(self, step: int) -> None:
        record = self._records[step]
        record.history = self._history | (_PENDING[self._unwatched[1]] if self._unwatched is not None else 0)
        self.rt.stash_rank_state(stash.GAP, step, record.encode())

    def _watched(self, step: int, epoch_start: bool, drew: bool) -> None:
        """This rank watched minibatch ``step``'s gap to its end (before its data, or before the new epoch's
        iterator): what the job has seen of such gaps (not the redone minibatch's own: its run differs)."""
        if self.rt.resumed_from is not None and step <= self.rt.resumed_from:
            return
        drew_flag, quiet_flag = _HISTORY[epoch_start]
        self._history |= drew_flag if drew else quiet_flag
        self._check_assumption(step, epoch_start, drew)

    def minibatch_started(self) -> None:
        """Minibatch ``rt.step`` begins (the one before has stepped): its gap opens."""
        step = self.rt.step
        if self._disabled:
            return
        self._open_for = step
        self._train_keys, self._fed_by = self._fed_by, set()
        self._records = {s: r for s, r in self._records.items() if s >= step}
        self._records.setdefault(step, GapRecord())

    def batch_yielded(self, iterator: Any) -> None:
        """A DataLoader iterator yielded a batch: was it its last (the next minibatch starts an epoch)?"""
        if getattr(iterator, "_jitckpt_stateful", False):
            self._disabled, self._open_for = True, None
            return
        key = key_of(iterator)
        if self._open_for == self.rt.step:
            if self._train_keys and key not in self._train_keys:
                return  # (a batch taken in the gap: an evaluation's)
            self.data_reached(key)  # (its indices were taken before the gap: workers prefetch them)
        self._fed_by.add(key)
        try:
            last = iterator._num_yielded >= len(iterator)
        except (TypeError, AttributeError):  # (an IterableDataset without a length)
            return
        if last and _plain(iterator):
            step = self.rt.step + 1
            self._records.setdefault(step, GapRecord()).epoch_key = key
            self._write(step)

    def iterator_ran_out(self, iterator: Any) -> None:
        """The epoch's iterator ran out (the script's loop asked it for one more batch, after the step of minibatch
        ``rt.step - 1``).  Its sampler may draw there from a generator of the script's own (torch's
        ``RandomSampler`` given ``generator=`` draws one more permutation): those generators' states are
        recorded, what a rank that dies after this point resumes with."""
        step = self.rt.step
        record = self._records.get(step)
        if (self._open_for != step or record is None or record.epoch_key != key_of(iterator)
                or record.before_iterator is not None or record.ran_out is not None):
            return
        private = private_rng.capture() or b""
        stashed = self.rt.rng_stashed_for(step)
        if stashed is not None:
            before = rng_state.decode(stashed).get(rng_state.PRIVATE, [b""])[0]
            record.own_moved = before != private
        record.ran_out = private
        self._write(step)

    def iterator_made(self, loader: Any) -> None:
        """A DataLoader iterator is about to be made (it draws its base seed): the epoch's, in the gap?"""
        if stateful(loader) or getattr(loader, "persistent_workers", False):
            return
        if self._restore is not None and self._restore[0] == loader_key(loader):
            _, state, ran_out = self._restore
            self._restore = None
            rng_state.restore(state)  # the redone run: the state this rank had right before it, in the failed run
            if ran_out is not None:
                self._put_back_ran_out(loader, ran_out)
            return
        step = self.rt.step
        record = self._records.get(step)
        if (self._open_for != step or record is None or record.epoch_key is None
                or record.before_iterator is not None or record.epoch_key != loader_key(loader)):
            return
        record.before_iterator = rng_state.capture()
        record.draws = record.draws or self._moved(step, record.before_iterator)
        self._watched(step, True, record.draws or record.evaluated)
        self._write(step)

    def data_reached(self, key: int | None = None) -> None:
        """Minibatch ``rt.step`` takes its data: a fetch (of ``key``) or its first training forward (None)."""
        if self._restore is not None:  # the redone run made no new iterator of the epoch's loader before its data
            state, self._restore = self._restore[1], None
            rng_state.restore(state)
            self._refuse(f"rank {self.rt.rank}'s redone minibatch {self.rt.resumed_from} starts an epoch, but took its "
                         f"data without making a new iterator of that DataLoader after the resume (one made before "
                         f"jit_get_checkpoint_path() drew its seed from another state)")
            return
        step = self.rt.step
        if self._open_for != step or (key is not None and self._train_keys and key not in self._train_keys):
            return
        self._open_for = None
        record = self._records.setdefault(step, GapRecord())
        stashed = self.rt.rng_stashed_for(step)
        if stashed is not None:
            now = rng_state.capture()
            if now != stashed and record.before_iterator is None:
                record.draws = record.draws or self._moved(step, now)
            # A framework adapter stashes at its own start of the minibatch (``framework_start``), and its resume
            # restores there: the state at the data is not what it puts back.
            if self.rt.framework is None:
                if now != stashed:
                    if record.before_iterator is None and record.at_step is None:
                        record.at_step = stashed  # (what a resumed rank starts from: its loop draws again)
                    self.rt.stash_rng(step, now)  # (the state at the data: what a resume puts back here)
                record.refined = True
        if record.epoch_key is None:
            self._watched(step, False, record.draws)
        self._write(step)

    def framework_start(self, now: bytes) -> None:
        """A framework adapter is about to stash ``now`` at its own start of minibatch ``rt.step`` (where its resume
        restores): from here on this rank's stash of it is exact; if the global generators moved since the step
        before, a rank that died earlier has only the state before those draws."""
        step = self.rt.step
        record = self._records.setdefault(step, GapRecord())
        if not record.refined and record.before_iterator is None:
            record.draws = record.draws or self._moved(step, now)
        record.refined = True
        self._write(step)

    def _gap_record(self) -> GapRecord | None:
        """The record of the minibatch whose gap is open (None: no gap open, or this rank got to its start)."""
        record = self._records.get(self.rt.step)
        return None if self._open_for != self.rt.step or record is None or record.refined else record

    def framework_evaluation_begins(self) -> None:
        """A framework's evaluation begins in this rank's gap: its state now is what the evaluation, run again
        after a resume, starts from (``settle_rerun``); if it moved since the step, something drew before."""
        record = self._gap_record()
        if record is None or record.before_evaluation is not None or record.evaluated:
            return
        record.before_evaluation = rng_state.capture()
        record.drew_before_evaluation = self._moved(self.rt.step, record.before_evaluation)
        self._write(self.rt.step)

    def framework_evaluated(self) -> None:
        """A framework's evaluation in minibatch ``rt.step``'s gap ended on this rank (its last evaluation loop
        returned): the state now is the one the minibatch starts with unless something draws before the
        framework's start of it (where ``framework_start`` sees it), so it is stashed for it.  From here on a
        JIT save of this rank holds what the evaluation changed (logged metrics, a metric-driven scheduler's
        step, the best metric): it is not run again."""
        record = self._gap_record()
        if record is None or record.evaluated:
            return  # (not between two minibatches: an evaluation the script runs itself)
        self.rt.stash_rng(self.rt.step)  # (first: a record saying so with the state before would be believed)
        record.evaluated = True
        self._write(self.rt.step)

    def framework_saved(self) -> None:
        """The framework's own checkpoint save in this rank's gap returned (it is not made again after a resume)."""
        record = self._gap_record()
        if record is not None and not record.saved:
            record.saved = True
            self._write(self.rt.step)

    def _put_back_ran_out(self, loader: Any, ran_out: bytes | str) -> None:
        """After the restore before the epoch's iterator: the script's own generators as the previous epoch's
        iterator left them when it ran out (recorded), or its sampler's draw there made again (not recorded:
        this rank died before it; known for torch's ``RandomSampler``, else the resume stops)."""
        if isinstance(ran_out, bytes):
            if ran_out:
                private_rng.restore(ran_out)
            return
        sampler = getattr(loader, "sampler", None)
        from torch.utils.data import RandomSampler

        if type(sampler) is RandomSampler and sampler.generator is not None:
            import torch

            # what RandomSampler.__iter__ draws after its last index (torch 2.x): one more permutation, or the
            # remainder of its draws with replacement
            n = len(sampler.data_source)
            if sampler.replacement:
                torch.randint(high=n, size=(sampler.num_samples % 32,), dtype=torch.int64, generator=sampler.generator)
            else:
                torch.randperm(n, generator=sampler.generator)
            return
        self._refuse(f"rank {self.rt.rank} died before its previous epoch's DataLoader iterator ran out, and where "
                     f"it ran out the other ranks' sampler ({type(sampler).__name__}) drew from a generator of the "
                     f"script's own: this rank's state after that draw is not known")

    def _moved(self, step: int, now: bytes) -> bool:
        stashed = self.rt.rng_stashed_for(step)
        return stashed is not None and _global(now) != _global(stashed)

    def _check_assumption(self, step: int, epoch_start: bool, drew: bool) -> None:
        """After ``_watched``: if a resume took it that nothing drew in the gap before its redone minibatch, which
        no rank saw, with no gap of that kind seen before, the first such gap after it decides: one that draws
        says that was most likely wrong (an evaluation at every epoch's end, the script's own draws after every
        step), and the job stops with the reason; one that does not confirms it (a script that draws in some
        gaps only, an evaluation every N minibatches, is taken to draw in none: not told apart)."""
        if self._unwatched is None or step <= self._unwatched[0] or epoch_start != self._unwatched[1]:
            return
        resumed, _, earlier = self._unwatched
        self._unwatched = None
        if not drew:
            return
        where = "the next epoch's first DataLoader iterator" if epoch_start else "the next minibatch's data"
        which = (f"an earlier resume (before the one at minibatch {resumed}) took it" if earlier else
                 f"rank {self.rt.rank}'s resume at minibatch {resumed} took it")
        self._refuse(f"{which} that nothing drew random numbers between an optimizer step and {where}, in a gap that "
                     f"no rank saw in the run that failed (the ranks that saved stopped in a collective after that "
                     f"step), with no such gap seen before; but the same kind of gap before minibatch {step} drew (an "
                     f"evaluation? the script's own draws?), so that one most likely did too, and the resumed run "
                     f"did not repeat those draws: it has not repeated the fault-free run since")

    def before_save(self) -> None:
        """A JIT save of minibatch ``rt.step`` begins: if this rank is still in its gap, record the draws so far."""
        step = self.rt.step
        record = self._records.get(step)
        if self._open_for != step or record is None or record.refined or record.before_iterator is not None:
            return
        if self._moved(step, rng_state.capture()):
            record.draws = True
        elif self._history & _HISTORY[record.epoch_key is not None][0] and not record.evaluated:
            record.likely_draws = True  # (an evaluation at every epoch's end, not reached yet?)
        self._write(step)  # (with what this rank knows of the gaps so far)

    # ----- after a resume ----------------------------------------------------------------

    def arm_resume(self, own: GapRecord | None, others: list[GapRecord], own_state: bytes | None,
                   refuse: Callable[[str], None], savers: list[GapRecord] | None = None) -> str | None:
        """Prepare the redone minibatch's RNG restore; returns why it cannot be exact (None: it can).

        ``own``: this rank's record of the resumed minibatch, ``others``: other ranks' (structural facts: an epoch
        start, draws in the gap), ``own_state``: this rank's stashed RNG state for it; ``refuse`` is called if
        the redone run turns out not to make the epoch's iterator anew.  ``savers``: the records of the ranks
        that wrote the checkpoints of the step: if a framework adapter can run the gap's work again
        (``rt.framework_reruns_evaluation``), the minibatch starts an epoch and the savers stopped in its gap,
        the answer waits for the adapter (``settle_rerun``); so it does at the framework's last minibatch
        (``rt.framework_last_minibatch``), which need not end an epoch.
        """
        self._refuse = refuse
        for record in [*([own] if own else []), *others, *(savers or [])]:
            self._history |= record.history
        pending = self._history & (_PENDING_ENDS | _PENDING_STEPS)
        self._history &= ~pending
        why = self._arm(own, others, own_state)
        if why is None and self._unwatched is None and pending and self.rt.framework is None:
            # an earlier resume's assumption, not decided before this failure: the next gap of its kind decides
            self._unwatched = (self.rt.resumed_from, bool(pending & _PENDING_ENDS), True)
        last = self.rt.framework_last_minibatch
        ends = self._epoch_key(own, others) is not None or (last is not None and self.rt.resumed_from >= last)
        if self.rt.framework_reruns_evaluation and ends and savers and not any(r.refined for r in savers):
            self._rerun_offer = _RerunOffer(own, own_state, why, [*([own] if own else []), *others], savers)
            return None
        return why

    def saved_in_gap(self) -> bool:
        """After ``settle_rerun``: whether the ranks that saved had made the framework's own checkpoint in the gap."""
        return self._savers_saved

    def settle_rerun(self, evaluation_due: bool, save_due: bool) -> str:
        """A framework adapter, at its first epoch start after a resume (or at the end of training), says whether
        its framework evaluates and saves its own checkpoint between the resumed minibatch and the one before.
        Returns what it runs again now: ``"evaluate"`` (the evaluation and what follows it: the ranks that saved
        stopped before its end, so nobody's state after it is known; this rank's state when it began was put
        back), ``"save"`` (only the framework's checkpoint save, which they stopped in), or ``""`` (nothing: the
        resume goes on as armed, or stops with the reason found)."""
        offer, self._rerun_offer = self._rerun_offer, None
        if offer is None:
            return ""
        own, step = offer.own, self.rt.resumed_from
        self._savers_saved = any(r.saved for r in offer.savers)
        if evaluation_due and not any(r.evaluated for r in offer.savers):
            self._restore = None
            self.rt.take_pending_rng()
            state = own.before_evaluation if own is not None else None
            if state is None and own is not None and not (own.refined or own.evaluated) \
                    and not any(r.drew_before_evaluation for r in offer.records):
                state = offer.own_state  # (nothing drawn between the step and the evaluation: the same state)
            if state is None:  # (every rank evaluates again, or the others would wait for it in a collective)
                self._refuse(f"random numbers were drawn between minibatch {step - 1}'s optimizer step and the "
                             f"evaluation that followed it (a callback), and rank {self.rt.rank} did not get to that "
                             f"evaluation in the run that failed: the evaluation, run again, cannot start from the "
                             f"state it had")
            else:
                rng_state.restore(state)
            return "evaluate"
        if offer.why is not None:
            self._refuse(offer.why)
        if save_due and not any(r.saved for r in offer.savers):
            return "save"
        return ""

    @staticmethod
    def _epoch_key(own: GapRecord | None, others: list[GapRecord]) -> int | None:
        """The loader whose new iterator starts the resumed minibatch (None: it does not start an epoch)."""
        if own is not None and own.epoch_key is not None:
            return own.epoch_key
        return next((r.epoch_key for r in others if r.epoch_key is not None), None)

    def _arm(self, own: GapRecord | None, others: list[GapRecord], own_state: bytes | None) -> str | None:
        epoch_key = self._epoch_key(own, others)
        draws = any(r.draws for r in [*([own] if own else []), *others])
        step = self.rt.resumed_from
        framework = self.rt.framework
        watched = any(r.refined or r.evaluated or r.before_iterator is not None for r in [*([own] if own else []), *others])
        if framework is None and not draws and not watched:
            drew_flag, quiet_flag = _HISTORY[epoch_key is not None]
            where = "the next epoch's first DataLoader iterator" if epoch_key is not None else f"minibatch {step}'s data"
            if self._history & drew_flag and self._history & quiet_flag:
                return (f"the ranks that saved minibatch {step} stopped between minibatch {step - 1}'s optimizer step "
                        f"and {where} (in a collective after the step), so no rank saw whether random numbers were "
                        f"drawn there; earlier such gaps drew in some cases and not in others (an evaluation every "
                        f"few minibatches or epochs?): rank {self.rt.rank}'s state for minibatch {step} cannot be "
                        f"shown to be the fault-free run's")
            if self._history & drew_flag and epoch_key is None:
                return (f"the ranks that saved minibatch {step} stopped between minibatch {step - 1}'s optimizer step "
                        f"and {where} (in a collective after the step), where every earlier minibatch drew random "
                        f"numbers before its data: no rank saw this one's draws, and the resumed run does not make "
                        f"them, so rank {self.rt.rank}'s state for minibatch {step} cannot be shown to be the "
                        f"fault-free run's")
            if not self._history & (drew_flag | quiet_flag):
                self._unwatched = (step, epoch_key is not None, False)
        evaluated = any(r.evaluated for r in [*([own] if own else []), *others])
        if framework is not None and not (own is not None and own.refined) and (
                draws or (evaluated and not (own is not None and own.evaluated))):
            return (f"{framework} drew random numbers between minibatch {step - 1}'s optimizer step and minibatch "
                    f"{step}'s start (an evaluation, a callback), and rank {self.rt.rank} did not get "
                    f"to its start of minibatch {step} in the run that failed (where {framework} stashes and restores "
                    f"the state; it saved, or failed, before): its state after those draws is not known, and the resumed {framework} does not "
                    f"repeat them")
        if epoch_key is not None:
            state = own.before_iterator if own is not None else None
            ran_out: bytes | str | None = None
            likely = any(r.likely_draws for r in [*([own] if own else []), *others])
            if state is None and likely and not (own is not None and (own.refined or own.evaluated)):
                return (f"the ranks that saved minibatch {step} stopped between minibatch {step - 1}'s optimizer step "
                        f"and the next epoch's first DataLoader iterator, where every earlier epoch's end drew random "
                        f"numbers (an evaluation?) before that iterator: if this one did too, no rank saw those "
                        f"draws and the resumed run will not make them, so rank {self.rt.rank}'s state for minibatch "
                        f"{step} cannot be shown to be the fault-free run's")
            if state is None and not draws:
                state = own_state  # (nothing drawn before the epoch's iterator: the state at the step is that state)
                if own is not None and (own.refined or own.evaluated):
                    pass  # (its state was stashed again after the iterator ran out)
                elif own is not None and own.ran_out is not None:
                    ran_out = own.ran_out  # (the script's own generators after its sampler's last draw)
                elif any(r.ran_out is not None for r in others):
                    # this rank died before the previous epoch's iterator ran out, the others' ran out: its
                    # sampler's draw there is not in this rank's state; replayed if the sampler is known
                    ran_out = "draw" if any(r.own_moved for r in others) else None
            if state is None:
                return (f"rank {self.rt.rank}'s RNG state right before minibatch {step}'s new epoch iterator is not "
                        f"known: random numbers were drawn between minibatch {step - 1}'s optimizer step and that "
                        f"iterator (an evaluation, another DataLoader's iterator), which this rank did not reach, and "
                        f"which the resumed run does not repeat")
            self._restore = (epoch_key, state, ran_out)
            if framework is None or not (own is not None and own.refined):
                self.rt.take_pending_rng()  # (not again at the fetch, the forward or a framework's batch start)
            # (else the framework's own start, after the iterator, puts back the state it stashed there: what the
            # framework draws on resume between the two, Lightning's validation loader, is not the failed run's)
            return None
        if own is not None and own.refined and own.at_step is not None and framework is None:
            # Random numbers were drawn between the step and this minibatch's data (the script's loop draws its
            # inputs before the forward?): from the state at the step, the redone loop draws them again; its data's
            # state is put back at the data as usual (the same state if the loop drew the same)
            # (what its redone loop draws before the data is then checked against its own notes of the inputs it
            # took: jitckpt.worker.data_position; a rank that did not get to its data has no such notes, nor that
            # state, and is refused below: whether its loop would draw the same cannot be shown)
            rng_state.restore(own.at_step)
            self._records[step] = dataclasses.replace(own)  # (kept as it was, should this attempt fail too)
            self._write(step)
        if unreached_draws(own, others):
            return (f"random numbers were drawn between minibatch {step - 1}'s optimizer step and minibatch {step}'s "
                    f"data (an evaluation, a DataLoader iterator, the script's own draws), and rank {self.rt.rank} "
                    f"did not reach minibatch {step}'s data in the run that failed: its state after those draws is "
                    f"not known, and the resumed run does not repeat them")
        return None


def unreached_draws(own: GapRecord | None, others: list[GapRecord]) -> bool:
    """Whether random numbers were drawn between minibatch ``step - 1``'s optimizer step and ``step``'s data (or
    its epoch's iterator) that this rank did not get to: its state after them is not known, and a resume at
    ``step`` is refused (``_arm``).  ``jitckpt.worker.resume.locate`` then offers the step before, when a survivor
    that lagged saved it (``own``: this rank's record of ``step``, ``others``: the other ranks')."""
    reached = own is not None and (own.refined or own.evaluated or own.before_iterator is not None)
    return not reached and any(r.draws for r in [*([own] if own else []), *others])


def saver_records(step_path: Path) -> list[GapRecord]:
    """The records of the ranks that wrote the checkpoints of one step (each rank folder's own, unreadable ones
    left out)."""
    found = []
    for rank_dir in sorted(step_path.glob("rank-*")):
        try:
            found.append(GapRecord.decode((rank_dir / stash.KINDS[stash.GAP][1] / f"{rank_dir.name}.bin").read_bytes()))
        except (OSError, GapRecordError):
            continue
    return found


def records_of_step(step_path: Path, exclude: Path | None = None) -> list[GapRecord]:
    """Every rank's gap record that the checkpoints of one step carry (unreadable ones left out)."""
    found = []
    for rank_dir in sorted(step_path.iterdir()):
        if rank_dir.name.startswith(".") or rank_dir == exclude:
            continue
        folder = rank_dir / stash.KINDS[stash.GAP][1]
        if not folder.is_dir():
            continue
        for file in sorted(folder.iterdir()):
            try:
                found.append(GapRecord.decode(file.read_bytes()))
            except (OSError, GapRecordError):
                continue
    return found
