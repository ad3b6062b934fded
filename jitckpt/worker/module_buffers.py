"""Module buffers (BatchNorm running statistics) as they were at the start of the minibatch.

Forward passes update some buffers in place: BatchNorm's ``running_mean``,
``running_var`` and ``num_batches_tracked``.  When a failure interrupts
minibatch *i* after its first forward, the parameters are still those of
the start of *i* but these buffers already count *i*'s forward passes; a
checkpoint of that state would count them twice once *i* is redone.

So jitckpt copies the buffers of every module it trains through DDP at the
first forward of each minibatch (one ``torch._foreach_copy_`` into copies
allocated once), and before the user's ``save(path)`` of "start of minibatch
*i*" it puts the copies in the modules' place of the live buffers: the
user's ``state_dict()`` then returns the copies.  Not a copy back into the
live buffers: forward work queued behind the hung collective (NCCL
semantics: the host runs ahead of the device) still writes the live ones,
and an abort of the collective releases it while the save reads (found with
the strict test backend: a checkpoint whose BatchNorm counted one micro-batch
more in two layers out of three, then a resume that was not bit-exact).
Nothing writes the copies once taken.  The training thread is parked by then
and the process exits after the save, so nothing else sees the exchange.
Models without buffers cost nothing.
"""

from __future__ import annotations

import weakref
from typing import Any


class BufferSnapshots:
    """Start-of-minibatch copies of the buffers of the modules trained through DDP."""

    def __init__(self) -> None:
        self._modules: list[weakref.ref] = []
        self._live: list[Any] = []
        self._copies: list[Any] = []
        self._scanned = False
        self.step: int | None = None  # the minibatch whose start the copies hold
        self._taken: Any = None  # CUDA buffers: an event after the snapshot copy

    def note_module(self, module: Any) -> None:
        """Track ``module``'s buffers from now on (idempotent)."""
        if any(ref() is module for ref in self._modules):
            return
        self._modules.append(weakref.ref(module))
        self.step = None
        self._scanned = False

    def _buffers(self) -> list[Any]:
        buffers = []
        for ref in self._modules:
            module = ref()
            if module is not None:
                buffers.extend(b for b in module.buffers() if b is not None)
        return buffers

    def take(self, step: int) -> None:
        """Copy the buffers as they are at the start of minibatch ``step`` (once per minibatch)."""
        if self.step == step or not self._modules:
            return
        if not self._scanned:  # once per tracked module set: module.buffers() walks the whole model
            self._live = self._buffers()
            self._copies = [b.detach().clone() for b in self._live]
            self._scanned = True
        elif self._live:
            import torch

            with torch.no_grad():
                torch._foreach_copy_(self._copies, self._live)
        if self._live and self._live[0].is_cuda:
            import torch

            # Where the copy sits on the training stream: the rewind waits for this, and for nothing after it.
            self._taken = torch.cuda.Event()
            self._taken.record()
        self.step = step

    def rewind(self, step: int) -> bool:
        """Make the modules hold the buffers of the start of minibatch ``step``; False if no copy of that step exists.

        The snapshot takes the live buffers' place in each module (``module._buffers``), so that a save
        reads values no queued forward work can change; on a GPU the host first waits for the snapshot's
        own copy (recorded right after it on the training stream: it waits for nothing later).
        """
        if self.step != step or not self._live:
            return False
        if self._taken is not None:
            self._taken.synchronize()
        index = {id(buffer): i for i, buffer in enumerate(self._live)}
        for ref in self._modules:
            module = ref()
            if module is None:
                continue
            for sub in module.modules():
                for name, buffer in list(sub._buffers.items()):
                    i = index.get(id(buffer)) if buffer is not None else None
                    if i is not None:
                        sub._buffers[name] = self._copies[i]
        return True
