"""Python side of the passthrough interposition library (``interpose/``).

``libjitckpt_interpose.so`` is LD_PRELOADed in front of the CUDA runtime and
NCCL (paper §3.1-3.2).  It watches the CUDA events that follow collectives on
NCCL streams and, when one stays unfinished past the hang timeout, raises a
*JIT event* on its own C watchdog thread.  This module is how Python hears
about it: ``install()`` registers a C callback (cffi, ABI mode) that

* under jit-run, calls the worker runtime's handler (registered with
  ``install_runtime_handler``), which saves on a thread of its own; that
  thread marks itself with ``save_in_progress(True)`` for the length of the
  save, so that its copies, and no other thread's, are redirected off the
  blocked streams; or
* otherwise, calls the ``on_jit_event(reason, detail)`` function given to
  ``install()``, on the watchdog thread itself (which the library marks as
  saving), and then exits with ``exit_code`` if one was given.

The cffi declarations are generated from ``interpose/include/jitckpt_interpose.h``
by the interposer's build (``gen/jitckpt_interpose.cdef``, found through
``jitckpt.native``), so they cannot drift from the C header.

The callback needs the GIL.  If the thread that holds it is stuck inside a
CUDA call, the library's SIGUSR1 handler releases it first (DESIGN.md
decision 4); nothing in Python has to cooperate.

The library is only *found* here, never loaded: ``dlopen(RTLD_NOLOAD)`` of
its soname succeeds only if LD_PRELOAD put it in the process.  Loading it
late would not put it in front of the CUDA runtime, so every function of
this module is a harmless no-op (``is_loaded()`` is False) when it is absent.

    from jitckpt.native import interposer
    interposer.install(on_jit_event=lambda reason, detail: save("/ckpt"), exit_code=75)
    interposer.set_timeout(30)
"""

from __future__ import annotations

import atexit
import ctypes
import os
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from jitckpt import native
from jitckpt.jit_event import JitReason

SONAME = native.INTERPOSER_SONAME
CDEF_FILE = "gen/jitckpt_interpose.cdef"

JitEventHandler = Callable[[JitReason, str], Any]


@dataclass(frozen=True)
class InFlightEvent:
    """A CUDA event on the watch-list: recorded after a collective, waited for, not yet seen complete."""

    event: int
    recorded_on: int  # the NCCL stream; 1 is the legacy default stream
    waited_by: int  # the waiting stream; 0 is a host thread in cudaEventSynchronize
    age_seconds: float


class _Binding:
    """The cffi handle of the preloaded library, its callback, and the user's handler."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.ffi: Any = None
        self.lib: Any = None
        self.probed = False
        self.callback: Any = None  # the cffi callback object: must stay alive
        self.handler: JitEventHandler | None = None
        self.exit_code: int | None = None
        self.runtime_handler: JitEventHandler | None = None
        self.counter_names: tuple[str, ...] = ()

    def load(self) -> Any:
        with self.lock:
            if not self.probed:
                self.probed = True
                self.lib = self._open()
            return self.lib

    def _open(self) -> Any:
        try:
            ctypes.CDLL(SONAME, mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
        except OSError:
            return None  # not preloaded
        try:
            import cffi
        except ImportError:
            raise RuntimeError(f"{SONAME} is preloaded but cffi is missing: pip install cffi") from None
        cdef = native.find(native.INTERPOSE, CDEF_FILE)
        if cdef is None:
            raise RuntimeError(f"{SONAME} is preloaded but its declarations ({CDEF_FILE}) are not built: "
                               f"run `make -C interpose` or reinstall jitckpt")
        ffi = cffi.FFI()
        ffi.cdef(cdef.read_text())
        try:
            lib = ffi.dlopen(SONAME, ffi.RTLD_NOLOAD | ffi.RTLD_LAZY)
        except OSError:
            return None  # not preloaded
        if lib.jitckpt_interpose_api_version() != lib.JITCKPT_INTERPOSE_API_VERSION:
            raise RuntimeError(
                f"{SONAME} speaks control API version {lib.jitckpt_interpose_api_version()}, "
                f"the declarations in {cdef} say {lib.JITCKPT_INTERPOSE_API_VERSION}: rebuild with `make -C interpose`"
            )
        self.ffi = ffi
        self.counter_names = tuple(name for name, _ in ffi.typeof("struct jitckpt_interpose_counters").fields)
        return lib


_binding = _Binding()


def is_loaded() -> bool:
    """True if ``libjitckpt_interpose.so`` is in this process (it was LD_PRELOADed)."""
    return _binding.load() is not None


def library_path() -> Path:
    """The library to LD_PRELOAD, built first if needed; raises native.NativeMissing if it cannot be."""
    return native.ensure_built(native.INTERPOSE) / SONAME


def _reason(code: int) -> JitReason:
    lib = _binding.lib
    if code == lib.JITCKPT_INTERPOSE_CUDA_ERROR:
        return JitReason.CUDA_ERROR
    if code == lib.JITCKPT_INTERPOSE_NCCL_ERROR:
        return JitReason.NCCL_ERROR
    return JitReason.CUDA_HANG


def _dispatch(reason_code: int, detail_c: Any) -> None:
    """The C callback: runs on the library's watchdog thread, with the GIL (cffi takes it)."""
    ffi, lib = _binding.ffi, _binding.lib
    reason = _reason(reason_code)
    detail = ffi.string(detail_c).decode("utf-8", "replace")
    runtime_handler = _binding.runtime_handler
    if runtime_handler is not None:
        # The runtime saves on a thread of its own, which marks itself as saving
        # (save_in_progress): save mode is never the whole process's.
        try:
            runtime_handler(reason, detail)
        except Exception:  # a broken runtime must not kill the C watchdog thread
            traceback.print_exc()
        return
    handler = _binding.handler
    if handler is None:
        print(
            f"[jitckpt] JIT event ({reason}: {detail}) but no handler is installed "
            f"(jitckpt.native.interposer.install(on_jit_event=...)): nothing saved",
            file=sys.stderr,
            flush=True,
        )
        return
    try:
        handler(reason, detail)
    except BaseException:  # report, then still honour exit_code
        traceback.print_exc()
    if _binding.exit_code is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_binding.exit_code)


