"""Hooks into PyTorch that feed the JIT runtime, installed once per worker.

- Global optimizer pre/post step hooks mark the minibatch phase (§3.3) and
  capture RNG state at every minibatch start.
- DistributedDataParallel gets a gradient all-reduce comm hook that does what
  DDP's built-in all-reduce does (divide by world size, sum) and registers
  every bucket's work handle with the watchdog.  A comm hook the user
  registers is wrapped the same way instead.  A collective error is caught in
  the completion callback, so ``backward()`` of a healthy rank never raises
  "connection reset" before the save has run: the callback parks instead.
- The Python-level collectives of ``torch.distributed`` are wrapped likewise
  (every function that issues one, point-to-point included; ``NOT_WRAPPED``
  says why each other one is not), and so are the functional collectives (``torch.distributed._functional_collectives``:
  their issue is a safe point, their ``wait_tensor`` is watched) and DDP's
  buffer broadcast (``broadcast_buffers=True``).
- When a collective ends: gloo completes its future when the collective is
  done, so the future's callback retires it.  NCCL completes the future (and
  ``Work.wait()``) when the collective is *enqueued*; it is in flight until
  an event recorded after it on a side stream completes (``_StreamEnd``;
  other NCCL-like backends: ``work.is_completed()``), which the watchdog and
  the optimizer pre-step poll (``JitRuntime.track``).  This holds for DDP's
  all-reduce, for the wrapped collectives, and for the collectives a user's
  comm hook issues through them (``dist.all_reduce(..., async_op=True)``, as
  torch's own hooks do); a hook that reaches the process group some other
  way returns only a future, and its collective counts as in flight until
  that future completes.  The pre-step waits for every collective issued
  outside the optimizer phase, whoever issued it.  A wrapped collective's
  polled Work reaches the caller wrapped (``_guarded_work_type``), so that
  its ``wait()`` parks for the save instead of aborting the communicator.
- ``sys.excepthook`` is the last resort: a distributed error that escapes
  anywhere else (e.g. DDP's buffer broadcast) still gets a JIT save when the
  parameters are known to be consistent.
- Fault-injection hooks (forward/backward) are installed only on the rank a
  fault is armed for.
"""

from __future__ import annotations

import collections
import functools
import inspect
import os
import sys
import threading
from typing import Any, Callable

from jitckpt import config, eventlog
from jitckpt.jit_event import JitReason
from jitckpt.worker import data_position, ddp_layout, fsdp_layout, minibatch_gap, private_rng, resume, sharding, skipped_steps
from jitckpt.worker.runtime import JitRuntime
from jitckpt.worker.save import in_jit_save

# Every function of torch.distributed (``distributed_c10d.__all__``) that issues a collective or a
# point-to-point transfer on a process group is wrapped (``_tracked_collective``), FSDP2's
# all_gather_single / reduce_scatter_single and the coalesced forms included.
_COLLECTIVES = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_coalesced",
    "reduce_scatter_tensor",
    "reduce_scatter",
    "reduce_scatter_single",
    "broadcast",
    "reduce",
    "barrier",
    "monitored_barrier",
    "all_to_all_single",
    "all_to_all",
    "gather",
    "scatter",
    "send",
    "recv",
    "isend",
    "irecv",
    "batch_isend_irecv",
)
# The wrapped functions without ``async_op`` that return their Work (or a list of Works) at once;
# the others without it (send, recv, monitored_barrier) block until they are done.
_RETURN_WORK = frozenset({"isend", "irecv", "batch_isend_irecv"})
# The deprecated coalesced forms: with async_op they hand back their Work's future, never the Work.
_RETURN_FUTURE = frozenset({"all_reduce_coalesced", "all_gather_coalesced"})
# Collectives whose Work.wait() blocks the host until they are done (``JitRuntime.wait_for_work``).
_HOST_BLOCKING_WAIT = frozenset({"barrier", "monitored_barrier"})
_SETUP = "sets process groups up or tears them down, outside training; no collective of a group"
_QUERY = "a query: issues nothing"
# The other public functions of ``distributed_c10d``, each with why it is not wrapped.
# tests/test_runtime_hooks.py fails on a function torch adds that is in neither list.
NOT_WRAPPED: dict[str, str] = {
    "all_gather_object": "issues all_gather, wrapped (through distributed_c10d's own namespace)",
    "broadcast_object_list": "issues broadcast, wrapped",
    "gather_object": "issues all_gather and gather, wrapped",
    "scatter_object_list": "issues broadcast and scatter, wrapped",
    "send_object_list": "issues send, wrapped",
    "recv_object_list": "issues recv, wrapped",
    "init_process_group": _SETUP,
    "destroy_process_group": _SETUP,
    "new_group": _SETUP,
    "new_subgroups": _SETUP,
    "new_subgroups_by_enumeration": _SETUP,
    "split_group": _SETUP,
    "shrink_group": _SETUP,
    "record_comm": "names the collectives issued inside it, for the profiler",
    **{name: _QUERY for name in (
        "get_backend", "get_backend_config", "get_debug_level", "get_default_backend_for_device",
        "get_global_rank", "get_group_rank", "get_node_local_rank", "get_pg_count",
        "get_process_group_ranks", "get_rank", "get_world_size", "is_backend_available",
        "is_gloo_available", "is_initialized", "is_mpi_available", "is_nccl_available",
        "is_torchelastic_launched", "is_ucc_available", "is_xccl_available", "supports_complex",
    )},
}
_installed = False


