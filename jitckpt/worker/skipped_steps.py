"""Optimizer steps that ``torch.amp.GradScaler`` skips still count as minibatches.

With mixed precision, ``scaler.step(optimizer)`` does not call
``optimizer.step()`` when the unscaled gradients hold an inf or a NaN (it
lowers the scale in ``update()`` instead).  No optimizer hook fires, so
jitckpt's minibatch count, which labels the JIT save and keys the per-rank
RNG stash, would fall behind the script's own with every skipped step: a
save at the script's minibatch 9 after two skipped steps would be labelled 7
and restore the RNG state of the wrong minibatch.

``install`` wraps ``GradScaler.step`` (``torch.amp.GradScaler``; the
deprecated ``torch.cuda.amp.GradScaler`` and FSDP's ``ShardedGradScaler``
inherit it): when the call returns without any optimizer step having begun,
the runtime counts a step of that optimizer that changed nothing
(``JitRuntime.optimizer_step_skipped``).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jitckpt.worker.runtime import JitRuntime


def install(runtime: "JitRuntime") -> None:
    """Wrap ``torch.amp.GradScaler.step`` once (idempotent)."""
    from torch.amp.grad_scaler import GradScaler

    original = GradScaler.step
    if getattr(original, "_jitckpt_wrapped", False):
        return

    @functools.wraps(original)
    def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        before = runtime.optimizer_phase.pre_steps
        result = original(self, optimizer, *args, **kwargs)
        if runtime.optimizer_phase.pre_steps == before:
            runtime.optimizer_step_skipped(optimizer)
        return result

    step._jitckpt_wrapped = True  # type: ignore[attr-defined]
    GradScaler.step = step  # type: ignore[method-assign]
