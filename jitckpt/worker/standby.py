"""The template interpreter, forked into every worker of a jit-run job (``jitckpt.launch.warm_start``).

A worker's start is mostly Python start-up and ``import torch`` (DESIGN.md,
decision 3).  jit-run's agent therefore makes one template per node: it
imports torch and forks the template from itself (``serve_forked``), or, where
it cannot tell the workers' environment beforehand, starts one with the first
workers as

    python -u -m jitckpt.worker.standby --fd N --parent PID -- AGENT_COMMAND

The template imports the modules every jit-run worker needs (``PRELOAD``),
tells the agent it is ready, and then serves ``fork`` requests
on its socket: it forks an intermediate process that forks the worker and
exits, so the agent (a subreaper) adopts the worker, and hands the agent a
socket to it.  The worker waits until it is the agent's child, starts its own
session, reseeds the generators a fresh interpreter seeds from the OS, and
receives the worker's command line, environment, working directory and
stdout/stderr file descriptors.  It turns itself into that worker in the order
a fresh ``python -u script.py`` would:

1. stdout/stderr become torchrun's (``dup2``: its redirects, ``--tee``, log
   files); the working directory and the environment become exactly the
   worker's; ``sys.argv`` and ``sys.orig_argv`` those of the worker's command;
2. ``jitckpt.worker.arm()``, as the bootstrap ``sitecustomize`` does in a
   fresh interpreter (it must see the rank's environment);
3. ``sys.path[0]`` becomes the script's directory (the current directory for
   ``-m``), and the script runs as a fresh ``__main__`` module with the
   globals, ``__file__`` and loader a fresh interpreter gives it (``-m``:
   ``runpy._run_module_as_main``, as Python does); an uncaught exception is
   printed by ``sys.excepthook`` without the template's frames, sets
   ``sys.last_*`` and exits with status 1; ``SystemExit`` and normal ends go
   through the interpreter's own shutdown, so atexit hooks and exit codes are
   those of a fresh worker.

Nothing draws random numbers between the imports and the script, and the
template runs no operation (a child forked after an OpenMP parallel region
can hang in its first one).  The preload records which environment variables
it read (``os.environ``); the agent hands the template only workers whose
environment agrees on those.  A scan of the whole environment (tqdm, imported
by torch._dynamo, looks for ``TQDM_*``) sees only the variables the template
has, none of a worker's own; where that happened goes into the event log.
Nothing here runs on import.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
import types
from typing import Any

from jitckpt import config

# torch, and what jit-run's worker hooks import when they arm; torch._dynamo is
# what the first torch.optim optimizer imports (over a second of start-up).
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch.optim",
    "torch._dynamo",
    "jitckpt.worker.instrument",
    "jitckpt.worker.watchdog",
)
_HEADER = struct.Struct("!Q")
# Variables the preload put in the environment (torch._dynamo sets TORCHINDUCTOR_CACHE_DIR): a worker's own
# environment replaces the template's, and then gets these unless it has them, as a fresh worker's imports give it.
_SET_BY_PRELOAD: dict[str, str] = {}
_PR_SET_PDEATHSIG = 1


# ----- the wire: length-prefixed JSON, file descriptors alongside the header -------------


def send_message(sock: socket.socket, message: dict[str, Any], fds: list[int] | tuple[int, ...] = ()) -> None:
    """Send one JSON message (and ``fds`` with SCM_RIGHTS)."""
    body = json.dumps(message).encode()
    header = _HEADER.pack(len(body))
    if fds:
        socket.send_fds(sock, [header], list(fds))
    else:
        sock.sendall(header)
    sock.sendall(body)


def _recv_exactly(sock: socket.socket, size: int, start: bytes = b"") -> bytes:
    data = bytearray(start)
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the other end closed the socket")
        data += chunk
    return bytes(data)


def recv_message(sock: socket.socket, max_fds: int = 0) -> tuple[dict[str, Any], list[int]]:
    """Receive one message sent by :func:`send_message`; raises EOFError if the peer is gone."""
    if max_fds:
        head, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, max_fds)
        if not head:
            raise EOFError("the other end closed the socket")
    else:
        head, fds = b"", []
    head = _recv_exactly(sock, _HEADER.size, head)
    (size,) = _HEADER.unpack(head)
    return json.loads(_recv_exactly(sock, size)), list(fds)


# ----- the standby ----------------------------------------------------------------------


def _set_parent_death_signal(sig: int) -> None:
    """Linux: ``sig`` when the thread that started us exits (0 turns it off).  Best effort."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _caller_outside_the_mapping() -> str:
    """``file:line`` of the first frame outside os.environ's own code (who scans the environment)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_globals.get("__name__") in ("os", "_collections_abc", "collections.abc"):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"


class EnvironmentReads:
    """Which environment variables imports read through ``os.environ`` between :meth:`start` and
    :meth:`stop`, and where the whole environment was scanned (a scan sees only the variables present:
    none of a worker's own).  Survives a fork: an agent that imports torch and then forks its template
    (``jitckpt.launch.warm_start.prefork``) hands the template what its import read."""

    _NAMES = ("__getitem__", "__contains__", "__iter__")

    def __init__(self) -> None:
        self.read: set[str] = set()
        self.scanned: set[str] = set()
        self._own: dict[str, Any] | None = None

    def start(self) -> None:
        if self._own is not None:
            return
        environ_type = type(os.environ)
        self._own = {name: environ_type.__dict__.get(name) for name in self._NAMES}
        inherited = {name: getattr(environ_type, name) for name in self._NAMES}
        read, scanned = self.read, self.scanned

        def getitem(self: Any, key: str) -> Any:
            if sys._getframe(1).f_code.co_name != "__iter__":  # (items()/values() of a scan read every value)
                read.add(key)
            return inherited["__getitem__"](self, key)

        def contains(self: Any, key: object) -> bool:
            read.add(str(key))
            return inherited["__contains__"](self, key)

        def iterate(self: Any) -> Any:
            scanned.add(_caller_outside_the_mapping())
            return inherited["__iter__"](self)

        environ_type.__getitem__, environ_type.__contains__, environ_type.__iter__ = getitem, contains, iterate

    def stop(self) -> tuple[list[str], list[str]]:
        """Stop watching; returns the variables read and the places that scanned the environment."""
        if self._own is not None:
            environ_type = type(os.environ)
            for name, original in self._own.items():
                if original is None:
                    delattr(environ_type, name)
                else:
                    setattr(environ_type, name, original)
            self._own = None
        return sorted(self.read), sorted(self.scanned)


def _preload(reads: EnvironmentReads) -> tuple[list[str], list[str]]:
    """Import ``PRELOAD`` while ``reads`` watches (it may have watched an import before, in the agent).
    Returns the environment variables read, and where the whole environment was scanned."""
    reads.start()
    try:
        for name in PRELOAD:
            try:
                importlib.import_module(name)
            except ImportError:
                pass  # (another torch version): the worker imports what it needs itself
    finally:
        read_scanned = reads.stop()
    return read_scanned


def _apply_environment(env: dict[str, str]) -> None:
    for key in [k for k in os.environ if k not in env]:
        del os.environ[key]
    for key, value in env.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _fresh_main_module() -> types.ModuleType:
    """A ``__main__`` module as a fresh interpreter has it, in ``sys.modules``."""
    import builtins
    import importlib.machinery

    main = types.ModuleType("__main__")
    main.__dict__.update({"__annotations__": {}, "__builtins__": builtins,
                          "__loader__": importlib.machinery.BuiltinImporter})
    sys.modules["__main__"] = main
    return main


def _exit_by_sigint() -> None:
    """How a fresh interpreter ends after an uncaught KeyboardInterrupt: shutdown as usual, then SIGINT."""
    import atexit
    import threading

    threading._shutdown()  # type: ignore[attr-defined]  (joins non-daemon threads, as finalisation does)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            pass
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
    os._exit(128 + signal.SIGINT)  # (SIGINT blocked)


def _run_as_main(run: Any) -> None:
    """Run ``run()`` the way the interpreter runs a script: uncaught exceptions print and exit 1."""
    try:
        run()
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001  (what the interpreter does at top level)
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_globals is globals():
            tb = tb.tb_next  # the standby's own frames are not the script's business
        exc.__traceback__ = tb  # (what the default excepthook prints)
        sys.last_type, sys.last_value, sys.last_traceback = type(exc), exc, tb
        sys.last_exc = exc  # type: ignore[attr-defined]  (Python 3.12 reads this one)
        try:
            sys.excepthook(type(exc), exc, tb)
        except BaseException as hook_error:  # noqa: BLE001
            print("Error in sys.excepthook:", file=sys.stderr)
            sys.__excepthook__(type(hook_error), hook_error, hook_error.__traceback__)
            print("\nOriginal exception was:", file=sys.stderr)
            sys.__excepthook__(type(exc), exc, tb)
        if isinstance(exc, KeyboardInterrupt):
            _exit_by_sigint()
        raise SystemExit(1) from None


def _run_script(path: str, main: types.ModuleType) -> None:
    import importlib.machinery

    absolute = os.path.abspath(path)
    if not sys.flags.safe_path:
        sys.path.insert(0, os.path.dirname(os.path.realpath(path)))
    main.__dict__.update({"__file__": absolute, "__cached__": None,
                          "__loader__": importlib.machinery.SourceFileLoader("__main__", absolute)})

    def run() -> None:
        with open(absolute, "rb") as f:
            source = f.read()
        exec(compile(source, absolute, "exec", dont_inherit=True), main.__dict__)

    try:
        _run_as_main(run)
    finally:
        for name in ("__file__", "__cached__"):  # as the interpreter does once the script is over
            main.__dict__.pop(name, None)


def _run_module(name: str) -> None:
    import runpy

    if not sys.flags.safe_path:
        sys.path.insert(0, os.getcwd())
    _run_as_main(lambda: runpy._run_module_as_main(name, alter_argv=True))  # type: ignore[attr-defined]


def _arm() -> None:
    """Arm jitckpt as the bootstrap sitecustomize does in a fresh worker (the same function, when loaded)."""
    bootstrap = sys.modules.get("sitecustomize")
    if os.path.basename(os.path.dirname(getattr(bootstrap, "__file__", None) or "")) == "_bootstrap":
        bootstrap._arm()  # type: ignore[union-attr]
    elif config.is_active():
        import jitckpt.worker

        jitckpt.worker.arm()


def set_command_line(args: list[str]) -> bool:
    """Show ``args`` as this process's command line (``/proc/PID/cmdline``, hence ``ps`` and ``pkill -f``): written
    over the argument strings the kernel placed at exec, as ``setproctitle`` does, cut to their length and padded
    with NULs (a reader that splits on NUL sees empty strings at the end).  Best effort; returns whether it did."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        start, end = int(fields[48 - 3]), int(fields[49 - 3])  # arg_start, arg_end (proc(5) fields 48, 49)
        if end <= start:
            return False
        data = b"\0".join(os.fsencode(a) for a in args)[: end - start - 1]
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(data.ljust(end - start, b"\0"))
        return True
    except (OSError, ValueError, IndexError):
        return False


def become_worker(sock: socket.socket, job: dict[str, Any], fds: list[int], idle_since: float) -> None:
    """Turn this standby into the worker ``job`` describes, then run its script (see the module docstring)."""
    _set_parent_death_signal(0)  # a worker outlives the agent exactly as a fresh one would
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    for target, fd in zip((1, 2), fds):
        if fd != target:
            os.dup2(fd, target)
            os.close(fd)
    os.chdir(job["cwd"])
    _apply_environment(job["env"])
    _take_signals(job.get("signals"))
    for key, value in _SET_BY_PRELOAD.items():  # (as the same imports do in a fresh worker)
        os.environ.setdefault(key, value)
    sys.argv = list(job["argv"])
    sys.orig_argv = list(job["orig_argv"])
    set_command_line(sys.orig_argv)  # (ps shows the worker's command, as for a fresh one)
    send_message(sock, {"started": True})
    sock.close()

    main = _fresh_main_module()
    _arm()
    from jitckpt import eventlog

    # (after arm(), whose worker_start event opens the event log at the file descriptor a fresh worker uses)
    eventlog.record(
        "warm_start",
        rank=int(os.environ.get("RANK", "-1")),
        local_rank=int(os.environ.get("LOCAL_RANK", "-1")),
        attempt=int(os.environ.get(config.ENV_WORKER_GENERATION) or os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0),
        idle_seconds=round(time.time() - idle_since, 3),
    )
    if job["module"]:
        _run_module(job["target"])
    else:
        _run_script(job["target"], main)


def signal_sets(status: str = "/proc/thread-self/status") -> dict[str, list[int]]:
    """The signals ignored by this process and blocked in this thread, as the kernel has them (``SigIgn``,
    ``SigBlk``): what a child inherits across ``exec`` (caught signals are reset to their default there)."""
    sets: dict[str, list[int]] = {"ignored": [], "blocked": []}
    try:
        with open(status) as f:
            for line in f:
                name, _, value = line.partition(":")
                field = {"SigIgn": "ignored", "SigBlk": "blocked"}.get(name)
                if field:
                    mask = int(value.strip(), 16)
                    sets[field] = [n for n in range(1, 65) if mask >> (n - 1) & 1]
    except (OSError, ValueError):
        pass
    return sets


def _take_signals(spawn: dict[str, list[int]] | None) -> None:
    """Give this worker what a worker torchrun spawned would inherit (``warm_start.spawn_signals``): a signal the
    spawning thread's process ignores is ignored, one this template ignores and it does not gets its default
    back (SIGINT: Python's ``default_int_handler``, as a fresh interpreter installs it), and the blocked set is
    the spawning thread's.  Every other handler stays: the template made the imports a fresh worker makes, and
    their handlers (faulthandler's) are the ones a fresh worker would have.  SIGPIPE and SIGXFSZ are ignored by
    every Python interpreter's start."""
    if spawn is None:
        return
    wanted, here = set(spawn.get("ignored", ())), set(signal_sets("/proc/self/status")["ignored"])
    for number in wanted ^ here:
        try:
            sig = signal.Signals(number)
        except ValueError:
            continue
        if sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGPIPE, signal.SIGXFSZ):
            continue
        try:
            if number in wanted:
                signal.signal(sig, signal.SIG_IGN)
            else:
                signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
        except (OSError, ValueError):  # (signals the C library keeps for itself)
            continue
    signal.pthread_sigmask(signal.SIG_SETMASK, [s for s in spawn.get("blocked", ()) if 0 < s < signal.NSIG])