def install(
    on_jit_event: JitEventHandler | None = None,
    *,
    exit_code: int | None = None,
    timeout: float | None = None,
) -> bool:
    """Register the JIT-event callback with the preloaded library; False if it is not preloaded.

    ``on_jit_event(reason, detail)`` is used only when no jit-run worker
    runtime has registered itself (``install_runtime_handler``).  It runs on the library's
    watchdog thread, where copies issued on blocked streams are redirected;
    after it returns the process exits with ``exit_code`` unless that is
    None.  Calling ``install`` again replaces the handler.
    """
    lib = _binding.load()
    if lib is None:
        return False
    with _binding.lock:
        _binding.handler = on_jit_event
        _binding.exit_code = exit_code
        if _binding.callback is None:
            _binding.callback = _binding.ffi.callback("void(int, const char *)", _dispatch)
            lib.jitckpt_interpose_set_callback(_binding.callback)
            # A callback into a finalising interpreter would crash: unregister first.
            atexit.register(_uninstall)
    if timeout is not None:
        set_timeout(timeout)
    return True


def install_runtime_handler(handler: JitEventHandler) -> bool:
    """Under jit-run: ``handler(reason, detail)`` (the worker runtime's trigger) gets every JIT event.

    It must return at once (the save runs on a thread of its own, which calls
    ``save_in_progress(True)`` before its first CUDA call and
    ``save_in_progress(False)`` after its last).  Takes precedence over a
    handler given to ``install``.  False if the library is not preloaded.
    """
    if not install():
        return False
    _binding.runtime_handler = handler
    return True


def _uninstall() -> None:
    lib = _binding.lib
    if lib is not None:
        lib.jitckpt_interpose_set_callback(_binding.ffi.NULL)


def set_timeout(seconds: float) -> None:
    """Seconds a watched event may stay unfinished before it is a JIT event."""
    if not seconds > 0:
        raise ValueError(f"hang timeout must be > 0 seconds, got {seconds!r}")
    lib = _binding.load()
    if lib is not None and lib.jitckpt_interpose_set_timeout(float(seconds)) != 0:
        raise ValueError(f"hang timeout {seconds!r} s is out of range")


def timeout() -> float | None:
    """The library's hang timeout in seconds, or None if it is not loaded."""
    lib = _binding.load()
    return None if lib is None else float(lib.jitckpt_interpose_timeout())


def save_in_progress(active: bool) -> None:
    """Mark the calling thread as saving (or not): its copies on blocked streams are redirected.

    Call with True on the thread that runs a JIT save, before its first CUDA
    call, and False after its last.  Only this thread is redirected, and only
    until False (or until it exits): another thread's copies stay behind the
    hung collective, as they must.
    """
    lib = _binding.load()
    if lib is not None:
        lib.jitckpt_interpose_save_in_progress(1 if active else 0)


def in_flight_events() -> list[InFlightEvent]:
    """The watch-list now: events recorded after collectives that something waits for."""
    lib = _binding.load()
    if lib is None:
        return []
    ffi = _binding.ffi
    size = max(lib.jitckpt_interpose_in_flight(ffi.NULL, 0), 1)
    while True:  # the list may grow between the two calls
        buf = ffi.new("struct jitckpt_interpose_watch[]", size)
        got = lib.jitckpt_interpose_in_flight(buf, size)
        if got <= size:
            return [
                InFlightEvent(int(w.event), int(w.recorded_on), int(w.waited_by), float(w.age_seconds))
                for w in buf[0:got]
            ]
        size = got


def counters() -> dict[str, int]:
    """The library's counters by name (empty if it is not loaded)."""
    lib = _binding.load()
    if lib is None:
        return {}
    out = _binding.ffi.new("struct jitckpt_interpose_counters *")
    lib.jitckpt_interpose_get_counters(out)
    return {name: int(getattr(out, name)) for name in _binding.counter_names}
