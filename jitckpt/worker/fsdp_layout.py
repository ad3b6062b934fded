"""FSDP2's parameter layout held still for a JIT save (issue 18: a preemption inside an FSDP2 backward).

FSDP2 (``fully_shard``) swaps the parameters registered on each module
between the sharded DTensors (the state) and all-gathered full tensors (for
a forward or a backward), from whichever thread runs its hooks: the training
thread, or on a GPU autograd's device thread.  A JIT save runs on jitckpt's
save thread, and may start while a collective of the minibatch is in flight:
no parameter *value* can change then (the optimizer step cannot pass it), but
the *layout* still does.  The user's ``state_dict()`` then read full tensors
(or freed ones: a checkpoint that cannot be loaded), and FSDP2's own
pre-state-dict hook freed full parameters under device work still writing
them (rank 1 died with SIGSEGV in 3 of 4 runs of the strict matrix's
fsdp-term-backward and fsdp-term-allreduce cases).

So, from the moment a JIT event is raised, every swap is a safe point where
the swapping thread parks for good (the minibatch cannot get past it;
unless the state is half applied, as at every safe point), and
the save (``freeze``) registers the sharded parameters on every module again,
under the lock that a swap in progress holds.  The full tensors are not freed:
queued device work may still write them, and the process exits after the save.
The swap wrapped is ``FSDPParam._setattr_on_modules``, the one place where
FSDP2 registers a parameter; it never waits for the device.
"""

from __future__ import annotations

import gc
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jitckpt.worker.runtime import JitRuntime

MODULE = "torch.distributed.fsdp._fully_shard._fsdp_param"
GROUP_MODULE = "torch.distributed.fsdp._fully_shard._fsdp_param_group"

_lock = threading.Lock()
_frozen_by: list[threading.Thread] = []  # the thread that froze the layout (the save's; not its ident: reused)


def install(runtime: "JitRuntime") -> None:
    """Wrap FSDP2's parameter swap once ``torch.distributed.fsdp`` is imported (idempotent)."""
    from jitckpt.worker import importhook

    importhook.install({MODULE: lambda module: _patch(runtime, module)})


def _patch(runtime: "JitRuntime", module: Any) -> None:
    cls = getattr(module, "FSDPParam", None)
    original = getattr(cls, "_setattr_on_modules", None)
    if original is None or getattr(original, "_jitckpt_layout", False):
        return

    def setattr_on_modules(self: Any, param: Any) -> None:
        if threading.current_thread() not in _frozen_by:
            runtime.park_if_requested()  # a JIT event: the layout the save will see must not change any more
        with _lock:
            if _frozen_by and threading.current_thread() not in _frozen_by:
                runtime.park_forever()
            original(self, param)

    setattr_on_modules._jitckpt_layout = True  # type: ignore[attr-defined]
    setattr_on_modules._jitckpt_original = original  # type: ignore[attr-defined]
    cls._setattr_on_modules = setattr_on_modules


def freeze() -> int:
    """Register every FSDP2 module's sharded parameters again and keep them there; returns how many groups were not.

    Called by the JIT save before the user's save function, on the save
    thread.  Every parameter group is then marked sharded, so that FSDP2's
    pre-state-dict hook finds nothing to do (it would free the full tensors).
    Raises RuntimeError when a group cannot be read, so that the save refuses
    rather than writes a checkpoint that cannot be loaded.
    """
    param_module = sys.modules.get(MODULE)
    group_module = sys.modules.get(GROUP_MODULE)
    group_type = getattr(group_module, "FSDPParamGroup", None)
    if param_module is None or group_type is None:
        return 0
    sharded = param_module.ShardedState.SHARDED
    setattr_on_modules = param_module.FSDPParam._setattr_on_modules
    setattr_on_modules = getattr(setattr_on_modules, "_jitckpt_original", setattr_on_modules)
    changed = 0
    with _lock:
        _frozen_by.append(threading.current_thread())
        for group in [obj for obj in gc.get_objects() if issubclass(type(obj), group_type)]:
            try:
                if group._sharded_state == sharded and all(p.sharded_state == sharded for p in group.fsdp_params):
                    continue
                for fsdp_param in group.fsdp_params:
                    setattr_on_modules(fsdp_param, fsdp_param.sharded_param)
                    fsdp_param.sharded_state = sharded
                group._sharded_state = sharded
            except Exception as exc:
                raise RuntimeError(f"could not put an FSDP2 parameter group back into its sharded layout "
                                   f"before saving ({type(exc).__name__}: {exc})") from exc
            changed += 1
    return changed
