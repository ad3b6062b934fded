"""Minibatch boundaries of a Python program in transparent mode, from PyTorch's optimizer step hooks.

Transparent mode's worker library keeps a log of the CUDA calls of the
current minibatch (``proxy_server/README.md``, "The call log").  A native
program marks its optimizer step itself, with ``jitckpt_phase_optimizer_begin()``
and ``jitckpt_phase_optimizer_end()``; a Python program is marked here:

- ``begin`` is called at the minibatch's **first optimizer pre-step** (where
  its optimizer phase opens);
- ``end`` is called when the minibatch's **optimizer phase ends**: the
  post-step of the last optimizer of the minibatch.

Which optimizers make up one minibatch is the user-level mode's notion,
reused unchanged: ``jitckpt.worker.minibatch.OptimizerPhase`` (a GAN steps
its discriminator and then its generator, ZeRO steps a local optimizer inside
its own, a script may step two optimizers over two parameter groups; the set
is learned in the first minibatch).  A step ``torch.amp.GradScaler`` skips
(inf/nan gradients) fires no optimizer hook; ``jitckpt.worker.skipped_steps``
counts it as a step that changed nothing, so it still begins and ends its
minibatch.  One limit of the learning: in the first minibatch, a script that
holds an optimizer it does not step has its first minibatch end only at the
next minibatch's first pre-step (the set is complete only then), so that
first boundary comes late.

``install_from_environment`` is what jit-run's worker bootstrap
(``jitckpt/worker/_bootstrap/sitecustomize.py``) calls when
``JITCKPT_TRANSPARENT=1``: it looks the two functions up in the process
(``ctypes.CDLL(None)``: ``libjitckpt_remote.so`` is preloaded) and, only if
both are there, registers the global optimizer hooks once ``torch.optim``
is imported (``jitckpt.worker.importhook``; torch is never imported here).
Without the library it does nothing.
"""

from __future__ import annotations

import ctypes
import os
from typing import Any, Callable, Optional

from jitckpt.config import ENV_TRANSPARENT
from jitckpt.worker.minibatch import OptimizerPhase

BEGIN_SYMBOL = "jitckpt_phase_optimizer_begin"
END_SYMBOL = "jitckpt_phase_optimizer_end"

PhaseCall = Callable[[], None]


def find_phase_functions(library: Optional[ctypes.CDLL] = None) -> Optional[tuple[PhaseCall, PhaseCall]]:
    """``(begin, end)``, both ``void f(void)``, from ``library`` (default: the whole process); None if either is missing."""
    try:
        library = ctypes.CDLL(None) if library is None else library
        begin, end = getattr(library, BEGIN_SYMBOL), getattr(library, END_SYMBOL)
    except (OSError, AttributeError):
        return None
    for function in (begin, end):
        function.restype = None
        function.argtypes = []
    return begin, end


class PhaseMarks:
    """Turns optimizer step hooks into ``begin``/``end`` calls, one minibatch spanning all its optimizers.

    ``live_optimizers`` returns the optimizers the script has constructed and
    still holds (``jitckpt.worker.sharding.optimizers``).  ``optimizer_phase``
    and ``optimizer_step_skipped`` are the names ``jitckpt.worker.skipped_steps``
    expects of its runtime.
    """

    def __init__(self, begin: PhaseCall, end: PhaseCall, live_optimizers: Callable[[], list[Any]]) -> None:
        self._begin = begin
        self._end = end
        self.optimizer_phase = OptimizerPhase(live_optimizers)
        self.begins = 0
        self.ends = 0

    def optimizer_pre_step(self, optimizer: Any) -> None:
        """Before every ``optimizer.step()``: end a minibatch only now known to be over, begin the phase if it opens."""
        phase = self.optimizer_phase
        if phase.close_previous(optimizer):
            self._call_end()
        opening = not phase.in_phase
        phase.enter(optimizer)
        if opening:
            self.begins += 1
            self._begin()

    def optimizer_post_step(self, optimizer: Any) -> None:
        """After every ``optimizer.step()``: the minibatch ends with its last optimizer's step."""
        if self.optimizer_phase.post_step(optimizer):
            self._call_end()

    def optimizer_step_skipped(self, optimizer: Any) -> None:
        """``GradScaler.step`` skipped ``optimizer.step()``: a step that changed nothing still counts."""
        self.optimizer_pre_step(optimizer)
        self.optimizer_post_step(optimizer)

    def _call_end(self) -> None:
        self.ends += 1
        self._end()


_marks: Optional[PhaseMarks] = None
_hooks_registered = False


def current() -> Optional[PhaseMarks]:
    """The installed ``PhaseMarks``, or None (not transparent mode, or no phase functions in the process)."""
    return _marks


def install(begin: PhaseCall, end: PhaseCall) -> PhaseMarks:
    """Create the process's ``PhaseMarks`` for ``begin``/``end`` (once; the first call's functions stay)."""
    global _marks
    if _marks is None:
        from jitckpt.worker import sharding

        _marks = PhaseMarks(begin, end, sharding.optimizers)
    return _marks


def register_hooks(marks: PhaseMarks) -> None:
    """Register the global optimizer step hooks that feed ``marks`` (once; imports torch.optim)."""
    global _hooks_registered
    if _hooks_registered:
        return
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from jitckpt.worker import sharding

    sharding.install()  # notes every optimizer constructed from now on: the live set of the first minibatch
    register_optimizer_step_pre_hook(lambda opt, args, kwargs: marks.optimizer_pre_step(opt))
    register_optimizer_step_post_hook(lambda opt, args, kwargs: marks.optimizer_post_step(opt))
    _hooks_registered = True


def install_from_environment() -> bool:
    """In a transparent-mode worker with the remote library preloaded, hook in when torch is imported.

    Returns True if the hooks will be (or were) registered; False outside
    transparent mode (``JITCKPT_TRANSPARENT`` is not ``1``) or when the phase
    functions are not in the process.  Imports no torch itself: the optimizer
    hooks are registered right after ``torch.optim`` is imported, and
    ``GradScaler.step`` is wrapped right after ``torch.amp.grad_scaler`` is.
    """
    if os.environ.get(ENV_TRANSPARENT) != "1":
        return False
    functions = find_phase_functions()
    if functions is None:
        return False
    marks = install(*functions)
    from jitckpt.worker import importhook, skipped_steps

    importhook.install({
        "torch.optim": lambda module: register_hooks(marks),
        # duck-typed runtime: optimizer_phase, optimizer_step_skipped
        "torch.amp.grad_scaler": lambda module: skipped_steps.install(marks),  # type: ignore[arg-type]
    })
    return True