def cuda_touched() -> str | None:
    """Whether this process has touched the CUDA driver (then a forked child cannot use CUDA): torch's
    lazy CUDA initialisation, the driver library mapped, or an NVIDIA device open.  Says which, or None."""
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and getattr(cuda, "is_initialized", lambda: False)():
        return "initialised CUDA"
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split(maxsplit=5)[-1].strip() if line.count(" ") >= 5 else ""
                if os.path.basename(path).startswith("libcuda.so"):
                    return f"loaded the CUDA driver ({path})"
        for fd in os.listdir("/proc/self/fd"):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            if target.startswith("/dev/nvidia"):
                return f"opened {target}"
    except OSError:
        pass
    return None


def _reseed_after_fork() -> None:
    """Give a forked worker the fresh random state a fresh interpreter has: torch (2.13) seeds its CPU
    generator, and numpy its global one, from the OS at import, and multiprocessing draws its authentication
    key; Python's ``random`` reseeds itself at fork."""
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "default_generator"):
        torch.default_generator.seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None and hasattr(numpy_random, "seed"):
        numpy_random.seed()
    mp_process = sys.modules.get("multiprocessing.process")
    if mp_process is not None:
        mp_process.current_process().authkey = os.urandom(32)


def _forked_worker(sock: socket.socket, agent: int) -> None:
    """In the grandchild the template forked: wait to be the agent's child, then wait for a worker's job."""
    deadline = time.monotonic() + 10.0
    while os.getppid() != agent:  # (the intermediate process exits at once; the agent, a subreaper, adopts us)
        if time.monotonic() > deadline:
            os._exit(0)
        time.sleep(0.001)
    os.setsid()  # a session and process group of its own, as torchrun gives a worker
    _set_parent_death_signal(signal.SIGKILL)  # never outlives the agent before it is a worker
    if os.getppid() != agent:
        os._exit(0)
    _reseed_after_fork()
    idle_since = time.time()
    try:
        send_message(sock, {"ready": True, "pid": os.getpid()})
        sock.settimeout(None)
        job, fds = recv_message(sock, max_fds=2)
    except (EOFError, OSError):
        os._exit(0)
    become_worker(sock, job, fds, idle_since)


