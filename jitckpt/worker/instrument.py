"""Hooks into PyTorch that feed the JIT runtime, installed once per worker.

- Global optimizer pre/post step hooks mark the minibatch phase (§3.3) and
  capture RNG state at every minibatch start.
- DistributedDataParallel gets a gradient all-reduce comm hook that does what
  DDP's built-in all-reduce does (divide by world size, sum) and registers
  every bucket's work handle with the watchdog.  A comm hook the user
  registers is wrapped the same way instead.  A collective error is caught in
  the completion callback, so ``backward()`` of a healthy rank never raises
  "connection reset" before the save has run: the callback parks instead.
- The Python-level collectives of ``torch.distributed`` are wrapped likewise.
- ``sys.excepthook`` is the last resort: a distributed error that escapes
  anywhere else (e.g. DDP's buffer broadcast) still gets a JIT save when the
  parameters are known to be consistent.
- Fault-injection hooks (forward/backward) are installed only on the rank a
  fault is armed for.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
from typing import Any, Callable

from jitckpt import config
from jitckpt.jit_event import JitReason
from jitckpt.worker import ddp_layout, resume, sharding
from jitckpt.worker.runtime import JitRuntime
from jitckpt.worker.save import in_jit_save

_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter_tensor",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "barrier",
    "all_to_all_single",
    "all_to_all",
    "gather",
    "scatter",
)
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
    _give_each_attempt_its_own_store(runtime)
    _patch_collectives(runtime)
    _patch_ddp(runtime)
    ddp_layout.install(lambda: resume.locate(runtime))
    _install_excepthook(runtime)
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


def _tracked_collective(runtime: JitRuntime, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if in_jit_save():
            raise CollectiveDuringSaveError(
                f"torch.distributed.{name} called inside the JIT save function; a JIT save runs when "
                f"peers may be dead, so save(path) must not use collectives (drop barriers and gathers)"
            )
        runtime.collective_entry(name)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return original(*args, **kwargs)  # let torch report the bad call
        if _coalescing() or "async_op" not in signature.parameters:
            return original(*args, **kwargs)
        caller_wants_async = bool(bound.arguments.get("async_op", False))
        bound.arguments["async_op"] = True
        work = original(*bound.args, **bound.kwargs)
        if work is None:  # this rank is not a member of the group
            return None
        token = runtime.track(f"torch.distributed.{name}")
        if caller_wants_async:
            work.get_future().add_done_callback(lambda fut: _finish(runtime, token, fut, name))
            return work
        try:
            work.wait()
        except Exception as exc:
            runtime.collective_finished(token, exc, f"torch.distributed.{name}")
        runtime.collective_finished(token, None, name)
        return None

    wrapper._jitckpt_wrapped = True  # type: ignore[attr-defined]
    return wrapper


def _finish(runtime: JitRuntime, token: int, fut: Any, what: str) -> Any:
    """Completion callback of a tracked future: returns its value, or parks on error."""
    try:
        value = fut.value()
    except Exception as exc:
        runtime.collective_finished(token, exc, what)
        raise  # unreachable: collective_finished parks on error
    runtime.collective_finished(token, None, what)
    return value


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
        runtime.gradient_collective_entry("ddp-allreduce")
        group = state if state is not None else dist.group.WORLD
        tensor = bucket.buffer()
        # DDP's reducer scales by the reciprocal (mul by 1/world size); do exactly the
        # same so results match plain DDP bit for bit for any world size.
        tensor.mul_(1.0 / group.size())
        what = f"DDP gradient all-reduce (bucket {bucket.index()})"
        token = runtime.track(what)
        # The process group's own allreduce, as DDP's built-in hook calls it
        # (dist.all_reduce adds ~35 us of Python checks per bucket).
        fut = group.allreduce([tensor]).get_future()
        return fut.then(lambda f: _finish(runtime, token, f, what)[0])

    def register_comm_hook(self: DDP, state: object, hook: Callable[..., Any]) -> None:
        if getattr(hook, "_jitckpt_tracked", False):
            return original_register(self, state, hook)

        @functools.wraps(hook)
        def tracked(state, bucket):  # type: ignore[no-untyped-def]
            runtime.gradient_collective_entry("ddp-comm-hook")
            what = f"DDP comm hook {getattr(hook, '__qualname__', hook)} (bucket {bucket.index()})"
            token = runtime.track(what)
            return hook(state, bucket).then(lambda f: _finish(runtime, token, f, what))

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

    DDP.forward = forward
    DDP.register_comm_hook = register_comm_hook
    DDP._register_builtin_comm_hook = register_builtin_comm_hook
    DDP._jitckpt_patched = True


def _looks_distributed(exc: BaseException) -> bool:
    import torch.distributed as dist

    if isinstance(exc, getattr(dist, "DistError", ())):
        return True
    text = f"{type(exc).__name__}: {exc}".lower()
    return isinstance(exc, RuntimeError) and any(
        word in text for word in ("gloo", "nccl", "connection reset", "connection closed", "broken pipe", "peer")
    )


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
