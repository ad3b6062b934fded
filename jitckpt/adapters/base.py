"""What every framework adapter does with the worker's runtime.

An adapter stands in for the two calls a user would add to the script
(README, "Using it"): it registers the framework's own save as the JIT save
function and, on a restart, hands the framework the JIT checkpoint to resume
from.  The pieces here are the framework-neutral part of that:

- ``wrap_entry_point``: ``Trainer.train`` / ``Trainer.fit`` set up the rest
  and get the checkpoint to resume from;
- ``claim``: the save function goes in only if the script registered none
  (``jitckpt.register_save_checkpoint`` always wins);
- ``resume_point``: the checkpoint this attempt resumes from, looked up once
  per process, as ``jitckpt.jit_get_checkpoint_path()`` would;
- ``MinibatchRng``: the RNG state at the framework's own start of each
  minibatch goes into the host stash, and after a resume it is put back at
  that same point;
- ``track_closure_steps``: an optimizer step that runs the minibatch's
  forward and backward inside ``step(closure)`` (Lightning's automatic
  optimization, LBFGS) is in the optimizer phase only once the closure has
  returned.
"""

from __future__ import annotations

import functools
import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from jitckpt import worker
from jitckpt.worker import private_rng, resume, rng_state
from jitckpt.worker.console import log

if TYPE_CHECKING:
    from jitckpt.worker.runtime import JitRuntime

_ADAPTER_SAVE = "_jitckpt_adapter"
_resume_looked_up = False

# prepare(trainer, runtime, the value the script passed) -> the value the entry point gets
Prepare = Callable[[Any, "JitRuntime", Any], Any]


def wrap_entry_point(cls: type, name: str, argument: str, prepare: Prepare) -> None:
    """Wrap ``cls.<name>`` so that in a jit-run worker its ``argument`` (the checkpoint to resume from) is ``prepare``'s."""
    original = getattr(cls, name)
    if getattr(original, "_jitckpt_wrapped", False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def entry_point(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt = worker.current()
        try:
            bound = signature.bind(self, *args, **kwargs)
        except TypeError:
            return original(self, *args, **kwargs)  # let the framework report the bad call
        if rt is not None:
            bound.arguments[argument] = prepare(self, rt, bound.arguments.get(argument))
        return original(*bound.args, **bound.kwargs)

    entry_point._jitckpt_wrapped = True  # type: ignore[attr-defined]
    setattr(cls, name, entry_point)


def claim(rt: "JitRuntime", save_fn: Callable[[str], Any], framework: str) -> bool:
    """Register ``save_fn`` for ``framework`` unless the script registered its own; True if registered."""
    current = rt.save_fn
    if current is not None and not getattr(current, _ADAPTER_SAVE, False):
        log(f"{framework}: the script registered its own save function; the adapter leaves saving and resuming to it")
        return False
    setattr(save_fn, _ADAPTER_SAVE, True)
    rt.save_fn = save_fn
    rt.framework = framework  # (jitckpt.worker.minibatch_gap: a framework's resume replays work of its own)
    return True


def resume_point(rt: "JitRuntime") -> Path | None:
    """The JIT checkpoint directory this attempt resumes from, or None (also on every call after the first)."""
    global _resume_looked_up
    if _resume_looked_up or rt.resumed_from is not None:
        return None  # one training run per process resumes; or the script looked it up itself
    _resume_looked_up = True
    info = resume.locate(rt)
    rt.arm_memory_snapshot()
    if info is None:
        resume.fresh_start(rt)
        return None
    resume.resume(rt, info)
    return info.path


class MinibatchRng:
    """This rank's RNG state at the framework's start of each minibatch: stashed there, restored there after a resume.

    The runtime's optimizer-step hook stashes the state the next minibatch
    starts with right before the step; the framework then still draws from
    it (a new epoch's data loader seeds, evaluation) before that minibatch
    runs.  ``stash()`` at the framework's own start of the minibatch replaces
    it, and after a resume ``restore()`` puts the rank's restored state back
    at the same point, after the framework has rebuilt its data loader.
    """

    def __init__(self, rt: "JitRuntime") -> None:
        self.rt = rt
        # resume_point() found this rank's own state for the redone minibatch: restored here, at the
        # framework's own start of it, instead of at the runtime's (the first module forward)
        self._resumed_state = rt.take_pending_rng() if rt.resumed_from is not None else None

    def stash(self) -> None:
        now = rng_state.capture()
        self.rt.gap.framework_start(now)  # (draws since the step before: a rank that died before here lacks them)
        self.rt.stash_rng(self.rt.step, now)
        self.rt.close_own_generators_window()  # (the framework's minibatch start is where its state is taken)

    def drop(self) -> None:
        """Forget the state to put back: the adapter placed the redone minibatch's state otherwise."""
        self._resumed_state = None

    def restore(self) -> None:
        """Put back the state the redone minibatch starts with (once, on a resumed attempt)."""
        if self._resumed_state is not None:
            rng_state.restore(self._resumed_state)
            private_rng.warn_absent()
            self._resumed_state = None


_closure_hook_installed = False


def track_closure_steps(rt: "JitRuntime") -> None:
    """Keep the minibatch phase right for ``optimizer.step(closure)`` (installed once, globally)."""
    global _closure_hook_installed
    if _closure_hook_installed:
        return
    _closure_hook_installed = True
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    def pre_step(optimizer: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        # The runtime's own pre-step hook ran first: "optimizer" marks the step of the
        # optimizer that counts minibatches.
        closure = kwargs.get("closure", args[0] if args else None)
        if closure is None or rt.phase != "optimizer":
            return None

        def forward_backward_then_step() -> Any:
            rt.phase = "forward"  # its collectives are the gradient all-reduce, safe points as usual
            result = closure()
            rt.park_if_requested()  # the parameters are still those of the minibatch's start
            rt.phase = "optimizer"
            rt.stash_rng(rt.step + 1)  # what the next minibatch starts with, now that backward is done
            return result

        if "closure" in kwargs:
            return args, {**kwargs, "closure": forward_backward_then_step}
        return (forward_backward_then_step, *args[1:]), kwargs

    register_optimizer_step_pre_hook(pre_step)