class CollectiveDuringSaveError(RuntimeError):
    """The save function issued a collective; JIT saves must not (peers may be dead)."""


def install(runtime: JitRuntime) -> None:
    """Install every hook; idempotent."""
    global _installed
    if _installed:
        return
    _installed = True
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(lambda opt, args, kwargs: runtime.optimizer_pre_step(opt))
    register_optimizer_step_post_hook(lambda opt, args, kwargs: runtime.optimizer_post_step(opt))
    sharding.install()  # notes optimizers: which ranks hold the same state (FSDP, ZeRO, DDP)
    skipped_steps.install(runtime)  # a step GradScaler skips (inf/nan gradients) still counts
    _give_each_attempt_its_own_store(runtime)
    _patch_collectives(runtime)
    _patch_ddp(runtime)
    _patch_functional_collectives_when_imported(runtime)
    fsdp_layout.install(runtime)  # a JIT save sees FSDP2's sharded parameters, never a swap half done
    ddp_layout.install(lambda: resume.locate(runtime))
    _install_excepthook(runtime)
    _watch_batch_fetches(runtime)
    runtime.taken_batches.minibatch_started()  # (the first minibatch's first training forward is noted)
    for kind in private_rng.install():  # the script's own generators ride with the global ones (rng_state)
        eventlog.record("private_rng_untracked", kind=kind)
    if runtime.injector.phases & {"forward", "backward"}:
        _install_fault_hooks(runtime)


def _give_each_attempt_its_own_store(runtime: JitRuntime) -> None:
    """Namespace the workers' rendezvous store by torchrun restart count.

    torchrun's agent keeps one TCPStore across restarts (static and c10d
    rendezvous alike) and its workers use it without a per-attempt prefix, so a
    restarted gloo process group reads the dead attempt's peer addresses and
    fails with "connectFullMesh failed ... Connection refused" (seen with torch
    2.13 and plain torchrun --max-restarts).  A PrefixStore per attempt fixes it.

    The namespace must be the same on every node.  torchrun's restart count is
    not: a node whose agent restarts because another node rejoined the
    rendezvous does not count a restart.  jit-run's agent therefore passes the
    rendezvous round its workers were started in (c10d rendezvous); with the
    static rendezvous every node counts the restart, so the count is used.
    """
    import importlib

    from torch.distributed import PrefixStore

    # (`import torch.distributed.rendezvous as m` yields the function of that name)
    rendezvous = importlib.import_module("torch.distributed.rendezvous")

    original = rendezvous._create_c10d_store
    if getattr(original, "_jitckpt_wrapped", False):
        return

    def create_store(*args: Any, **kwargs: Any) -> Any:
        store = original(*args, **kwargs)
        if rendezvous._torchelastic_use_agent_store():
            generation = os.environ.get(config.ENV_RENDEZVOUS_ROUND)
            generation = f"round-{generation}" if generation else f"attempt-{runtime.attempt}"
            return PrefixStore(f"jitckpt/{generation}", store)
        return store

    create_store._jitckpt_wrapped = True  # type: ignore[attr-defined]
    rendezvous._create_c10d_store = create_store


def _patch_collectives(runtime: JitRuntime) -> None:
    """Track the Python collectives, in ``torch.distributed`` and in ``distributed_c10d`` itself.

    The object collectives (``broadcast_object_list``, ``all_gather_object``,
    ``gather_object``, ``scatter_object_list``) and other helpers call
    ``broadcast``/``all_gather``/... through ``distributed_c10d``'s own module
    namespace, so patching only ``torch.distributed`` would leave a hang in
    them unseen.  Both names get the same wrapper.
    """
    import torch.distributed as dist
    from torch.distributed import distributed_c10d

    for name in _COLLECTIVES:
        original = getattr(distributed_c10d, name, None) or getattr(dist, name, None)
        if original is None or getattr(original, "_jitckpt_wrapped", False):
            continue
        wrapper = _tracked_collective(runtime, name, original)
        for module in (dist, distributed_c10d):
            if getattr(module, name, None) is original:
                setattr(module, name, wrapper)


def _coalescing() -> bool:
    """True inside `torch.distributed._coalescing_manager`, whose collectives return placeholder work."""
    from torch.distributed import distributed_c10d

    return bool(getattr(distributed_c10d._world, "pg_coalesce_state", None))