def _fork_worker(agent_sock: socket.socket) -> socket.socket | None:
    """One worker interpreter: fork twice, so that the agent (a subreaper) adopts the grandchild, and hand
    the agent the grandchild's socket.  Returns that socket in the grandchild, None in the template."""
    ours, theirs = socket.socketpair()
    child = os.fork()
    if child == 0:  # the intermediate process: it only forks
        grandchild = False
        try:
            agent_sock.close()
            ours.close()
            grandchild = os.fork() == 0
        finally:
            if not grandchild:
                os._exit(0)
        return theirs
    theirs.close()
    os.waitpid(child, 0)
    send_message(agent_sock, {"forked": True}, [ours.fileno()])
    ours.close()
    return None


def serve_as_template(sock: socket.socket) -> socket.socket:
    """The template's loop: a worker interpreter for each ``{"fork": true}``; exits when the agent closes
    the socket.  Returns (in a forked grandchild only) that worker's socket."""
    while True:
        try:
            sock.settimeout(None)
            message, _ = recv_message(sock)
        except (EOFError, OSError, ValueError):
            os._exit(0)
        if message.get("fork"):
            if threading.active_count() > 1:  # (a thread of the preload: forking now could copy a held lock)
                names = sorted(t.name for t in threading.enumerate() if t is not threading.current_thread())
                send_message(sock, {"forked": False, "error": f"the template runs threads {names}"})
                continue
            worker = _fork_worker(sock)
            if worker is not None:
                return worker


