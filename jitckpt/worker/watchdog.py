"""The collective watchdog thread (paper §3.1), Python side.

It polls the runtime's in-flight collectives (torch.distributed work handles,
gloo or NCCL alike) and raises a JIT event when one has been in flight longer
than the hang timeout.  A collective counts as in flight until its Work
reports completion: on NCCL ``work.is_completed()`` (an event query, never
blocking) is polled here, because the Work's future completed when the
collective was enqueued.  A Work that completed with an exception, and a
process group's asynchronous communicator error (``communicator_errors``),
are JIT events at once.  It also turns SIGTERM into a JIT event: torchrun's
agent sends SIGTERM to every healthy worker as soon as one worker exits, and
the worker must save before it goes.  The signal reaches this thread through
``signal.set_wakeup_fd`` even while the training thread is blocked inside C++
(a Python-level handler would only run when that thread returns).

The C watchdog of the interposition library (CUDA events after NCCL kernels,
polled with cudaEventQuery) reports through the same ``JitRuntime.trigger``.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
import time
from typing import Any, Iterator

from jitckpt.jit_event import JitReason
from jitckpt.worker.runtime import JitRuntime


def _forget_in_child() -> None:
    """A forked child (DataLoader worker, multiprocessing pool) is not a training rank:
    SIGTERM must end it as usual and must not wake the parent's watchdog."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:  # forked from a non-main thread: handlers are not ours to change
        pass


def communicator_errors() -> Iterator[tuple[JitReason, str]]:
    """The asynchronous errors the job's process groups report now, as (reason, detail).

    Where each backend keeps one (looked up with ``getattr``, once per poll):

    - a process group or backend with ``get_error()`` returning
      ``torch.distributed``'s ``ErrorType``: torch 2.13's ``ProcessGroupNCCL``
      (``pg._get_backend(cuda)``), and ``tests/nccl_order``'s test backend;
      its own watchdog sets it from ``ncclCommGetAsyncError`` (``COMM_ERROR``:
      reason ``nccl-error``), from its collective timeout (``TIMEOUT``: ``hang``)
      and from another rank's error signal in the store (``REMOTE_ERROR``:
      ``peer-error``).  The failing collective's Work also completes with
      ``exception()`` set, which ``JitRuntime.poll_collectives`` reads;
    - gloo has neither: its errors arrive on the collective's future.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return
    from torch.distributed import distributed_c10d

    try:
        groups = list(distributed_c10d._world.pg_map)
    except RuntimeError:  # changed while copied (a group being created): the next poll looks again
        return
    for group in groups:
        for name, source in _error_sources(group):
            try:
                if hasattr(source, "get_error"):
                    kind = getattr(source.get_error(), "name", "SUCCESS")
                    if kind == "TIMEOUT":
                        yield JitReason.HANG, f"{name} reports a collective timeout"
                    elif kind == "REMOTE_ERROR":
                        yield JitReason.PEER_ERROR, f"{name} reports an error on another rank"
                    elif kind != "SUCCESS":
                        yield JitReason.NCCL_ERROR, f"{name} reports a communicator error ({kind})"
            except Exception:  # a group being destroyed, a backend without the accessor after all
                continue


def _error_sources(group: Any) -> list[tuple[str, Any]]:
    """The process group itself and its per-device backends, each with a name for the log."""
    sources = [(type(group).__name__, group)]
    try:
        devices = group._device_types
    except Exception:
        devices = []
    for device in devices:
        try:
            sources.append((f"{type(group).__name__}[{device}]", group._get_backend(device)))
        except Exception:
            continue
    return [(name, source) for name, source in sources if hasattr(source, "get_error")]


class CollectiveWatchdog:
    """Background thread: hang timeouts and SIGTERM become JIT events."""

    def __init__(self, runtime: JitRuntime) -> None:
        self.runtime = runtime
        self.poll_interval = min(0.5, runtime.hang_timeout / 10)
        self._reader, self._writer = socket.socketpair()
        self._reader.setblocking(False)
        self._writer.setblocking(False)
        self._thread = threading.Thread(target=self._run, name="jitckpt-watchdog", daemon=True)
        self._owns_sigterm = False
        self._previous_sigterm: object = signal.SIG_DFL
        self._previous_wakeup_fd = -1
        self._stopping = False

    def start(self) -> None:
        """Install the SIGTERM hook (main thread only) and start polling."""
        if threading.current_thread() is threading.main_thread():

            def on_sigterm(signum: int, frame: object) -> None:
                """Nothing to do here: the watchdog thread acts on the wake-up byte."""

            self._previous_sigterm = signal.signal(signal.SIGTERM, on_sigterm)
            self._previous_wakeup_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
            os.register_at_fork(after_in_child=_forget_in_child)
            self._owns_sigterm = True
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Give SIGTERM back to its previous handler and end the thread (at the end of the script)."""
        if self._owns_sigterm and threading.current_thread() is threading.main_thread():
            signal.set_wakeup_fd(self._previous_wakeup_fd)
            previous = self._previous_sigterm
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
            self._owns_sigterm = False
        self._stopping = True
        try:
            self._writer.send(b"\0")
        except OSError:
            pass
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        runtime = self.runtime
        while not self._stopping:
            readable, _, _ = select.select([self._reader], [], [], self.poll_interval)
            if self._stopping:
                return
            if readable:
                try:
                    signals = self._reader.recv(64)
                except BlockingIOError:
                    signals = b""
                if signal.SIGTERM in signals:
                    if runtime.save_fn is None:
                        os._exit(128 + signal.SIGTERM)  # nothing to save: die as SIGTERM would
                    runtime.trigger(JitReason.SIGTERM, "torchrun is stopping the workers (a peer failed or the job was cancelled)")
            # NCCL-like backends: a collective is in flight until its Work completes.
            # Works enqueued during CUDA graph capture are never polled (instrument
            # leaves them out: querying a capturing stream's event would invalidate
            # the capture); a captured graph's collectives are watched by the C
            # interposer's capture tracking, through an event after each graph launch.
            runtime.poll_collectives()
            if runtime.save_fn is not None:
                for reason, detail in communicator_errors():
                    runtime.trigger(reason, detail)
                    break
            oldest = runtime.oldest_in_flight()
            if oldest is not None:
                started, what = oldest
                waited = time.monotonic() - started
                if waited > runtime.hang_timeout and runtime.save_fn is not None:
                    runtime.trigger(JitReason.HANG, f"{what} in flight for {waited:.1f}s (hang timeout {runtime.hang_timeout:g}s)")
