"""Where a minibatch's optimizer phase stands: which states a JIT save may hold (paper §3.3).

A JIT save must hold the state at the start of minibatch *i* or *i+1*, never
a step half applied.  Optimizer step hooks tell where the training thread
is; this module turns them into two answers for the runtime:

- **when a minibatch ends.**  One minibatch spans every optimizer that steps
  in it: a GAN steps its discriminator and then its generator, ZeRO's
  ``step()`` runs its local optimizer's step inside its own, a script may
  step two optimizers over two parameter groups (Muon and AdamW).  The set
  is learned in the first minibatch of every worker attempt, from the
  optimizers that step in it, in order.  It is complete once every
  optimizer the script has constructed (and still holds) has stepped, or
  else when one of them steps a second time.  From then on a minibatch ends
  at the post-step of the last of them, and the *optimizer phase* lasts
  from the first pre-step to that post-step.  A step that
  ``torch.amp.GradScaler`` skips (inf/nan gradients) fires no optimizer
  hook; ``jitckpt.worker.skipped_steps`` reports it as a step that changed
  nothing, so the count stays that of the script.
- **whether the state is consistent right now.**  Outside the optimizer
  phase it is (the start of the current minibatch).  Inside it, only while
  no optimizer has completed its step in this minibatch and no parameter
  has changed since the phase began: a closure optimizer (``LBFGS``,
  ``optimizer.step(closure)``, Lightning) runs forward, backward and DDP's
  gradient all-reduce inside ``step()`` before it touches a parameter.
  "Changed" is read from the parameters' version counters (every in-place
  update bumps them), recorded when the phase begins.  That costs a pass
  over the parameters, so it is done only for scripts whose optimizer
  phase issues a collective (seen in the first minibatch), the only way
  the training thread can be held inside it; without a record, every state
  inside the phase counts as changed.

Limits: an optimizer that steps several times in one minibatch (WGAN's
critic) is read as several minibatches, or as a changed set that is learned
again; an optimizer first stepping after the first minibatch starts a new
set.  jitckpt supports scripts that step each optimizer once per minibatch.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable


def _parameters(optimizer: Any) -> list[Any]:
    return [p for group in getattr(optimizer, "param_groups", ()) for p in group["params"]]


def _version_sum(params: Iterable[Any]) -> int:
    return sum(p._version for p in params)


class OptimizerPhase:
    """The optimizers of one minibatch, the ones stepping now, and whether anything has been applied.

    ``live_optimizers`` returns the optimizers the script has constructed and
    still holds (``jitckpt.worker.sharding.optimizers``).
    """

    def __init__(self, live_optimizers: Callable[[], list[Any]]) -> None:
        self._live_optimizers = live_optimizers
        self.members: list[int] = []  # ids of the optimizers of one minibatch, in first-step order
        self.learning = True  # the set is still being learned (first minibatch of this attempt)
        self.done: list[int] = []  # optimizers whose step completed (or was skipped) in this minibatch
        self.inside: list[int] = []  # optimizers whose step is running, outermost first
        self.in_phase = False  # between the minibatch's first pre-step and its last post-step
        self.pre_steps = 0  # optimizer steps begun, of any optimizer (skipped_steps compares it)
        # The first optimizer's parameters and the sum of their version counters when the phase began.
        self._baseline: tuple[list[Any], int] | None = None
        self._record_baseline = True  # decided in the first minibatch: does the phase issue collectives?
        self._collective_in_phase = False

    # ----- hooks -------------------------------------------------------------------------

    def close_previous(self, optimizer: Any) -> bool:
        """An optimizer is about to step: True if that shows the previous minibatch is over.

        It is over when this optimizer already stepped in it and nothing is
        running: the set was still being learned (the first minibatch), or the
        script stepped one of its optimizers twice (the set is learned again).
        A minibatch that starts with an optimizer outside the set (a new
        training stage) also starts a new set.
        """
        oid = id(optimizer)
        if oid in self.inside:  # its previous step raised and never reached the post-step
            del self.inside[self.inside.index(oid):]
            if not self.inside and not self.done:  # the script goes on: this step opens the phase again
                self._reset_minibatch()
        if not self.inside and oid in self.done:
            if self.learning:
                self._finish_learning(self.done)
            else:
                self._relearn()
            self._reset_minibatch()
            return True
        if not self.inside and not self.done and not self.learning and oid not in self.members:
            self._relearn()
        return False

    def enter(self, optimizer: Any) -> bool:
        """The optimizer's step begins (after ``close_previous``); True if it opens the optimizer phase."""
        oid = id(optimizer)
        self.pre_steps += 1
        first = not self.in_phase
        if first:
            # (the save thread reads these: the record exists before the phase is marked open)
            self._collective_in_phase = False
            params = _parameters(optimizer)
            self._baseline = (params, _version_sum(params)) if self._record_baseline else None
            self.in_phase = True
        if self.learning and oid not in self.members:
            self.members.append(oid)
        self.inside.append(oid)
        return first

    def post_step(self, optimizer: Any) -> bool:
        """An optimizer's step completed; returns True if that completed the minibatch."""
        oid = id(optimizer)
        if oid in self.inside:
            del self.inside[len(self.inside) - 1 - self.inside[::-1].index(oid)]
        done = self.done if oid in self.done else [*self.done, oid]
        if self.inside:  # an outer step (ZeRO around its local optimizer) is still running
            self.done = done
            return False
        if self.learning:
            live = {id(opt) for opt in self._live_optimizers()}
            complete = live <= set(done)  # else another optimizer the script holds may still step
        else:
            complete = set(self.members) <= set(done)
        if not complete:
            self.done = done
            return False
        if self.learning:
            self._finish_learning(done)
        self._reset_minibatch()
        return True

    def collective_issued(self) -> None:
        """The training thread issues a collective; inside the optimizer phase that is worth recording."""
        if self.in_phase:
            self._collective_in_phase = True

    # ----- questions ---------------------------------------------------------------------

    def changed(self) -> bool:
        """True if the optimizer phase has applied something: the state is neither minibatch *i* nor *i+1*."""
        if not self.in_phase:
            return False
        if self.done:
            return True  # an optimizer completed its step in this minibatch (ZeRO's local step, D before G)
        if self._baseline is None:
            return True  # nothing recorded to prove otherwise
        params, versions = self._baseline
        return _version_sum(params) != versions

    def describe(self) -> str:
        """Why the state is not consistent, for the log line of a refused save."""
        if self.done:
            pending = "more" if self.learning else str(len(set(self.members) - set(self.done)))
            return f"{len(self.done)} optimizer step(s) of this minibatch are applied and {pending} are not"
        return "an optimizer step is under way and has changed parameters (or may have)"

    # ----- internals ---------------------------------------------------------------------

    def _finish_learning(self, done: list[int]) -> None:
        self.members = list(done)
        self.learning = False
        self._record_baseline = self._collective_in_phase

    def _relearn(self) -> None:
        self.learning = True
        self.members = []
        self._record_baseline = True

    def _reset_minibatch(self) -> None:
        self.in_phase = False  # first: the save thread must not see an open phase without its record
        self.done = []
        self._baseline = None
