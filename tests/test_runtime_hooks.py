"""Unit tests of the worker hooks (``JitRuntime``, ``instrument``) for what a CPU job cannot show (issue 18).

Single process, no process group: collectives are fakes whose Work behaves as
NCCL's does (completion read from ``is_completed()``, an error recorded on the
Work by that query, an aborting ``wait()``).  The end-to-end cases are real
torchrun jobs in tests/test_user_code_faults.py and tests/test_nccl_ordering.py.

- every torch.distributed function that issues a collective is wrapped, or
  listed as exempt with a reason (a new torch name fails here);
- the optimizer pre-step waits for every collective issued outside the
  optimizer phase (a script's own ``all_reduce(p.grad)``, ``isend``), not only
  DDP's; a gloo send is in flight while a thread waits for it, not before;
- a hang the device reports is not saved while an optimizer step is half applied;
- a thread other than the training thread parked at a collective's entry is a
  safe point, and the save is reached;
- the watchdog's Work queries run in relaxed CUDA stream-capture mode (mocked:
  unverified on GPU here);
- a script's ``wait()`` on a failed or hung polled collective parks the thread
  instead of aborting the communicator, with and without
  ``TORCH_NCCL_BLOCKING_WAIT=1`` (fakes: unverified on GPU).
"""

from __future__ import annotations

import types
import threading
import time
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d

from jitckpt.jit_event import JitReason
from jitckpt.worker import instrument
from jitckpt.worker import runtime as runtime_module
from jitckpt.worker.minibatch import OptimizerPhase
from jitckpt.worker.runtime import JitRuntime

SETTLE = 0.3  # seconds a thread is given to get past a point it must not pass


class FakeNcclWork:
    """A Work with NCCL's semantics: done when ``done`` is set; ``is_completed()`` records a communicator error on it,
    after which ``wait()`` aborts the communicator and throws (``blocking=True``: ``wait()`` itself polls first)."""

    def __init__(self, blocking: bool = False) -> None:
        self.done = threading.Event()
        self.comm_error = False
        self.aborted = False
        self.waits = 0
        self._exception: BaseException | None = None
        self._blocking = blocking

    def _check(self) -> None:
        if self.comm_error and self._exception is None:
            self._exception = RuntimeError("NCCL communicator error: remote process exited")

    def is_completed(self) -> bool:
        self._check()
        return self._exception is not None or self.done.is_set()

    def exception(self) -> BaseException | None:
        return self._exception

    def wait(self, timeout: Any = None) -> bool:
        self.waits += 1
        if self._blocking:
            while not self.is_completed():
                time.sleep(0.001)
        if self._exception is not None:
            self.aborted = True  # ncclCommAbort: the device work behind the hang runs
            raise self._exception
        return True

    def get_future(self) -> Any:
        future: torch.futures.Future = torch.futures.Future()
        future.set_result(None)  # completed at enqueue
        return future


class FakeGroup:
    """A process group torch does not know: its backend reads as not gloo, so its Works are polled."""


def fake_all_reduce(tensor: torch.Tensor, op: Any = None, group: Any = None, async_op: bool = False) -> Any:
    work = fake_all_reduce.next_work  # type: ignore[attr-defined]
    return work if async_op else work.wait()


def fake_isend(tensor: torch.Tensor, dst: int | None = None, group: Any = None, tag: int = 0,
               group_dst: int | None = None) -> Any:
    return fake_all_reduce.next_work  # type: ignore[attr-defined]


FAKES = {"all_reduce": fake_all_reduce, "isend": fake_isend}


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> JitRuntime:
    """A runtime whose JIT events are recorded in ``runtime.events`` instead of starting a save."""
    rt = JitRuntime()
    rt.events = []  # type: ignore[attr-defined]
    monkeypatch.setattr(rt, "trigger", lambda reason, detail: (rt.events.append((reason, detail)),  # type: ignore[attr-defined]
                                                               rt.park_requested.set()))
    return rt