class _Nesting(threading.local):
    depth = 0  # wrapped collectives running on this thread (send runs isend, the object collectives theirs)


_nesting = _Nesting()


def _tracked_collective(runtime: JitRuntime, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """``original`` (a torch.distributed function named ``name``), its collective tracked by ``runtime``.

    Its entry is a safe point (the outermost wrapped call only: ``send``
    runs ``isend``).  Its Work is tracked; on a backend whose Work is polled
    (NCCL) the caller gets it wrapped (``_guarded_work_type``).  Every collective
    issued outside the optimizer phase, whoever issues it (DDP's hook, a
    script's own ``all_reduce(p.grad)``, FSDP2's reduce-scatter, HSDP,
    point-to-point), is one the optimizer pre-step waits for: its result may
    feed the update, and on NCCL the host runs ahead of it.
    """
    signature = inspect.signature(original)
    takes_async_op = "async_op" in signature.parameters
    what = f"torch.distributed.{name}"
    host_blocking = name in _HOST_BLOCKING_WAIT

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if in_jit_save():
            raise CollectiveDuringSaveError(
                f"torch.distributed.{name} called inside the JIT save function; a JIT save runs when "
                f"peers may be dead, so save(path) must not use collectives (drop barriers and gathers)"
            )
        if _nesting.depth == 0:
            runtime.collective_entry(name)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)  # let torch report the bad call
        if _coalescing():
            return original(*args, **kwargs)
        gradient = _in_comm_hook() or runtime.phase != "optimizer"
        _nesting.depth += 1
        try:
            if name in _RETURN_FUTURE:
                return _issue_returning_future(runtime, what, original, bound, gradient)
            if takes_async_op:
                return _issue_async(runtime, what, original, bound, gradient, host_blocking)
            if name in _RETURN_WORK:
                return _issue_returning_work(runtime, what, original, bound, gradient)
            return _issue_blocking(runtime, what, original, bound, gradient)
        finally:
            _nesting.depth -= 1

    wrapper._jitckpt_wrapped = True  # type: ignore[attr-defined]
    return wrapper


def _issue_async(runtime: JitRuntime, what: str, original: Callable[..., Any], bound: inspect.BoundArguments,
                 gradient: bool, host_blocking: bool) -> Any:
    """A collective with ``async_op``: issued asynchronously and tracked; waited for here unless the caller wants its Work."""
    caller_wants_async = bool(bound.arguments.get("async_op", False))
    bound.arguments["async_op"] = True
    work = original(*bound.args, **bound.kwargs)
    if work is None:  # this rank is not a member of the group
        return None
    token, work = _track_work(runtime, what, bound.arguments.get("group"), _first_tensor(bound.arguments), work,
                              gradient, host_blocking)
    if caller_wants_async:
        return work
    try:
        work.wait()
    except Exception as exc:
        runtime.collective_finished(token, exc, what)
        raise
    runtime.collective_finished(token, None, what)
    return None


def _issue_returning_future(runtime: JitRuntime, what: str, original: Callable[..., Any], bound: inspect.BoundArguments,
                            gradient: bool) -> Any:
    """all_reduce_coalesced / all_gather_coalesced: tracked until their future completes (or their call returns).

    That is the collective's end on gloo, its enqueue on NCCL: their Work never
    reaches Python, so on NCCL they are not polled and the optimizer pre-step
    does not wait for them (torch deprecates both).
    """
    if not bound.arguments.get("async_op", False):
        return _issue_blocking(runtime, what, original, bound, gradient)
    future = original(*bound.args, **bound.kwargs)
    if future is not None:
        token = runtime.track(what, gradient=gradient)
        future.add_done_callback(lambda fut: _finish(runtime, token, fut, what))
    return future


def _issue_returning_work(runtime: JitRuntime, what: str, original: Callable[..., Any], bound: inspect.BoundArguments,
                          gradient: bool) -> Any:
    """isend / irecv / batch_isend_irecv: each Work they return is tracked (once: batch_isend_irecv runs isend)."""
    result = original(*bound.args, **bound.kwargs)
    if "p2p_op_list" in bound.arguments:
        ops = bound.arguments["p2p_op_list"]
        group, tensor = (ops[0].group, ops[0].tensor) if ops else (None, None)
    else:
        group, tensor = bound.arguments.get("group"), bound.arguments.get("tensor")
    guarded = _guarded_work_type()

    def tracked(work: Any) -> Any:
        if work is None or isinstance(work, guarded):
            return work
        return _track_work(runtime, what, group, tensor, work, gradient, host_blocking=False)[1]

    return [tracked(work) for work in result] if isinstance(result, list) else tracked(result)


