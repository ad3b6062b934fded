"""DDP's gradient-bucket layout: recorded in every JIT save, imposed again on resume.

Why: DDP all-reduces gradients bucket by bucket.  Its first iteration uses a
bucket layout in parameter order; after that it rebuilds the buckets in the
order gradients became ready.  With more than two ranks, where an element
sits in a bucket decides the order in which gloo/NCCL add up the ranks'
values, so a job resumed at minibatch i (first iteration: initial layout)
sums differently from the uninterrupted job (rebuilt layout) and the result
is no longer bit-for-bit the same.  (Measured here: plain torchrun, 4 ranks,
resume at step 12 from a torch.save of the exact state -> different final
parameters; 2 ranks -> identical, since a+b == b+a.)

So the JIT save records each DDP module's gradient-ready order, and on
resume the first bucket assignment of the matching DDP module is computed
from that order, exactly as DDP's own rebuild computes it.  DDP's later
rebuild then arrives at the same layout again.
"""

from __future__ import annotations

import inspect
import json
import weakref
from pathlib import Path
from typing import Any, Callable

from jitckpt.store.base import PendingCheckpoint

LAYOUT_FILE = "jitckpt-ddp-layout.json"

_instances: list[weakref.ref] = []
_pending_orders: list[list[int] | None] = []
_constructed = 0


def note_forward(ddp: Any, after_rebuild: bool = False) -> None:
    """Called at each DDP forward until the module has rebuilt its buckets; then its layout is fixed.

    DDP rebuilds its buckets in the first forward after its first backward
    that all-reduced (with ``no_sync`` gradient accumulation, after several
    forwards).  ``after_rebuild``: called right after DDP's ``_pre_forward``,
    where that rebuild happens; DDP's logging data, where the gradient-ready
    order is read, is refreshed then (it is updated only at the start of a
    forward that all-reduces, so a ``no_sync`` forward would see the old one).
    The layout is read on the training thread, because at save time the
    reducer's lock may be held by a backward pass that is stuck in a dead
    collective.
    """
    if getattr(ddp, "_jitckpt_layout", None) is not None:
        return
    rebuilt = getattr(ddp, "_has_rebuilt_buckets", None)  # (DDP's own flag, set where it rebuilds)
    if rebuilt is False:
        return  # not yet, or never (find_unused_parameters): the recorded layout stays the initial one
    if rebuilt is None:  # (a torch without the flag: DDP rebuilds after its first iteration or never)
        probes = getattr(ddp, "_jitckpt_layout_probes", 0) + 1
        ddp._jitckpt_layout_probes = probes
        if probes > 8:
            ddp._jitckpt_layout = {"rebuilt": False, "ready_order": []}
            return
    if after_rebuild:
        try:
            ddp.logger.set_runtime_stats_and_log()  # (telemetry only; in the first iterations it records every time)
        except Exception:  # noqa: BLE001  (read below what is there)
            pass
    data = ddp._get_ddp_logging_data()
    if data.get("has_rebuilt_buckets", 0):
        order_text = str(data.get("prev_iteration_grad_ready_order_indices", ""))
        ddp._jitckpt_layout = {"rebuilt": True, "ready_order": [int(x) for x in order_text.split(",") if x.strip()]}


def note_backward_done() -> None:
    """Before an optimizer step (on the training thread, the gradients all-reduced): for each DDP module that
    has not rebuilt its buckets yet, the gradient-ready order it will rebuild them from at its next forward.

    A JIT save before that forward describes the start of a minibatch that the
    fault-free run all-reduces with the rebuilt layout, so the save records it
    (``capture``) although the module has not rebuilt yet.
    """
    for ref in _instances:
        ddp = ref()
        if ddp is None or getattr(ddp, "_jitckpt_layout", None) is not None:
            continue
        if getattr(ddp, "_has_rebuilt_buckets", True):
            continue  # (rebuilt, or a torch without the flag: note_forward's probes)
        if getattr(ddp, "find_unused_parameters", False) and not getattr(ddp, "static_graph", False):
            continue  # (DDP never rebuilds then)
        try:
            ddp.logger.set_runtime_stats_and_log()  # (telemetry only; in the first iterations it records every time)
            order_text = str(ddp._get_ddp_logging_data().get("prev_iteration_grad_ready_order_indices", ""))
        except Exception:  # noqa: BLE001  (no logger: the layout stays the one noted at the forwards)
            continue
        order = [int(x) for x in order_text.split(",") if x.strip()]
        if order:
            ddp._jitckpt_next_layout = {"rebuilt": True, "ready_order": order}