def _issue(rt: JitRuntime, name: str, work: FakeNcclWork, **kwargs: Any) -> Any:
    """Issue the fake collective ``name`` through jitckpt's wrapper; returns what the caller gets."""
    fake_all_reduce.next_work = work  # type: ignore[attr-defined]
    wrapper = instrument._tracked_collective(rt, name, FAKES[name])
    return wrapper(torch.zeros(2), group=FakeGroup(), **kwargs)


def _started(target: Any, *args: Any) -> threading.Thread:
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


# ----- 1. every collective is tracked, and the optimizer pre-step waits for it ---------------------------


def _functions_of_torch_distributed() -> set[str]:
    namespace = vars(distributed_c10d)
    return {name for name in distributed_c10d.__all__ if type(namespace.get(name)) is types.FunctionType}


def test_every_function_of_torch_distributed_is_wrapped_or_exempt_with_a_reason(monkeypatch):
    """Each public function of ``torch.distributed.distributed_c10d`` is in ``_COLLECTIVES`` (wrapped in both
    namespaces) or in ``NOT_WRAPPED`` with its reason: a name torch adds fails here instead of going untracked.
    Before, FSDP2's all_gather_single / reduce_scatter_single, send/recv/isend/irecv/batch_isend_irecv, the
    coalesced forms and monitored_barrier were in neither (issue 18, item 1)."""
    functions = _functions_of_torch_distributed()
    wrapped, exempt = set(instrument._COLLECTIVES), set(getattr(instrument, "NOT_WRAPPED", {}))
    assert not wrapped & exempt
    assert functions <= wrapped | exempt, f"neither wrapped nor exempt: {sorted(functions - wrapped - exempt)}"
    assert all(instrument.NOT_WRAPPED[name].strip() for name in exempt)
    for name in wrapped:
        for module in (dist, distributed_c10d):
            monkeypatch.setattr(module, name, getattr(module, name))  # put back at teardown
    instrument._patch_collectives(JitRuntime())
    for name in sorted(wrapped):
        assert getattr(getattr(distributed_c10d, name), "_jitckpt_wrapped", False), name
        assert getattr(dist, name) is getattr(distributed_c10d, name), name


@pytest.mark.parametrize("name", ["all_reduce", "isend"])
def test_the_optimizer_pre_step_waits_for_a_scripts_own_collective_on_a_polled_backend(runtime, name):
    """A script all-reduces its gradients itself (or sends them with isend), outside DDP: on NCCL the call
    returns at enqueue, and the optimizer step must not run (Adam's step count, the scheduler) before the
    collective completed.  Before, only DDP's hook and comm hooks counted: the pre-step returned at once."""
    work = FakeNcclWork()
    returned = _issue(runtime, name, work, **({"async_op": False} if name == "all_reduce" else {}))
    if name == "isend":
        assert isinstance(returned, dist.Work) and returned is not work  # a guarded Work, polled
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    stepping = _started(runtime.optimizer_pre_step, optimizer)
    stepping.join(SETTLE)
    assert stepping.is_alive(), "the optimizer pre-step ran ahead of an incomplete collective"
    work.done.set()
    stepping.join(5)
    assert not stepping.is_alive() and runtime.oldest_in_flight() is None


class GlooSendWork(FakeNcclWork):
    """gloo's send/recv Work: no future, done only in its wait() (which blocks until ``done``)."""

    def get_future(self) -> Any:
        raise RuntimeError("Work::getFuture not implemented")

    def wait(self, timeout: Any = None) -> bool:
        self.done.wait()
        return super().wait(timeout)


def test_a_gloo_send_is_in_flight_while_a_thread_waits_for_it(runtime, monkeypatch):
    """gloo's host blocks in a send's or receive's wait(), the only place it completes: that is where a frozen
    peer must trip the hang timeout, and a Work waited for late (a pipeline's sends) must not look hung before."""
    monkeypatch.setattr(instrument, "_backend_of", lambda group, device_type: "gloo")
    work = GlooSendWork()
    handle = _issue(runtime, "isend", work)
    assert runtime.oldest_in_flight() is None
    waiting = _started(handle.wait)
    waiting.join(SETTLE)
    assert waiting.is_alive() and runtime.oldest_in_flight() is not None
    work.done.set()
    waiting.join(5)
    assert not waiting.is_alive() and runtime.oldest_in_flight() is None