def _issue_blocking(runtime: JitRuntime, what: str, original: Callable[..., Any], bound: inspect.BoundArguments,
                    gradient: bool) -> Any:
    """send / recv / monitored_barrier (and the coalesced forms without async_op): in flight until the call returns.

    (send and recv issue isend and irecv, whose Works are tracked too.)
    """
    return _call_tracked(runtime, what, lambda: original(*bound.args, **bound.kwargs), gradient)


def _call_tracked(runtime: JitRuntime, what: str, call: Callable[[], Any], gradient: bool = False) -> Any:
    """``call()``, a collective in flight until it returns (its completion path parks if a save waits)."""
    token = runtime.track(what, gradient=gradient)
    try:
        result = call()
    except Exception as exc:
        runtime.collective_finished(token, exc, what)
        raise
    runtime.collective_finished(token, None, what)
    return result


def _first_tensor(arguments: dict[str, Any]) -> Any:
    """The first tensor among a collective's arguments (in lists too): where its device is read."""
    for value in arguments.values():
        while isinstance(value, (list, tuple)) and value:
            value = value[0]
        if hasattr(value, "is_cuda"):
            return value
    return None


def _track_work(runtime: JitRuntime, what: str, group: Any, tensor: Any, work: Any, gradient: bool,
                host_blocking: bool) -> tuple[int | None, Any]:
    """Track a collective's ``work``; returns its token and the Work for the caller.

    Where the future ends the collective (gloo; a collective enqueued during
    a CUDA graph capture), its callback retires it and the caller gets
    ``work`` itself.  Otherwise the Work is polled and the caller gets it
    wrapped (``_guarded_work_type``).  A gloo send or receive has no future
    and completes only in its ``wait()``, where gloo's host blocks: it is in
    flight while a thread waits for it (no token until then: None).
    """
    polled = _work_to_poll(group, work, tensor)
    if polled is None:  # gloo, or enqueued during a CUDA graph capture (never polled): the future ends it
        try:
            future = work.get_future()
        except RuntimeError:  # gloo's send/recv Work: "getFuture not implemented"
            return None, _guarded_work_type()(runtime, None, work, host_blocking, what)
        token = runtime.track(what, gradient=gradient)
        future.add_done_callback(lambda fut: _finish(runtime, token, fut, what))
        return token, work
    token = runtime.track(what, polled, gradient=gradient)
    return token, _guarded_work_type()(runtime, token, work, host_blocking, what)


def _blocking_wait() -> bool:
    """True under ``TORCH_NCCL_BLOCKING_WAIT=1``: NCCL's ``Work.wait()`` blocks the host, and aborts on an error or timeout."""
    return os.environ.get("TORCH_NCCL_BLOCKING_WAIT", "0").strip().lower() in ("1", "true", "yes", "on")


@functools.cache
def _guarded_work_type() -> type:
    """The ``torch.distributed.Work`` subclass that jitckpt hands back for a polled collective (defined once torch is in).

    Its ``wait()`` goes through ``JitRuntime.wait_for_work``: torch's own
    ``wait()`` of a Work whose error was recorded (on NCCL, by any
    ``is_completed()`` query) aborts the communicator and throws, releasing
    the device work queued behind the hang before the save, and under
    ``TORCH_NCCL_BLOCKING_WAIT=1`` it aborts on an error or its timeout.  The
    guarded wait parks the thread for the JIT save instead.  Everything else
    is the wrapped Work's.  Unverified on GPU with a failing peer (one rank
    on an H100/H200 ran it healthy; the failure paths run on fakes).
    """
    import torch.distributed as dist

    class GuardedWork(dist.Work):
        """A polled collective's Work as the caller sees it (see ``_guarded_work_type``)."""

        def __init__(self, runtime: JitRuntime, token: int | None, work: Any, host_blocking: bool, what: str) -> None:
            """``token`` None: a gloo send or receive, in flight only while a thread waits for it."""
            super().__init__()
            self._runtime = runtime
            self._token = token
            self._work = work
            self._host_blocking = host_blocking or _blocking_wait()
            self._what = what

        def wait(self, timeout: Any = None) -> bool:
            def real_wait() -> bool:
                return self._work.wait() if timeout is None else self._work.wait(timeout)

            if self._token is None:
                return _call_tracked(self._runtime, self._what, real_wait)
            return self._runtime.wait_for_work(self._token, real_wait, self._host_blocking)

        def is_completed(self) -> bool:
            return self._work.is_completed()

        def is_success(self) -> bool:
            return self._work.is_success()

        def exception(self) -> Any:
            return self._work.exception()

        def source_rank(self) -> int:
            return self._work.source_rank()

        def _source_rank(self) -> int:
            return self._work._source_rank()

        def result(self) -> Any:
            return self._work.result()

        def synchronize(self) -> None:
            self._work.synchronize()

        def block_current_stream(self) -> None:
            self._work.block_current_stream()

        def get_future(self) -> Any:
            return self._work.get_future()

        def get_future_result(self) -> Any:
            return self._work.get_future_result()

        def _get_op_type(self) -> Any:
            return self._work._get_op_type()

        def _get_duration(self) -> float:
            return self._work._get_duration()

        def __getattr__(self, name: str) -> Any:
            if name == "_work":  # not set yet: never recurse
                raise AttributeError(name)
            return getattr(self._work, name)

    return GuardedWork