def serve(sock: socket.socket, agent: int, reads: EnvironmentReads, started: float) -> None:
    """The template: import ``PRELOAD``, tell the agent it is ready (or why it cannot fork workers), then fork
    workers on request.  Returns only in a forked worker, once its script has ended normally."""
    # ``python -m`` put the current directory first on sys.path; a worker's
    # path starts with its script's directory instead (set at hand-over).
    if not sys.flags.safe_path and sys.path and sys.path[0] == os.getcwd():
        del sys.path[0]
    # (what a forked template's agent started watching: a copy of the environment is not an import's read)
    reads.stop()
    before = dict(os.environ)
    # the template's own name in ps (a forked one has the agent's command line, which names the script)
    set_command_line([sys.executable, "-u", "-m", "jitckpt.worker.standby", "--parent", str(agent)])
    env_read, env_scanned_by = _preload(reads)
    _SET_BY_PRELOAD.update((k, v) for k, v in os.environ.items() if k not in before)
    touched = cuda_touched()
    if touched:  # (a child forked after the CUDA driver was initialised cannot use CUDA: never fork then)
        send_message(sock, {"ready": False, "error": f"importing torch {touched}, and a worker forked after "
                                                     f"that could not use CUDA"})
        os._exit(0)
    try:
        send_message(sock, {"ready": True, "pid": os.getpid(), "seconds": round(time.monotonic() - started, 3),
                            "env_read": env_read, "env_scanned_by": env_scanned_by})
    except OSError:
        os._exit(0)
    _forked_worker(serve_as_template(sock), agent)  # (in the template, serve_as_template never returns)