def test_a_collective_issued_inside_the_optimizer_phase_does_not_hold_the_pre_step(runtime):
    """ZeRO's parameter broadcast inside its step: not a collective the pre-step of the next optimizer waits for."""
    runtime.phase = "optimizer"
    _issue(runtime, "all_reduce", FakeNcclWork(), async_op=True)
    assert runtime.oldest_in_flight() is not None
    runtime.wait_for_gradient_collectives()  # returns at once


# ----- 2. a hang reported from the device is still checked for consistency --------------------------


def test_a_device_reported_hang_is_not_saved_while_an_optimizer_step_is_half_applied(runtime):
    """A GAN: D stepped, G's backward hangs on the device (the C watchdog's CUDA_HANG).  The state holds D's
    step and not G's: saving it as "start of minibatch i" would apply D's step twice after the resume.
    Before, any device-reported reason was safe before the consistency check."""
    d, g = (torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1) for _ in range(2))
    runtime.optimizer_phase = phase = OptimizerPhase(lambda: [d, g])
    phase.close_previous(d)
    phase.enter(d)
    phase.post_step(d)  # D applied; G's step has not begun
    assert not runtime.state_consistent()
    assert JitReason.CUDA_HANG.from_device
    assert not runtime._safe_to_save(JitReason.CUDA_HANG)
    phase.close_previous(g)
    phase.enter(g)
    phase.post_step(g)  # the minibatch is complete: the start of the next one
    assert runtime._safe_to_save(JitReason.CUDA_HANG)


# ----- 3. a thread other than the training thread parked at a collective's entry ---------------------


class Exited(BaseException):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def test_a_comm_hook_parked_on_an_autograd_thread_is_a_safe_point_and_the_save_runs(runtime, monkeypatch):
    """SIGTERM while the training thread waits elsewhere (backward(), next(loader)) and DDP's comm hook, on an
    autograd device thread, parks at its collective's entry: the minibatch cannot get past that all-reduce,
    so the state is its start.  Before, only the training thread counted as parked: "no safe point reached"
    and no checkpoint."""
    runtime.park_requested.set()  # a JIT event is under way
    hook = _started(runtime.collective_entry, "ddp-allreduce")
    hook.join(SETTLE)
    assert hook.is_alive(), "the hook thread did not park at the collective's entry"
    assert not runtime.main_parked.is_set()
    assert runtime._safe_to_save(JitReason.SIGTERM)
    saved: list[str] = []
    monkeypatch.setattr(runtime_module.save, "save_checkpoint", lambda rt, reason, detail: saved.append(detail) or 0)

    def exit_(code: int) -> None:
        raise Exited(code)

    monkeypatch.setattr(runtime_module.os, "_exit", exit_)
    runtime.save_grace = 1.0
    with pytest.raises(Exited) as exited:
        runtime._save_and_exit(JitReason.SIGTERM, "preempted")
    assert exited.value.code == 0 and saved == ["preempted"]


# ----- 5. the watchdog's queries do not invalidate a CUDA graph capture -----------------------------


def test_the_watchdogs_work_queries_run_in_relaxed_capture_mode(runtime, monkeypatch):
    """The watchdog queries the events of Works enqueued before another thread began a CUDA graph capture:
    in the default (global) capture mode that invalidates the capture.  Each query must run in relaxed mode,
    the thread's mode put back after (mocked: the driver's cuThreadExchangeStreamCaptureMode; unverified on GPU
    here).  Before, nothing switched the mode."""
    modes = threading.local()

    def exchange(mode: int) -> int:
        previous = getattr(modes, "mode", 0)
        modes.mode = mode
        return previous

    monkeypatch.setattr(runtime_module, "_capture_mode_exchange", lambda: exchange)
    seen: list[int] = []
    work = FakeNcclWork()
    original = work.is_completed
    work.is_completed = lambda: (seen.append(getattr(modes, "mode", 0)), original())[1]  # type: ignore[method-assign]
    _issue(runtime, "all_reduce", work, async_op=True)
    watchdog = _started(runtime.poll_collectives)
    watchdog.join(5)
    assert seen and set(seen) == {runtime_module.CAPTURE_MODE_RELAXED}, seen
    assert getattr(modes, "mode", 0) == 0  # (the main thread's mode was never touched)


