"""``ncclorder``: a process-group backend that runs gloo under NCCL's ordering rules, on CPU tensors.

On gloo a collective's ``Work.wait()`` and its future complete when the
collective does, and a lost peer is an exception on the future.  On NCCL:

- ``Work.wait()`` and the future complete at *enqueue*: ``wait`` only makes the
  current CUDA stream wait, a ``then`` callback runs at once on the caller's
  thread;
- the collective finishes later, on the communicator's stream, in issue order;
  ``Work.is_completed()`` (an event query) says when;
- the host blocks only at the next consumer of the data (``.item()``, a
  device-to-host copy, ...), in whatever user frame that happens to be;
- a lost peer is not an exception on the future: the kernel spins (a hang),
  and the communicator may report an asynchronous error
  (``ncclCommGetAsyncError``).

This backend reproduces those rules over a real gloo process group so that
jitckpt's handling of them can be tested without a GPU:

- every collective of a process group runs on that group's *stream* thread,
  in issue order (the gloo call and its wait happen there);
- ``OrderedWork.wait()`` returns at once (except for ``barrier``, which NCCL
  also completes on the host), ``get_future()`` is already completed with the
  tensors, ``is_completed()`` is true only once gloo finished;
- data dependencies are kept as a CUDA stream keeps them: a
  ``TorchDispatchMode`` pushed on the thread that created the process group
  (the training thread) makes every aten op that reads or writes a tensor with
  a pending collective block until that collective finishes.  That is where
  the host blocks: inside ``loss.backward()`` at DDP's bucket copy, in
  ``.item()``, ``clip_grad_norm_``, the optimizer;
- an error raised by gloo on the stream thread (a lost peer) is never
  delivered through ``wait`` or the future: the work stays incomplete forever
  (consumers keep blocking) and the error is exposed by
  ``NcclOrderProcessGroup.async_error()``, as ``ncclCommGetAsyncError`` would.
  A hung peer is simply a work that never completes (until gloo's own timeout,
  which then also becomes the asynchronous error).

What it cannot model: real CUDA streams and events, the GIL behaviour of a
thread blocked in a CUDA synchronisation (here the blocked thread waits on a
Python condition and releases the GIL), NCCL's own watchdog and its
``TORCH_NCCL_*`` settings.  Other threads than the one that created the group
(and the autograd engine's, which inherit its modes) are not held back: on a
GPU they would be, on their own streams, only when they synchronise.
"""

from __future__ import annotations

import datetime
import queue
import threading
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

BACKEND_NAME = "ncclorder"

# Issuing or waiting on a collective is not a consumer of its data: NCCL only
# orders the streams there.  (Functional collectives dispatch through these.)
_COMMUNICATION_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd"})


class OrderedWork(dist._Work):
    """A collective's handle with NCCL's semantics (see the module docstring)."""

    def __init__(self, name: str, result: list[torch.Tensor], *, host_blocking_wait: bool = False) -> None:
        super().__init__()
        self.name = name
        self._done = threading.Event()
        self._result = result
        self._host_blocking_wait = host_blocking_wait
        self._future: torch.futures.Future = torch.futures.Future()
        self._future.set_result(result)  # completed at enqueue, as NCCL's

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """Returns at once (NCCL: the current stream waits, not the host); a barrier blocks the host."""
        if self._host_blocking_wait:
            seconds = timeout.total_seconds() if timeout else None
            return self._done.wait(seconds if seconds and seconds > 0 else None)
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        """True once the collective really finished (NCCL: a query of its end event)."""
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set()

    def exception(self) -> None:
        """Always None: a failure is an asynchronous communicator error, never the work's."""
        return None

    def result(self) -> list[torch.Tensor]:
        return self._result

    def synchronize(self) -> None:
        """NCCL: the current stream waits; nothing for the host to do."""

    def wait_until_done(self, timeout: float | None = None) -> bool:
        """Block the host until the collective finished (tests only)."""
        return self._done.wait(timeout)

    def _mark_done(self) -> None:
        self._done.set()