def serve_forked(sock: socket.socket, agent: int, reads: EnvironmentReads, started: float) -> None:
    """The template when the agent forked it right after importing torch (``warm_start.prefork``): a
    session of its own and the agent's death signal, as a spawned template has, then :func:`serve`.
    Never returns into the agent's code: a worker whose script ended normally leaves by ``SystemExit(0)``
    (the interpreter's own shutdown, as at the end of a fresh worker's script)."""
    try:
        os.setsid()
        _set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != agent:
            os._exit(0)
    except BaseException:  # noqa: BLE001  (never run the agent's code in a second process)
        os._exit(1)
    # the agent's own modules are not a worker's (the frames that run here keep what they use)
    for name in [m for m in sys.modules if m == "jitckpt.launch" or m.startswith("jitckpt.launch.")]:
        del sys.modules[name]
    package = sys.modules.get("jitckpt")
    if package is not None and "launch" in vars(package):
        delattr(package, "launch")
    serve(sock, agent, reads, started)
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m jitckpt.worker.standby", description=__doc__.splitlines()[0])
    parser.add_argument("--fd", type=int, required=True, help="the socket to the agent (inherited)")
    parser.add_argument("--parent", type=int, required=True, help="the agent's pid")
    parser.add_argument("agent_command", nargs=argparse.REMAINDER,
                        help="after --: the agent's command line, unused (room for a worker's in the process's "
                             "argument area: set_command_line)")
    args = parser.parse_args(argv)
    sock = socket.socket(fileno=args.fd)
    _set_parent_death_signal(signal.SIGKILL)  # the template never outlives the agent
    if os.getppid() != args.parent:
        os._exit(0)
    serve(sock, args.parent, EnvironmentReads(), time.monotonic())


if __name__ == "__main__":
    main()
