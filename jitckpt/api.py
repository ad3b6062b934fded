"""The public API: two calls, named as in the paper.

    import jitckpt
    jitckpt.register_save_checkpoint(save)    # save(path): write my state into directory `path`
    path = jitckpt.jit_get_checkpoint_path()  # None on a fresh start, else a directory save() wrote
    if path:
        load(path)

Under ``jit-run`` the first call arms the just-in-time save and the second finds
the newest verified replica checkpoint for this rank's model shard.  Outside
jit-run both are no-ops with one warning, so the same script runs anywhere.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable

from jitckpt import worker

_checkpoint_lookup_done = False
_checkpoint_path: str | None = None
_warned_inactive = False


class JitckptInactiveWarning(UserWarning):
    """jitckpt was called outside jit-run; nothing will be saved on failure."""


def _warn_inactive() -> None:
    global _warned_inactive
    if not _warned_inactive:
        _warned_inactive = True
        warnings.warn(
            "jitckpt: not running under jit-run, so just-in-time checkpointing is off "
            "(register_save_checkpoint and jit_get_checkpoint_path are no-ops). "
            "Launch with `jit-run torchrun ...` to enable it.",
            JitckptInactiveWarning,
            stacklevel=3,
        )


def register_save_checkpoint(fn: Callable[[str], Any]) -> None:
    """Register ``fn(path)``, called on a failure to write this rank's state into directory ``path``.

    ``fn`` runs on a jitckpt thread while the training loop is stopped at a
    safe point.  It must not use collectives (peers may be dead): save this
    rank's model, optimizer, scheduler and any CPU state with plain file I/O.
    RNG states are captured by jitckpt itself.
    """
    if not callable(fn):
        raise TypeError(f"register_save_checkpoint expects a callable save(path), got {type(fn).__name__}")
    rt = worker.arm()
    if rt is None:
        _warn_inactive()
        return
    rt.save_fn = fn


def jit_get_checkpoint_path() -> str | None:
    """Directory of the newest complete, verified checkpoint covering this rank's shard, or None.

    On a restart after a failure this is a directory some data-parallel replica's
    save() wrote (torn or corrupt ones are skipped with a warning).  This rank's
    own RNG state for the checkpointed minibatch is put back when that
    minibatch starts (its first module forward), so random numbers the script
    draws in between (a DataLoader iterator's seed) do not shift it.  Call it
    after building the model and optimizer, before the training loop.  Returns
    None on a fresh start and outside jit-run.
    """
    global _checkpoint_lookup_done, _checkpoint_path
    rt = worker.arm()
    if rt is None:
        _warn_inactive()
        return None
    if _checkpoint_lookup_done:
        return _checkpoint_path
    from jitckpt.worker import resume

    info = resume.locate(rt)
    if info is None:
        resume.fresh_start(rt)
        _checkpoint_path = None
    else:
        resume.resume(rt, info)
        _checkpoint_path = str(info.path)
    rt.arm_memory_snapshot()
    _checkpoint_lookup_done = True
    return _checkpoint_path


def current_step() -> int | None:
    """Minibatches completed so far as counted by jitckpt (optimizer steps), or None outside jit-run."""
    rt = worker.arm()
    return None if rt is None else rt.step
