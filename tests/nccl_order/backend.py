"""``ncclorder``: a process-group backend that runs gloo under NCCL's ordering rules, on CPU tensors.

On gloo a collective's ``Work.wait()`` and its future complete when the
collective does, a lost peer is an exception on the future, and every aten op
runs when the host calls it.  On NCCL (torch's ``ProcessGroupNCCL``, the spec
this backend follows):

- ``Work.wait()`` and the future complete at *enqueue*: ``wait`` only makes the
  current CUDA stream wait, a ``then`` callback runs at once on the caller's
  thread;
- the collective finishes later, on the communicator's stream, in issue order;
  ``Work.is_completed()`` (an event query) says when;
- compute on the collective's tensors is *queued* on the compute stream behind
  it; the host does not wait, it runs ahead (through ``backward()``, into the
  optimizer step) and blocks only where it needs data: ``.item()``, a
  device-to-host copy (``tolist``, ``numpy``), data-dependent ops
  (``nonzero``, ``bool(t)``), a synchronisation, a barrier, ``wait()`` with
  ``TORCH_NCCL_BLOCKING_WAIT=1``;
- a failed collective (a lost peer, a timeout) makes ``is_completed()`` true
  with ``exception()`` set, ``get_error()`` reports it (``COMM_ERROR`` or
  ``TIMEOUT``), ``wait()`` raises it; the communicator is aborted: later
  collectives on it fail the same way, and the streams move on (the data is
  whatever the failed collective left);
- autograd runs a CUDA backward on a device thread: DDP's comm hook and the
  autograd callbacks run there while the calling thread waits in
  ``backward()``.

This backend reproduces those rules over a real gloo process group:

- every collective of a process group runs on that group's *stream* thread,
  in issue order, after the queued compute that wrote its tensors (NCCL's
  communication stream waits for the compute stream at issue);
- a ``TorchDispatchMode`` on the training thread (and the device thread) is
  the compute stream's front end.  An aten op that touches (reads or writes) a
  storage with pending work is not run now: it is appended to the one FIFO
  *compute stream* thread, which runs each op once the pending work on its
  storages finished (a stream with a blocking head: a hung collective holds
  everything queued behind it).  Every storage a queued op touches is pending
  until it ran.  The host gets back at once: views (they read no data),
  the mutated arguments of in-place and ``out=`` ops, and for new outputs
  empty tensors shaped by the op's meta kernel, filled when the queued op
  runs.  The host waits for the storages and runs the op itself (a
  synchronisation) for ops returning non-tensors, with data-dependent output
  shapes, drawing random numbers (host order of the draws), changing tensor
  metadata in place, without a meta kernel, and on tensor subclasses
  (DTensor, whose own dispatch runs below this mode).  Ops on tensors with
  nothing pending run at once: the host runs the optimizer's step counters
  ahead of the device;
- ``OrderedWork.wait()`` returns at once (``barrier`` and blocking wait block
  the host), ``get_future()`` is already completed with the tensors,
  ``is_completed()`` is true once gloo finished or failed;
- ``torch.autograd``'s backward runs on one *device* thread per process
  (``_engine_run_backward``), with the caller waiting for it.

What it cannot model: real CUDA streams and events (here dependencies are by
storage: an op independent of a pending collective is not ordered behind it,
as it would be on the same CUDA stream), the GIL behaviour of a thread blocked
in a CUDA synchronisation (here the blocked thread waits on a Python event and
releases the GIL), NCCL's own watchdog and its ``TORCH_NCCL_*`` settings other
than ``TORCH_NCCL_BLOCKING_WAIT``.  Memory read without an aten op from a
thread other than the training and device threads (``torch.save`` on a save
thread) is read as it is now, as a copy on an unrelated stream would; a
device-to-host read on the training thread (``tolist``, ``numpy``) and a
storage resize (FSDP2 freeing an unsharded parameter) wait.  An error raised
by a queued op (a CUDA kernel's asynchronous error) is raised at the next
synchronisation of the host.  The group is a Python ``ProcessGroup`` with no
per-device backend: C++ that looks one up (the functional collectives,
DTensor's ``full_tensor``) fails with "No backend type associated with device
type cpu".
"""