class _PendingCollectives:
    """Storages with an unfinished collective on them, and the condition their consumers wait on."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._by_storage: dict[int, list[OrderedWork]] = {}
        self._keys: dict[int, list[int]] = {}  # id(work) -> its storage keys
        self.count = 0  # works pending; read without the lock as a fast path

    def add(self, work: OrderedWork, tensors: Iterable[torch.Tensor]) -> None:
        keys = sorted({key for key in map(_storage_key, tensors) if key})
        with self._cond:
            for key in keys:
                self._by_storage.setdefault(key, []).append(work)
            self._keys[id(work)] = keys
            self.count += 1

    def finish(self, work: OrderedWork) -> None:
        with self._cond:
            for key in self._keys.pop(id(work), ()):
                works = self._by_storage.get(key, [])
                if work in works:
                    works.remove(work)
                if not works:
                    self._by_storage.pop(key, None)
            self.count -= 1
            work._mark_done()
            self._cond.notify_all()

    def wait_for(self, tensors: Iterable[torch.Tensor]) -> None:
        """Block until no unfinished collective touches any of ``tensors`` (the stream dependency)."""
        keys = {key for key in map(_storage_key, tensors) if key}
        if not keys:
            return
        with self._cond:
            while any(key in self._by_storage for key in keys):
                self._cond.wait()


_pending = _PendingCollectives()


def _storage_key(tensor: Any) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except Exception:  # no storage (meta, sparse, a wrapper subclass): its inner tensors are listed separately
        return 0


def _tensors_in(values: Any) -> list[torch.Tensor]:
    """Every tensor in ``values`` (nested), with the inner tensors of wrapper subclasses (AsyncCollectiveTensor)."""
    found: list[torch.Tensor] = []
    stack = [leaf for leaf in tree_leaves(values) if isinstance(leaf, torch.Tensor)]
    while stack:
        tensor = stack.pop()
        found.append(tensor)
        flatten = getattr(type(tensor), "__tensor_flatten__", None)
        if flatten is not None:
            names, _ = tensor.__tensor_flatten__()
            stack.extend(t for t in (getattr(tensor, name, None) for name in names) if isinstance(t, torch.Tensor))
    return found


class _StreamOrderMode(TorchDispatchMode):
    """On the training thread: an op touching a tensor with a pending collective waits for it (a CUDA stream dependency)."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if _pending.count and func.namespace not in _COMMUNICATION_NAMESPACES:
            _pending.wait_for(_tensors_in((args, kwargs)))
        return func(*args, **kwargs)


_mode_threads: set[int] = set()


def _install_stream_order_on_this_thread() -> None:
    """Push the ordering mode on the calling thread's dispatch-mode stack, once per thread, for good."""
    ident = threading.get_ident()
    if ident not in _mode_threads:
        _mode_threads.add(ident)
        _StreamOrderMode().__enter__()
        _hold_direct_reads()


def _hold_direct_reads() -> None:
    """``Tensor.tolist()`` and ``.numpy()`` read a CPU tensor's memory without an aten op: make them wait too.

    On a GPU both start with a device-to-host copy, which waits for the stream.
    """
    for name in ("tolist", "numpy"):
        original = getattr(torch.Tensor, name)
        if getattr(original, "_ncclorder_held", False):
            continue

        def held(self: torch.Tensor, *args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            if _pending.count and threading.get_ident() in _mode_threads:
                _pending.wait_for(_tensors_in(self))
            return _original(self, *args, **kwargs)

        held._ncclorder_held = True  # type: ignore[attr-defined]
        setattr(torch.Tensor, name, held)


class _Stream:
    """One process group's communication stream: a thread that runs its collectives in issue order."""

    def __init__(self, name: str) -> None:
        self.error: BaseException | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, work: OrderedWork, issue: Callable[[], Any]) -> None:
        self._queue.put((work, issue))

    def stop(self) -> None:
        self._queue.put(None)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            work, issue = item
            try:
                issue().wait()
            except BaseException as exc:  # a lost peer, gloo's timeout: an asynchronous error
                self.error = exc
                return  # the stream is stuck: this work and every later one stay incomplete, as on a GPU
            _pending.finish(work)


_live_groups: list["NcclOrderProcessGroup"] = []  # the Python objects must outlive C++'s references to them