class CppWork:
    """What torch 2.11 gave for a healthy WorkNCCL on an H100: exception() cannot be converted, is_success() raises."""

    def is_completed(self) -> bool:
        return True

    def exception(self) -> None:
        raise TypeError("Unable to convert function return value to a Python type! The signature was ...")

    def is_success(self) -> bool:
        raise RuntimeError("WorkNCCL::isSuccess() is deprecated")


def test_a_healthy_cpp_work_whose_error_cannot_be_read_is_no_error():
    """Found on the H100: every polled NCCL collective that completed raised a false JIT event ("peer-error:
    Unable to convert function return value"), exception() of a C++ Work being unreadable from Python."""
    assert runtime_module.work_state(CppWork()) == (True, None)


def test_without_cuda_the_capture_mode_is_left_alone():
    """On a host where CUDA never started, no driver is asked (the check costs a dict look-up)."""
    assert not torch.cuda.is_initialized()
    assert runtime_module._capture_mode_exchange() is None


# ----- 6. a script's wait() on a failed or hung collective parks instead of aborting ----------------


def test_a_scripts_wait_after_jitckpts_polling_found_an_error_parks_instead_of_aborting(runtime):
    """The watchdog's is_completed() records the communicator error on the Work (WorkNCCL::checkAndSetException);
    torch's wait() on that Work would then abort the communicator and throw, releasing the device work queued
    behind the hang before the save.  The script's wait() must park its thread for the JIT save.  Before, the
    script held torch's Work itself."""
    work = FakeNcclWork()
    handle = _issue(runtime, "all_reduce", work, async_op=True)
    work.comm_error = True
    runtime.poll_collectives()  # the watchdog: the error is now on the Work, and a JIT event is raised
    assert runtime.events and work.exception() is not None
    waiting = _started(handle.wait)
    waiting.join(SETTLE)
    assert waiting.is_alive(), "wait() returned or raised instead of parking"
    assert not work.aborted and work.waits == 0
    assert runtime.threads_parked(main=False)


@pytest.mark.parametrize("outcome", ["hang", "error"])
def test_a_blocking_wait_parks_for_the_save_instead_of_aborting(runtime, monkeypatch, outcome):
    """TORCH_NCCL_BLOCKING_WAIT=1: torch's wait() blocks the host and aborts the communicator on an error (or its
    timeout) before the save.  The script's wait() polls instead: on a hang it parks once a JIT event is under
    way (the hang timeout's), on an error it raises the event and parks; torch's wait() is never called."""
    monkeypatch.setenv("TORCH_NCCL_BLOCKING_WAIT", "1")
    work = FakeNcclWork(blocking=True)
    handle = _issue(runtime, "all_reduce", work, async_op=True)
    waiting = _started(handle.wait)
    waiting.join(SETTLE)
    assert waiting.is_alive() and not runtime.threads_parked()
    if outcome == "hang":
        runtime.park_requested.set()  # the watchdog's hang timeout raised the JIT event
    else:
        work.comm_error = True
    deadline = time.monotonic() + 5
    while not runtime.threads_parked() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runtime.threads_parked(main=False), "the waiting thread did not park"
    assert waiting.is_alive() and not work.aborted and work.waits == 0
    assert bool(runtime.events) == (outcome == "error")


def test_a_guarded_wait_on_a_healthy_collective_is_torchs_wait(runtime):
    """No error, no hang: the script's wait() is torch's, and the collective is retired once it completes."""
    work = FakeNcclWork()
    handle = _issue(runtime, "all_reduce", work, async_op=True)
    assert handle.wait() is True and work.waits == 1
    work.done.set()
    assert handle.is_completed()
    runtime.poll_collectives()
    assert runtime.oldest_in_flight() is None and not runtime.events