def capture() -> list[dict[str, Any]]:
    """The layout of every DDP module, in construction order: the rebuilt one, or the one it will rebuild
    at its next forward (``note_backward_done``), or the initial one."""
    layouts = []
    for ref in _instances:
        ddp = ref()
        layout = None
        if ddp is not None:
            layout = getattr(ddp, "_jitckpt_layout", None) or getattr(ddp, "_jitckpt_next_layout", None)
        layouts.append(layout or {"rebuilt": False, "ready_order": []})
    return layouts


def write(pending: PendingCheckpoint) -> None:
    """Record every DDP module's layout in the pending checkpoint (through the store, which sets its mode)."""
    pending.write_file(LAYOUT_FILE, json.dumps(capture()).encode())


def load(directory: Path) -> None:
    """Arrange for DDP modules constructed from now on to start with the recorded layouts."""
    global _pending_orders
    path = Path(directory) / LAYOUT_FILE
    if not path.is_file():
        return
    layouts = json.loads(path.read_text())
    _pending_orders = [entry["ready_order"] if entry.get("rebuilt") else None for entry in layouts]


def _rebuild_limits(caller: Any, fallback: list) -> list:
    """The bucket size limits DDP's C++ reducer uses when it rebuilds (read from DDP's init frame).

    An empty ``bucket_size_limits_for_rebuilding`` means the reducer's default:
    a small first bucket, then ``bucket_bytes_cap``.
    """
    local = caller.f_locals if caller is not None else {}
    limits = local.get("bucket_size_limits_for_rebuilding")
    if limits:
        return list(limits)
    ddp = local.get("self")
    config = getattr(ddp, "_bucket_config", None)
    if ddp is None or config is None:
        return fallback
    return [int(config.first_bucket_bytes_cap), int(ddp.bucket_bytes_cap)]


def install(before_construct: Callable[[], None]) -> None:
    """Patch DDP construction and torch.distributed's bucket assignment (idempotent).

    ``before_construct`` runs before each DDP module is built; the runtime uses
    it to locate the checkpoint (and call load()) if the script builds DDP
    before calling jit_get_checkpoint_path().
    """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if getattr(DDP.__init__, "_jitckpt_wrapped", False):
        return
    original_init = DDP.__init__
    original_assign = dist._compute_bucket_assignment_by_size
    state = {"order": None}

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        global _constructed
        before_construct()
        index = _constructed
        _constructed += 1
        state["order"] = _pending_orders[index] if index < len(_pending_orders) else None
        imposed = state["order"]
        try:
            original_init(self, *args, **kwargs)
        finally:
            state["order"] = None
        if imposed:  # (built with the rebuilt layout: a save before its own rebuild records that one)
            self._jitckpt_next_layout = {"rebuilt": True, "ready_order": list(imposed)}
        _instances.append(weakref.ref(self))

    def assign(tensors: list, limits: list, *args: Any, **kwargs: Any) -> Any:
        order = state["order"]
        state["order"] = None
        if not order or sorted(order) != list(range(len(tensors))) or len(args) > 1 or kwargs.get("tensor_indices"):
            return original_assign(tensors, limits, *args, **kwargs)
        rebuild_limits = _rebuild_limits(inspect.currentframe().f_back, limits)
        sparse = args[0] if args else kwargs.get("expect_sparse_gradient", [False] * len(tensors))
        buckets, sizes = original_assign([tensors[i] for i in order], rebuild_limits, [sparse[i] for i in order], order)
        # DDP reverses the bucket list it gets (to approximate backward order);
        # the rebuilt layout is already in backward order, so pre-reverse it.
        return list(reversed(buckets)), list(reversed(sizes))

    init._jitckpt_wrapped = True  # type: ignore[attr-defined]
    DDP.__init__ = init
    dist._compute_bucket_assignment_by_size = assign