def _finish(runtime: JitRuntime, token: int, fut: Any, what: str, on_error: Callable[[], Any] | None = None) -> Any:
    """Completion callback of a tracked future: returns its value, or parks on error.

    A thread that must not park (``JitRuntime.collective_finished``) comes
    back from an error: it returns ``on_error()`` (a DDP hook: the bucket as
    it is, which the optimizer pre-step never lets through, the collective
    being in flight for good) or re-raises.
    """
    try:
        value = fut.value()
    except Exception as exc:
        runtime.collective_finished(token, exc, what)
        if on_error is None:
            raise
        return on_error()
    runtime.collective_finished(token, None, what)
    return value


# Backends whose collective's future completes when the collective has finished (and
# carries its error): their future's callback retires the collective.  Every other
# backend's collectives are in flight until their Work (or, NCCL, an event after them) completes.
_FUTURE_ENDS_COLLECTIVE = frozenset({"gloo"})
_backends: dict[int, tuple[Any, str]] = {}  # id(group) -> (group, backend name); the group is kept alive


def _backend_of(group: Any, device_type: str) -> str:
    """The backend of ``group`` (None: the default group) for ``device_type``, "" if torch does not know it.

    A group with one backend per device type (``"cpu:gloo,cuda:nccl"``)
    answers the one for ``device_type``.  The group's name is cached.
    """
    from torch.distributed import distributed_c10d

    if group is None:
        group = distributed_c10d._world.default_pg
    known = _backends.get(id(group))
    if known is None:
        try:
            backend = str(distributed_c10d.get_backend(group))
        except Exception:
            backend = ""
        known = _backends[id(group)] = (group, backend)
    backend = known[1]
    if ":" in backend:
        per_device = dict(part.split(":", 1) for part in backend.split(",") if ":" in part)
        backend = per_device.get(device_type, backend)
    return backend


def _work_to_poll(group: Any, work: Any, tensor: Any = None) -> Any:
    """What says when this collective finished (``is_completed()``), or None if its future does.

    - gloo: None, its future's callback retires it;
    - NCCL on CUDA tensors: a separate handle, an event recorded after the
      collective on a side stream (``_StreamEnd``).  The Work itself is never
      queried: ``WorkNCCL::isCompleted`` records a communicator error on the
      script's Work, whose ``wait()`` then aborts the communicator before the
      save, and its ``exception()``/``is_success()`` cannot be read from Python
      (seen with torch 2.11 on an H100).  An NCCL error is read from the
      process group's ``get_error()`` (``watchdog.communicator_errors``), a
      hang from the event that never completes;
    - any other backend (the ``ncclorder`` test backend): the Work.

    None as well for a collective enqueued while the current CUDA stream is
    being captured into a graph: querying its event would invalidate the
    capture, and it runs only when the graph is launched.  A captured graph's
    collectives are watched by the C interposer's capture tracking (an event
    recorded after each graph launch), not here.
    """
    if work is None:
        return None
    on_cuda = getattr(tensor, "is_cuda", False)
    backend = _backend_of(group, "cuda" if on_cuda or (tensor is None and _cuda_initialized()) else "cpu")
    if backend in _FUTURE_ENDS_COLLECTIVE:
        return None
    if (tensor is None or on_cuda) and _cuda_stream_capturing():
        return None
    if backend == "nccl" and (on_cuda or _cuda_initialized()):
        return _StreamEnd.after(work, tensor.device if on_cuda else None) or work
    return work


class _StreamEnd:
    """A separate handle on an NCCL collective's end: an event recorded on a side stream made to wait for it.

    NCCL's future is complete at enqueue and holds events recorded on the
    NCCL stream after the collective; waiting for it under a side stream
    makes that stream wait for them (``cudaStreamWaitEvent``, the host does
    not block), and the event recorded next completes when the collective
    has.  One side stream per device.  Unverified on GPU with more than one
    rank (a one-rank NCCL job ran it on an H100).
    """

    __slots__ = ("event",)
    _streams: dict[int, Any] = {}

    def __init__(self, event: Any) -> None:
        self.event = event

    @classmethod
    def after(cls, work: Any, device: Any) -> "_StreamEnd | None":
        """The handle for ``work`` on ``device`` (None: the current one), or None where its future cannot give one."""
        import torch

        index = torch.cuda.current_device() if device is None else device.index
        stream = cls._streams.get(index)
        if stream is None:
            stream = cls._streams[index] = torch.cuda.Stream(index)
        try:
            future = work.get_future()
            with torch.cuda.stream(stream):
                future.wait()
                event = torch.cuda.Event()
                event.record(stream)
        except RuntimeError:
            return None
        return cls(event)

    def is_completed(self) -> bool:
        return bool(self.event.query())

    def exception(self) -> None:
        """Never an error here: NCCL's errors are the process group's (``get_error()``)."""
        return None