class NcclOrderProcessGroup(dist.ProcessGroup):
    """A Python process group: gloo underneath, NCCL's ordering on top (see the module docstring)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta, group_name: str) -> None:
        super().__init__(rank, size)
        self._group_name = group_name
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore(f"{BACKEND_NAME}/", store), rank, size, timeout)
        self._stream = _Stream(f"{BACKEND_NAME}-stream-{group_name}")
        _install_stream_order_on_this_thread()
        _live_groups.append(self)

    # ----- identity --------------------------------------------------------------------

    def getBackendName(self) -> str:
        return BACKEND_NAME

    @property
    def group_name(self) -> str:
        return self._group_name

    def __repr__(self) -> str:
        return f"NcclOrderProcessGroup(rank={self.rank()}, size={self.size()}, group={self._group_name})"

    # ----- the asynchronous error --------------------------------------------------------

    def async_error(self) -> BaseException | None:
        """The communicator's asynchronous error (ncclCommGetAsyncError): a lost peer, a timeout; None if healthy."""
        return self._stream.error

    # ----- collectives -------------------------------------------------------------------

    def _enqueue(
        self,
        name: str,
        touched: list[torch.Tensor],
        result: list[torch.Tensor],
        issue: Callable[[], Any],
        host_blocking_wait: bool = False,
    ) -> OrderedWork:
        work = OrderedWork(name, result, host_blocking_wait=host_blocking_wait)
        _pending.add(work, touched)
        self._stream.submit(work, issue)
        return work

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> OrderedWork:
        opts = opts if opts is not None else dist.AllreduceOptions()
        return self._enqueue("allreduce", tensors, tensors, lambda: self._gloo.allreduce(tensors, opts))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> OrderedWork:
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        return self._enqueue("allreduce_coalesced", tensors, tensors, lambda: self._gloo.allreduce_coalesced(tensors, opts))

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> OrderedWork:
        opts = opts if opts is not None else dist.BroadcastOptions()
        return self._enqueue("broadcast", tensors, tensors, lambda: self._gloo.broadcast(tensors, opts))

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> OrderedWork:
        opts = opts if opts is not None else dist.ReduceOptions()
        return self._enqueue("reduce", tensors, tensors, lambda: self._gloo.reduce(tensors, opts))

    def allgather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> OrderedWork:
        opts = opts if opts is not None else dist.AllgatherOptions()
        flat = [t for group in outputs for t in group]
        return self._enqueue("allgather", flat + inputs, flat, lambda: self._gloo.allgather(outputs, inputs, opts))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> OrderedWork:
        opts = opts if opts is not None else dist.AllgatherOptions()
        return self._enqueue("all_gather_into_tensor", [output, input], [output], lambda: self._gloo._allgather_base(output, input, opts))

    def reduce_scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> OrderedWork:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        flat = [t for group in inputs for t in group]
        return self._enqueue("reduce_scatter", outputs + flat, outputs, lambda: self._gloo.reduce_scatter(outputs, inputs, opts))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> OrderedWork:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._enqueue("reduce_scatter_tensor", [output, input], [output], lambda: self._gloo._reduce_scatter_base(output, input, opts))

    def alltoall_base(
        self, output: torch.Tensor, input: torch.Tensor, output_splits: list[int], input_splits: list[int], opts: Any = None
    ) -> OrderedWork:
        opts = opts if opts is not None else dist.AllToAllOptions()
        return self._enqueue("all_to_all_single", [output, input], [output],
                             lambda: self._gloo.alltoall_base(output, input, output_splits, input_splits, opts))

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> OrderedWork:
        opts = opts if opts is not None else dist.AllToAllOptions()
        return self._enqueue("all_to_all", outputs + inputs, outputs, lambda: self._gloo.alltoall(outputs, inputs, opts))

    def gather(self, outputs: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> OrderedWork:
        opts = opts if opts is not None else dist.GatherOptions()
        flat = [t for group in outputs for t in group]
        return self._enqueue("gather", flat + inputs, flat, lambda: self._gloo.gather(outputs, inputs, opts))

    def scatter(self, outputs: list[torch.Tensor], inputs: list[list[torch.Tensor]], opts: Any = None) -> OrderedWork:
        opts = opts if opts is not None else dist.ScatterOptions()
        flat = [t for group in inputs for t in group]
        return self._enqueue("scatter", outputs + flat, outputs, lambda: self._gloo.scatter(outputs, inputs, opts))

    def barrier(self, opts: Any = None) -> OrderedWork:
        # NCCL's barrier is an all-reduce whose wait() synchronises the host; gloo's barrier needs a CPU device.
        return self._enqueue("barrier", [], [], lambda: self._gloo.barrier(dist.BarrierOptions()), host_blocking_wait=True)

    # ----- end of life -------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the stream thread after the collectives already issued."""
        self._stream.stop()

    def abort(self) -> None:
        self._stream.stop()


def _create(options: Any, backend_options: Any) -> NcclOrderProcessGroup:
    """torch.distributed's creator (extended API): ``options`` is a ``_DistributedBackendOptions``."""
    return NcclOrderProcessGroup(options.store, options.group_rank, options.group_size, options.timeout, options.group_id)


def register() -> None:
    """Register the ``ncclorder`` backend with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])