from __future__ import annotations

import atexit
import datetime
import os
import queue
import threading
import time
from typing import Any, Callable, Iterable

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import ErrorType
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten, tree_leaves, tree_map_only, tree_unflatten

BACKEND_NAME = "ncclorder"

# Issuing or waiting on a collective is not a consumer of its data: NCCL only
# orders the streams there.  (Functional collectives dispatch through these.)
_COMMUNICATION_NAMESPACES = frozenset({"c10d", "_c10d_functional", "c10d_functional", "_c10d_functional_autograd"})


# ----- pending work: what a storage waits for ----------------------------------------------------


class _Pending:
    """One queued item (a collective or a compute op): done once it ran, with its error if it failed."""

    __slots__ = ("name", "done", "error", "keys")

    def __init__(self, name: str) -> None:
        self.name = name
        self.done = threading.Event()
        self.error: BaseException | None = None
        self.keys: tuple[int, ...] = ()


class _PendingStorages:
    """Storages with queued work on them: each new item depends on the earlier items on its storages."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_storage: dict[int, list[_Pending]] = {}
        self._live: dict[int, _Pending] = {}  # id(item) -> item, in enqueue order
        self.count = 0  # items pending; read without the lock as a fast path

    def add(self, item: _Pending, tensors: Iterable[torch.Tensor]) -> list[_Pending]:
        """Make ``item`` pending on the storages of ``tensors``; returns the earlier items it must wait for."""
        keys = _storage_keys(tensors)
        with self._lock:
            before: dict[int, _Pending] = {}
            for key in keys:
                for earlier in self._by_storage.get(key, ()):
                    before[id(earlier)] = earlier
                self._by_storage.setdefault(key, []).append(item)
            item.keys = keys
            self._live[id(item)] = item
            self.count += 1
        return list(before.values())

    def finish(self, item: _Pending, error: BaseException | None = None) -> None:
        with self._lock:
            for key in item.keys:
                items = self._by_storage.get(key)
                if items is not None:
                    items.remove(item)
                    if not items:
                        del self._by_storage[key]
            del self._live[id(item)]
            self.count -= 1
        item.error = error
        item.done.set()

    def touches(self, tensors: Iterable[torch.Tensor]) -> bool:
        """True if any of ``tensors`` has queued work on its storage."""
        if not self.count:
            return False
        by_storage = self._by_storage
        return any(key in by_storage for key in _storage_keys(tensors))

    def wait_for(self, tensors: Iterable[torch.Tensor]) -> None:
        """Block until the work queued on the storages of ``tensors`` so far ran (a host synchronisation)."""
        keys = _storage_keys(tensors)
        if self.count and keys:
            with self._lock:
                items = [item for key in keys for item in self._by_storage.get(key, ())]
            _wait_all(items)
        _raise_device_error()

    def wait_for_storage(self, key: int) -> None:
        with self._lock:
            items = list(self._by_storage.get(key, ()))
        _wait_all(items)

    def wait_for_count(self, most: int) -> None:
        """Block until at most ``most`` items are pending (the oldest ran)."""
        while True:
            with self._lock:
                if self.count <= most:
                    return
                oldest = next(iter(self._live.values()))
            oldest.done.wait()

    def synchronize(self) -> None:
        """Block until everything queued so far ran (``torch.cuda.synchronize``)."""
        with self._lock:
            items = list(self._live.values())
        _wait_all(items)
        _raise_device_error()


def _wait_all(items: Iterable[_Pending]) -> None:
    for item in items:
        item.done.wait()


_pending = _PendingStorages()


def _storage_key(tensor: Any) -> int:
    try:
        return tensor.untyped_storage().data_ptr()
    except Exception:  # no storage (meta, sparse, a wrapper subclass): its inner tensors are listed separately
        return 0


def _storage_keys(tensors: Iterable[torch.Tensor]) -> tuple[int, ...]:
    return tuple({key for key in map(_storage_key, tensors) if key})


def _tensors_in(values: Any) -> list[torch.Tensor]:
    """Every tensor in ``values`` (nested), with the inner tensors of wrapper subclasses (AsyncCollectiveTensor, DTensor)."""
    found: list[torch.Tensor] = []
    stack = [leaf for leaf in tree_leaves(values) if isinstance(leaf, torch.Tensor)]
    while stack:
        tensor = stack.pop()
        found.append(tensor)
        if is_traceable_wrapper_subclass(tensor):
            names, _ = tensor.__tensor_flatten__()
            stack.extend(t for t in (getattr(tensor, name, None) for name in names) if isinstance(t, torch.Tensor))
    return found


# ----- the compute stream ------------------------------------------------------------------------


_device_errors: list[BaseException] = []  # raised by queued ops: reported at the host's next synchronisation


def _raise_device_error() -> None:
    if _device_errors:
        error = _device_errors[0]
        raise RuntimeError(f"{BACKEND_NAME}: a queued op failed on the compute stream: {error!r}") from error


class _ComputeStream:
    """The device's compute stream: one thread running queued ops in order, each after the work it depends on."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"{BACKEND_NAME}-compute-stream", daemon=True)
        self._thread.start()

    def submit(self, name: str, tensors: list[torch.Tensor], run: Callable[[], None]) -> None:
        if _MAX_QUEUED and _pending.count >= _MAX_QUEUED:
            _pending.wait_for_count(_MAX_QUEUED // 2)  # a full launch queue blocks the host, as on a GPU
        item = _Pending(name)
        # OpenMP's thread count is per thread, and a CPU reduction's result depends on it: use the host's.
        self._queue.put((item, _pending.add(item, tensors), run, torch.get_num_threads()))

    def _run(self) -> None:
        # The host already ran autograd and the in-place version bumps: run the kernel only.
        with torch._C._AutoDispatchBelowADInplaceOrView():
            while True:
                item, before, run, threads = self._queue.get()
                if threads != torch.get_num_threads():
                    torch.set_num_threads(threads)
                _wait_all(before)
                if _DEVICE_DELAY:
                    time.sleep(_DEVICE_DELAY)
                try:
                    run()
                except BaseException as exc:  # a kernel's asynchronous error
                    _device_errors.append(exc)
                _pending.finish(item)


_compute_stream: _ComputeStream | None = None
# NCCLORDER_DEVICE_DELAY_MS: a slower device (each queued op waits this long first), so that the host runs
# further ahead of it: for hunting ordering bugs, never set by the tests.
_DEVICE_DELAY = float(os.environ.get("NCCLORDER_DEVICE_DELAY_MS", "0") or 0) / 1000.0
# NCCLORDER_MAX_QUEUED: how many ops the device queue may hold before the host blocks (0, the default:
# unbounded; a GPU's launch queue holds about 1024).  Both knobs are for hunting ordering defects (the one
# found with them: docs/verification.md, "ncclorder: a fault-free run that diverged"); the tests set neither.
_MAX_QUEUED = int(os.environ.get("NCCLORDER_MAX_QUEUED", "0") or 0)


def _compute() -> _ComputeStream:
    global _compute_stream
    if _compute_stream is None:
        _compute_stream = _ComputeStream()
        atexit.register(_drain_at_exit)
    return _compute_stream


def _drain_at_exit() -> None:
    """Let the device finish what was queued before the interpreter finalises (atexit runs before that).

    Each group's issued collectives are flushed (ProcessGroupNCCL's shutdown,
    also run by its destructor when the script did not destroy the group),
    then the compute stream's queued ops run.  A daemon thread still running
    an op at finalisation is ended inside torch's C++ (reacquiring the GIL) and
    the process aborts: "terminate called without an active exception".
    Bounded by the groups' timeouts (a hung collective, as NCCL's watchdog).
    """
    seconds = max((group._timeout.total_seconds() for group in _live_groups), default=0.0)
    deadline = time.monotonic() + (seconds if seconds > 0 else 1800.0)
    for group in list(_live_groups):
        group._stream.drain(max(0.0, deadline - time.monotonic()))
    with _pending._lock:
        items = list(_pending._live.values())
    for item in items:
        if not item.done.wait(max(0.0, deadline - time.monotonic())):
            return


# ----- which ops queue, which run now, which synchronise ---------------------------------------------

_EAGER, _SYNC, _QUEUE = "eager", "sync", "queue"

# Non-tensor results that are metadata, not data: answered now.
_METADATA_OPS = frozenset({
    "is_same_size", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "dim", "size", "stride", "numel",
    "is_contiguous", "is_strides_like_format", "is_non_overlapping_and_dense", "layout", "device", "is_floating_point",
    "is_complex", "is_pinned", "result_type", "_has_same_storage_numel", "is_set_to", "_nnz", "storage_offset",
})
# New tensors whose contents do not depend on the input's data, and storage-sharing ops whose schema does not say so.
_EAGER_OPS = frozenset({
    "empty_like", "new_empty", "new_empty_strided", "zeros_like", "ones_like", "full_like", "new_zeros", "new_ones",
    "new_full", "_unsafe_view", "lift_fresh",
})
_SYNC_TAGS = frozenset({torch.Tag.nondeterministic_seeded, torch.Tag.dynamic_output_shape,
                        torch.Tag.data_dependent_output, torch.Tag.inplace_view})
_TENSOR_TYPES = frozenset({"Tensor", "Tensor?", "Tensor[]", "Tensor?[]", "Optional[Tensor]", "List[Tensor]",
                           "List[Optional[Tensor]]"})
_how: dict[Any, str] = {}


def _how_to_run(func: Any) -> str:
    """``_EAGER``, ``_SYNC`` or ``_QUEUE`` for an op that touches pending storages (cached per overload)."""
    how = _how.get(func)
    if how is None:
        how = _how[func] = _classify(func)
    return how


def _classify(func: Any) -> str:
    schema = func._schema
    name = schema.name.split("::")[-1]
    if name in _METADATA_OPS or name in _EAGER_OPS:
        return _EAGER
    if set(func.tags) & _SYNC_TAGS or name.startswith(("resize", "set_")):
        return _SYNC
    if any(str(ret.type) not in _TENSOR_TYPES for ret in schema.returns):
        return _SYNC  # .item(), bool(t), equal(): the host needs the value now
    writes = any(arg.alias_info is not None and arg.alias_info.is_write for arg in schema.arguments)
    view = any(ret.alias_info is not None and not ret.alias_info.is_write for ret in schema.returns)
    if view and not writes:
        return _EAGER  # a view reads no data
    return _QUEUE


def _to_meta(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(tensor.size(), tensor.stride(), dtype=tensor.dtype, device="meta")


def _on_device(func: Any, args: tuple, kwargs: dict, tensors: list[torch.Tensor]) -> Any:
    """Run an op that touches pending storages as the device would (see the module docstring)."""
    how = _how_to_run(func)
    if how == _EAGER:
        return func(*args, **kwargs)
    if how == _QUEUE and all(type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type == "cpu" for t in tensors):
        queued = _queue_op(func, args, kwargs, tensors)
        if queued is not _NOT_QUEUED:
            return queued
    _pending.wait_for(tensors)
    return func(*args, **kwargs)


_NOT_QUEUED = object()


def _queue_op(func: Any, args: tuple, kwargs: dict, tensors: list[torch.Tensor]) -> Any:
    """Queue ``func`` on the compute stream; returns what the host gets now, or ``_NOT_QUEUED`` to synchronise instead."""
    real_of: dict[int, torch.Tensor] = {}

    def meta(tensor: torch.Tensor) -> torch.Tensor:
        converted = _to_meta(tensor)
        real_of[id(converted)] = tensor
        return converted

    try:
        meta_args, meta_kwargs = tree_map_only(torch.Tensor, meta, (args, kwargs))
        meta_out = func(*meta_args, **meta_kwargs)
    except Exception:  # no meta kernel, or an error the real op must raise on the host
        return _NOT_QUEUED
    leaves, spec = tree_flatten(meta_out)
    host_leaves: list[Any] = []
    fresh: list[tuple[int, torch.Tensor]] = []
    for index, leaf in enumerate(leaves):
        if not isinstance(leaf, torch.Tensor):
            host_leaves.append(leaf)
        elif id(leaf) in real_of:  # an in-place or out= op returns its argument
            real = real_of[id(leaf)]
            if leaf.size() != real.size() or leaf.stride() != real.stride():
                return _NOT_QUEUED  # an out= argument resized: the host needs the new shape now
            host_leaves.append(real)
        elif any(ret.alias_info is not None for ret in func._schema.returns):
            return _NOT_QUEUED  # an alias the mapping above does not know
        else:
            output = torch.empty_strided(leaf.size(), leaf.stride(), dtype=leaf.dtype, device="cpu")
            host_leaves.append(output)
            fresh.append((index, output))

    def run() -> None:
        out_leaves, _ = tree_flatten(func(*args, **kwargs))
        for index, output in fresh:
            output.copy_(out_leaves[index])

    _compute().submit(str(func), tensors + [output for _, output in fresh], run)
    return tree_unflatten(host_leaves, spec)


class _DeviceQueueMode(TorchDispatchMode):
    """The compute stream's front end on a host thread: ops on pending storages are queued, not run."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if not _pending.count or func.namespace in _COMMUNICATION_NAMESPACES:
            return func(*args, **kwargs)
        tensors = _tensors_in((args, kwargs))
        if not _pending.touches(tensors):
            return func(*args, **kwargs)
        if _host_sync.depth:
            _pending.wait_for(tensors)
            return func(*args, **kwargs)
        return _on_device(func, args, kwargs, tensors)


class _HostSync(threading.local):
    depth = 0


_host_sync = _HostSync()


def _host_synchronous(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` with every collective wait and op synchronous on this thread.

    For C++ that reads a CPU copy of a collective's result through a raw
    pointer (``tensor.accessor``) after ``copy_``: on a GPU that copy is
    device-to-host and blocks the host; on CPU tensors it is an aten op this
    backend would queue, and the pointer read would not wait for it.
    """
    if getattr(fn, "_ncclorder_host_synchronous", False):
        return fn

    def synchronous(*args: Any, **kwargs: Any) -> Any:
        _host_sync.depth += 1
        try:
            return fn(*args, **kwargs)
        finally:
            _host_sync.depth -= 1

    synchronous._ncclorder_host_synchronous = True  # type: ignore[attr-defined]
    return synchronous


def _synchronise_raw_reads() -> None:
    """DDP's C++ checks its parameter shapes and rebuilt buckets across ranks with raw reads of a copied result."""
    dist._verify_params_across_processes = _host_synchronous(dist._verify_params_across_processes)
    dist.Reducer._rebuild_buckets = _host_synchronous(dist.Reducer._rebuild_buckets)


_mode_threads: set[int] = set()


def _install_device_queue_on_this_thread() -> None:
    """Push the device-queue mode on the calling thread's dispatch-mode stack, once per thread, for good."""
    ident = threading.get_ident()
    if ident not in _mode_threads:
        _mode_threads.add(ident)
        _DeviceQueueMode().__enter__()
        _hold_direct_reads()


def _hold_direct_reads() -> None:
    """Host reads of memory without an aten op wait for the device, on the threads with the mode.

    ``Tensor.tolist()`` and ``.numpy()`` start with a device-to-host copy on a
    GPU; ``UntypedStorage.resize_`` frees or reallocates memory the queued ops
    may still use (the caching allocator's stream-ordered free);
    ``torch.cpu.synchronize`` stands for ``torch.cuda.synchronize``.
    """
    for owner, name in ((torch.Tensor, "tolist"), (torch.Tensor, "numpy"), (torch.UntypedStorage, "resize_")):
        original = getattr(owner, name)
        if getattr(original, "_ncclorder_held", False):
            continue

        def held(self: Any, *args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            if _pending.count and threading.get_ident() in _mode_threads:
                if isinstance(self, torch.Tensor):
                    _pending.wait_for(_tensors_in(self))
                else:
                    _pending.wait_for_storage(self.data_ptr())
            return _original(self, *args, **kwargs)

        held._ncclorder_held = True  # type: ignore[attr-defined]
        setattr(owner, name, held)
    if not getattr(torch.cpu.synchronize, "_ncclorder_held", False):
        def synchronize(device: Any = None) -> None:
            _pending.synchronize()

        synchronize._ncclorder_held = True  # type: ignore[attr-defined]
        torch.cpu.synchronize = synchronize


# ----- the device thread: autograd's backward ---------------------------------------------------------


class _DeviceThread:
    """Autograd's device thread: runs the backward passes while the calling thread waits (GPU autograd)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"{BACKEND_NAME}-device", daemon=True)
        self._thread.start()

    def call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the device thread (inline if already there); its exception is re-raised here."""
        if threading.current_thread() is self._thread:
            return fn(*args, **kwargs)
        box: dict[str, Any] = {}
        finished = threading.Event()
        self._queue.put((fn, args, kwargs, torch.is_grad_enabled(), torch.get_num_threads(), box, finished))
        finished.wait()
        if "error" in box:
            raise box["error"]
        return box["value"]

    def _run(self) -> None:
        _install_device_queue_on_this_thread()
        while True:
            fn, args, kwargs, grad_enabled, threads, box, finished = self._queue.get()
            if threads != torch.get_num_threads():
                torch.set_num_threads(threads)
            try:
                with torch.set_grad_enabled(grad_enabled):
                    box["value"] = fn(*args, **kwargs)
            except BaseException as exc:
                box["error"] = exc
            finally:
                finished.set()


_device_thread: _DeviceThread | None = None


def _run_backward_on_the_device_thread() -> None:
    """Route ``torch.autograd``'s engine calls (``backward()``, ``autograd.grad``) through the device thread (once)."""
    global _device_thread
    if _device_thread is not None:
        return
    import torch.autograd.graph as graph

    _device_thread = device = _DeviceThread()
    original = graph._engine_run_backward

    def engine_run_backward(*args: Any, **kwargs: Any) -> Any:
        return device.call(original, *args, **kwargs)

    graph._engine_run_backward = engine_run_backward
    torch.autograd._engine_run_backward = engine_run_backward  # type: ignore[attr-defined]


# ----- collectives -------------------------------------------------------------------------------


class OrderedWork(dist._Work):
    """A collective's handle with NCCL's semantics (see the module docstring)."""

    def __init__(self, name: str, result: list[torch.Tensor], pending: _Pending, *,
                 host_wait: bool, timeout: datetime.timedelta, barrier: bool = False) -> None:
        super().__init__()
        self.name = name
        self._pending = pending
        self._result = result
        self._host_wait = host_wait
        self._barrier = barrier
        self._timeout = timeout
        self._future: torch.futures.Future = torch.futures.Future()
        self._future.set_result(result)  # completed at enqueue, as NCCL's

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        """NCCL: the current stream waits, not the host; blocking wait and a barrier block the host.

        Raises the collective's error once it failed (WorkNCCL::handleException),
        and a timeout if a blocking wait ran out.
        """
        if self._host_wait or self._barrier or _host_sync.depth:
            seconds = (timeout if timeout else self._timeout).total_seconds()
            if not self._pending.done.wait(seconds if seconds > 0 else None):
                raise dist.DistBackendError(f"{BACKEND_NAME}: Work {self.name} timed out in a blocking wait after {seconds:g}s")
            if self._barrier:
                _pending.synchronize()  # NCCL's barrier synchronises the device
        if self._pending.error is not None:
            raise self._pending.error
        return True

    def get_future(self) -> torch.futures.Future:
        return self._future

    def is_completed(self) -> bool:
        """True once the collective finished or failed (NCCL: its end event, or an exception set)."""
        return self._pending.done.is_set()

    def is_success(self) -> bool:
        return self._pending.done.is_set() and self._pending.error is None

    def exception(self) -> BaseException | None:
        """The collective's error once it failed (a lost peer, a timeout, an aborted communicator); None otherwise."""
        return self._pending.error if self._pending.done.is_set() else None

    def result(self) -> list[torch.Tensor]:
        return self._result

    def synchronize(self) -> None:
        """NCCL: the current stream waits; nothing for the host to do."""

    def wait_until_done(self, timeout: float | None = None) -> bool:
        """Block the host until the collective finished (tests only)."""
        return self._pending.done.wait(timeout)


class _Stream:
    """One process group's communication stream: a thread that runs its collectives in issue order."""

    def __init__(self, name: str) -> None:
        self.error: BaseException | None = None
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, pending: _Pending, before: list[_Pending], issue: Callable[[], Any]) -> None:
        self._queue.put((pending, before, issue))

    def stop(self) -> None:
        self._queue.put(None)

    def drain(self, timeout: float | None) -> None:
        """Stop after the collectives already issued, and wait until they ran (or failed), at most ``timeout`` seconds."""
        self.stop()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            pending, before, issue = item
            _wait_all(before)  # the communication stream waits for the compute that wrote its tensors
            if self.error is None:
                try:
                    issue().wait()
                except BaseException as exc:  # a lost peer, gloo's timeout: the communicator is aborted
                    self.error = exc
            _pending.finish(pending, self.error)


_live_groups: list["NcclOrderProcessGroup"] = []  # the Python objects must outlive C++'s references to them


def _blocking_wait_from_env() -> bool:
    return os.environ.get("TORCH_NCCL_BLOCKING_WAIT", os.environ.get("NCCL_BLOCKING_WAIT", "0")).lower() in ("1", "true")


class NcclOrderProcessGroup(dist.ProcessGroup):
    """A Python process group: gloo underneath, NCCL's ordering on top (see the module docstring)."""

    def __init__(self, store: dist.Store, rank: int, size: int, timeout: datetime.timedelta, group_name: str) -> None:
        super().__init__(rank, size)
        self._group_name = group_name
        self._timeout = timeout
        self._blocking_wait = _blocking_wait_from_env()
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore(f"{BACKEND_NAME}/", store), rank, size, timeout)
        self._stream = _Stream(f"{BACKEND_NAME}-stream-{group_name}")
        _compute()
        _install_device_queue_on_this_thread()
        _run_backward_on_the_device_thread()
        _synchronise_raw_reads()
        _live_groups.append(self)

    # ----- identity --------------------------------------------------------------------

    def getBackendName(self) -> str:
        return BACKEND_NAME

    @property
    def group_name(self) -> str:
        return self._group_name

    def __repr__(self) -> str:
        return f"NcclOrderProcessGroup(rank={self.rank()}, size={self.size()}, group={self._group_name})"

    # ----- errors ------------------------------------------------------------------------

    def get_error(self) -> ErrorType:
        """ProcessGroupNCCL's ``get_error()``: ``SUCCESS``, ``TIMEOUT`` or ``COMM_ERROR`` once a collective failed."""
        error = self._stream.error
        if error is None:
            return ErrorType.SUCCESS
        return ErrorType.TIMEOUT if "timed out" in str(error).lower() else ErrorType.COMM_ERROR

    # ----- collectives -------------------------------------------------------------------

    def _enqueue(self, name: str, touched: list[torch.Tensor], result: list[torch.Tensor],
                 issue: Callable[[], Any], barrier: bool = False) -> OrderedWork:
        pending = _Pending(name)
        work = OrderedWork(name, result, pending, host_wait=self._blocking_wait, timeout=self._timeout, barrier=barrier)
        self._stream.submit(pending, _pending.add(pending, touched), issue)
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
        return self._enqueue("barrier", [], [], lambda: self._gloo.barrier(dist.BarrierOptions()), barrier=True)

    # ----- end of life -------------------------------------------------------------------

    def shutdown(self) -> None:
        """``destroy_process_group``: flush the collectives already issued, then stop the stream thread.

        ProcessGroupNCCL's shutdown finalizes its communicators (``ncclCommFinalize``
        flushes the issued operations, and it waits for them) before destroying
        them.  Returning at once instead let a rank whose host ran ahead leave
        (gloo's connections closed at exit) while its peers' collectives still
        needed it: they failed, and the peer went on with unreduced gradients.
        """
        seconds = self._timeout.total_seconds()
        self._stream.drain(seconds if seconds > 0 else None)

    def abort(self) -> None:
        self._stream.stop()


def _create(options: Any, backend_options: Any) -> NcclOrderProcessGroup:
    """torch.distributed's creator (extended API): ``options`` is a ``_DistributedBackendOptions``."""
    return NcclOrderProcessGroup(options.store, options.group_rank, options.group_size, options.timeout, options.group_id)


def register() -> None:
    """Register the ``ncclorder`` backend with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu"])