def _cuda_initialized() -> bool:
    """True once this process has initialised CUDA (False at no cost where it never started)."""
    cuda = sys.modules.get("torch.cuda")
    return bool(cuda is not None and cuda.is_initialized())


def _cuda_stream_capturing() -> bool:
    """True while the current CUDA stream is being captured (False at no cost where CUDA never started)."""
    return _cuda_initialized() and bool(sys.modules["torch.cuda"].is_current_stream_capturing())


class _CommHookState(threading.local):
    depth = 0


_comm_hook_state = _CommHookState()


def _in_comm_hook() -> bool:
    """True while a user's DDP comm hook runs on this thread: its collectives are gradient collectives."""
    return _comm_hook_state.depth > 0


def _patch_ddp(runtime: JitRuntime) -> None:
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if getattr(DDP, "_jitckpt_patched", False):
        return
    original_forward = DDP.forward
    original_register = DDP.register_comm_hook

    # DDP's _check_comm_hook compares annotation objects, which postponed
    # (string) annotations would fail: the hooks' signatures stay unannotated.
    def jit_allreduce_hook(state, bucket):  # type: ignore[no-untyped-def]
        """DDP's default gradient all-reduce (average by world size), tracked by the watchdog."""
        runtime.collective_entry("ddp-allreduce")
        group = state if state is not None else dist.group.WORLD
        tensor = bucket.buffer()
        # DDP's reducer scales by the reciprocal (mul by 1/world size); do exactly the
        # same so results match plain DDP bit for bit for any world size.
        tensor.mul_(1.0 / group.size())
        what = f"DDP gradient all-reduce (bucket {bucket.index()})"
        # The process group's own allreduce, as DDP's built-in hook calls it
        # (dist.all_reduce adds ~35 us of Python checks per bucket).
        work = group.allreduce([tensor])
        token = runtime.track(what, _work_to_poll(group, work, tensor), gradient=True)
        return work.get_future().then(lambda f: _finish(runtime, token, f, what, lambda: [tensor])[0])

    def register_comm_hook(self: DDP, state: object, hook: Callable[..., Any]) -> None:
        if getattr(hook, "_jitckpt_tracked", False):
            return original_register(self, state, hook)

        @functools.wraps(hook)
        def tracked(state, bucket):  # type: ignore[no-untyped-def]
            runtime.collective_entry("ddp-comm-hook")
            what = f"DDP comm hook {getattr(hook, '__qualname__', hook)} (bucket {bucket.index()})"
            # Only the hook's future is seen here: on NCCL it completes at enqueue, and this
            # entry with it.  The collectives the hook issues through torch.distributed
            # (async_op=True) are tracked by their Work, as gradient collectives.
            token = runtime.track(what, gradient=True)
            _comm_hook_state.depth += 1
            try:
                fut = hook(state, bucket)
            finally:
                _comm_hook_state.depth -= 1
            return fut.then(lambda f: _finish(runtime, token, f, what, bucket.buffer))

        tracked._jitckpt_tracked = True  # type: ignore[attr-defined]
        self._jitckpt_hooked = True
        return original_register(self, state, tracked)

    jit_allreduce_hook._jitckpt_tracked = True  # type: ignore[attr-defined]

    original_builtin = DDP._register_builtin_comm_hook

    def register_builtin_comm_hook(self: DDP, comm_hook_type: Any) -> None:
        # A C++ built-in hook cannot be wrapped: its collectives are watched only
        # through SIGTERM and the stack check, not the hang timeout.
        self._jitckpt_hooked = True
        return original_builtin(self, comm_hook_type)

    def forward(self: DDP, *inputs: Any, **kwargs: Any) -> Any:
        if not getattr(self, "_jitckpt_hooked", False):
            self._jitckpt_hooked = True
            in_backward_optimizers = any(hasattr(p, "_in_backward_optimizers") for p in self.module.parameters())
            if not getattr(self, "_comm_hooks", None) and not in_backward_optimizers:
                original_register(self, self.process_group, jit_allreduce_hook)
        if runtime.phase != "optimizer":
            runtime.phase = "forward"
        if not getattr(self, "_jitckpt_buffers_noted", False):
            self._jitckpt_buffers_noted = True
            runtime.buffer_snapshots.note_module(self.module)
        runtime.buffer_snapshots.take(runtime.step)
        ddp_layout.note_forward(self)
        return original_forward(self, *inputs, **kwargs)

    original_pre_forward = getattr(DDP, "_pre_forward", None)
    if original_pre_forward is not None:
        def pre_forward(self: DDP, *inputs: Any, **kwargs: Any) -> Any:
            result = original_pre_forward(self, *inputs, **kwargs)
            ddp_layout.note_forward(self, after_rebuild=True)  # (DDP rebuilds its buckets in there)
            return result

        DDP._pre_forward = pre_forward

    original_buffer_broadcast = DDP._distributed_broadcast_coalesced

    def distributed_broadcast_coalesced(self: DDP, tensors: Any, buffer_size: Any, authoritative_rank: int = 0) -> None:
        """DDP's buffer broadcast (``broadcast_buffers=True``, at the start of every forward): tracked.

        It is ``dist._broadcast_coalesced``, C++ that waits for the broadcast
        (gloo), or for the copies out of it, which wait for the broadcast on
        the ncclorder test backend; on a real GPU they are queued behind it and
        it returns at once, and a hang shows in the next tracked collective.
        Its start is a safe point (the state is the start of the minibatch);
        it issues no fault injection and does not mark the phase.
        """
        if in_jit_save():
            raise CollectiveDuringSaveError("DDP's buffer broadcast inside the JIT save function")
        runtime.park_if_requested()
        what = "DDP buffer broadcast"
        token = runtime.track(what)
        try:
            original_buffer_broadcast(self, tensors, buffer_size, authoritative_rank)
        except Exception as exc:
            runtime.collective_finished(token, exc, what)
            raise
        runtime.collective_finished(token, None, what)

    DDP.forward = forward
    DDP._distributed_broadcast_coalesced = distributed_broadcast_coalesced
    DDP.register_comm_hook = register_comm_hook
    DDP._register_builtin_comm_hook = register_builtin_comm_hook
    DDP._jitckpt_patched = True


# torch.distributed._functional_collectives: the entry points a script (or DTensor) calls.
_FUNCTIONAL_COLLECTIVES = (
    "all_reduce",
    "all_reduce_coalesced",
    "all_gather_tensor",
    "all_gather_tensor_autograd",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_autograd",
    "reduce_scatter_tensor_coalesced",
    "all_to_all_single",
    "all_to_all_single_autograd",
    "broadcast",
)


def _patch_functional_collectives_when_imported(runtime: JitRuntime) -> None:
    """Patch ``torch.distributed._functional_collectives`` once it is imported (it costs ~20 ms to import here)."""
    from jitckpt.worker import importhook

    importhook.install({"torch.distributed._functional_collectives": lambda module: _patch_functional_collectives(runtime, module)})


def _patch_functional_collectives(runtime: JitRuntime, funcol: Any) -> None:
    """The functional collectives: their issue is a safe point, their wait is tracked.

    A functional collective's Work is kept by C++ (the work registry, keyed by
    the output tensor) and never reaches Python, so what can be watched is
    the wait: ``wait_tensor``, which ``AsyncCollectiveTensor`` calls at the
    first use of the result.  On gloo it blocks until the collective is done,
    so a collective with a frozen peer is in flight there and the hang timeout
    applies.  On NCCL it only makes the current stream wait: the host blocks
    later, at a consumer, with nothing tracked; the hang is then seen in the
    next tracked collective on the same communicator (queued behind it), or by
    the C interposer's CUDA-event watch.  Left alone while ``torch.compile``
    traces (the wrappers' side effects do not belong in a graph).
    """
    import torch

    if getattr(funcol, "_jitckpt_patched", False):
        return
    compiling = torch.compiler.is_compiling
    for name in _FUNCTIONAL_COLLECTIVES:
        original = getattr(funcol, name, None)
        if original is None:
            continue

        def issue(*args: Any, _original: Callable[..., Any] = original, _name: str = name, **kwargs: Any) -> Any:
            if compiling():
                return _original(*args, **kwargs)
            if in_jit_save():
                raise CollectiveDuringSaveError(f"functional collective {_name} inside the JIT save function")
            runtime.collective_entry(f"funcol.{_name}")
            return _original(*args, **kwargs)

        setattr(funcol, name, functools.wraps(original)(issue))

    original_wait = funcol.wait_tensor

    @functools.wraps(original_wait)
    def wait_tensor(tensor: Any) -> Any:
        if compiling():
            return original_wait(tensor)
        what = "functional collective (wait_tensor)"
        token = runtime.track(what)
        try:
            result = original_wait(tensor)
        except Exception as exc:
            runtime.collective_finished(token, exc, what)
            raise
        runtime.collective_finished(token, None, what)
        return result

    funcol.wait_tensor = wait_tensor
    funcol._jitckpt_patched = True


def _looks_distributed(exc: BaseException) -> bool:
    import torch.distributed as dist

    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = f"{type(exc).__name__}: {exc}".lower()
    return isinstance(exc, RuntimeError) and any(
        word in text for word in ("gloo", "nccl", "connection reset", "connection closed", "broken pipe", "peer")
    )


def _watch_batch_fetches(runtime: JitRuntime) -> None:
    """Tell the runtime each time a DataLoader iterator draws its next index, and each batch it yields.

    ``_next_index`` is where every iterator (single- and multi-process, and
    torchdata's subclasses) takes the next batch's indices from its sampler,
    right before it fetches the batch (or hands the indices to a worker):
    where a redone minibatch's RNG goes back.  ``__next__`` yields the batch:
    the batches each minibatch took are noted there, with the sampler's
    indices for it (``jitckpt.worker.data_position``; each iterator carries
    its loader's key, set when it is made, and the indices it handed out and
    has not yielded yet: workers are given indices ahead, and yield in order).
    """
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    original = _BaseDataLoaderIter._next_index
    if getattr(original, "_jitckpt_wrapped", False):
        return
    iter_init = _BaseDataLoaderIter.__init__

    @functools.wraps(iter_init)
    def iter_init_keyed(self: Any, loader: Any, *args: Any, **kwargs: Any) -> None:
        runtime.gap.iterator_made(loader)  # (before it draws its base seed: a new epoch's iterator?)
        iter_init(self, loader, *args, **kwargs)
        self._jitckpt_loader_key = data_position.loader_key(loader)
        self._jitckpt_stateful = minibatch_gap.stateful(loader)

    @functools.wraps(original)
    def _next_index(self: Any) -> Any:
        index = original(self)
        if getattr(self, "_in_order", True):  # (workers yield out of order with in_order=False: no indices noted)
            self.__dict__.setdefault("_jitckpt_indices", collections.deque()).append(data_position.index_digest(index))
        if runtime.pending_rng is not None:
            runtime.batch_fetch_starts()
        runtime.note_own_generators_at_start()  # (once per minibatch; nothing without generators of the script's own)
        if not getattr(self, "_jitckpt_stateful", False):
            runtime.gap.data_reached(data_position.key_of(self))
        return index

    next_batch = _BaseDataLoaderIter.__next__

    @functools.wraps(next_batch)
    def __next__(self: Any) -> Any:
        try:
            batch = next_batch(self)
        except StopIteration:
            runtime.gap.iterator_ran_out(self)  # (its sampler may have drawn a last time)
            raise
        except BaseException:
            pending = self.__dict__.get("_jitckpt_indices")
            if pending:
                pending.popleft()  # (the batch that failed: a worker's error, re-raised; the script may go on)
            raise
        pending = self.__dict__.get("_jitckpt_indices")
        runtime.taken_batches.yielded(self, batch, pending.popleft() if pending else None)
        runtime.gap.batch_yielded(self)
        return batch

    reset = _BaseDataLoaderIter._reset

    @functools.wraps(reset)
    def _reset(self: Any, *args: Any, **kwargs: Any) -> None:
        self.__dict__.pop("_jitckpt_indices", None)  # (a persistent workers' iterator's new epoch)
        reset(self, *args, **kwargs)

    _next_index._jitckpt_wrapped = True  # type: ignore[attr-defined]
    _BaseDataLoaderIter.__init__ = iter_init_keyed
    _BaseDataLoaderIter._next_index = _next_index
    _BaseDataLoaderIter.__next__ = __next__
    _BaseDataLoaderIter._reset = _reset


def _install_excepthook(runtime: JitRuntime) -> None:
    previous = sys.excepthook

    def excepthook(exc_type: type, exc: BaseException, tb: Any) -> None:
        previous(exc_type, exc, tb)
        if runtime.save_fn is not None and runtime.phase != "optimizer" and _looks_distributed(exc):
            first_line = str(exc).splitlines()[0] if str(exc) else ""
            runtime.trigger_in_this_thread(JitReason.PEER_ERROR, f"uncaught {exc_type.__name__}: {first_line}")

    sys.excepthook = excepthook


def _install_fault_hooks(runtime: JitRuntime) -> None:
    """Forward/backward fault injection, only on the rank the fault targets."""
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook

    def pre_forward(module: Any, inputs: Any) -> None:
        if runtime.memory_tier is not None:
            runtime.memory_tier.at_forward(runtime)  # (the minibatch's start comes before a fault inside it)
        runtime.injector.maybe_fire("forward", runtime.step)

    backward_armed_for: set[int] = set()

    def post_forward(module: Any, inputs: Any, output: Any) -> None:
        step = runtime.step
        if step in backward_armed_for or not runtime.injector.wants("backward", step):
            return
        import torch

        if isinstance(output, torch.Tensor) and output.requires_grad:
            backward_armed_for.add(step)
            output.register_hook(lambda grad: runtime.injector.maybe_fire("backward", step))

    register_module_forward_pre_hook(pre_forward)
    register_module_forward_hook(post_forward)
