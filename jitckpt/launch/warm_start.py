"""Warm start: every worker is forked from a template interpreter that has already imported torch.

Most of a worker's start is Python start-up and ``import torch`` (with
torch._dynamo, which the first optimizer imports): about 4 CPU-seconds each,
so a restart waits for them, and on a small host a job's CPU goes mostly to
them (DESIGN.md, decision 3).  jit-run's agent therefore makes one *template*
(``jitckpt.worker.standby``) per node: it imports torch and forks the template
from itself before torchrun runs (:func:`prefork`: no thread, no socket yet),
so that torch's import is paid once per node, not once by the agent and once
by the template.  The workers' environment is the agent's plus what torchrun
sets before it starts them; of that, only ``OMP_NUM_THREADS`` matters to an
import (libgomp reads it when torch loads it), so the agent sets torchrun's
value while it imports; if that guess turns out wrong at the first worker
start, the template is replaced by one started then, with the workers'
environment (as it always is where no guess can be made: ``--nproc-per-node
auto``).  The template imports the rest of ``PRELOAD`` (torch.distributed,
torch.optim, torch._dynamo, jitckpt's worker hooks) and then only forks.
torchrun itself is unchanged: its agent,
rendezvous, restarts and teardown all run as before.  Only the place where its
``SubprocessHandler`` calls ``subprocess.Popen`` for a worker is patched:

- the template forks twice and the intermediate process exits, so the
  grandchild is adopted by the agent (``PR_SET_CHILD_SUBREAPER``): it is the
  agent's own child, as torchrun's workers are; torchrun gets an
  :class:`AdoptedWorker`, which it polls, waits for, and signals (SIGTERM, the
  JIT save, then SIGKILL of its process group) like a ``Popen``, and jit-run
  sees its state in ``/proc`` (a SIGSTOPped worker is killed at once); the
  orphans a dead worker leaves (its DataLoader workers) are adopted too, and
  reaped at each restart (:func:`reap_orphans`);
- the forked worker starts its own session, reseeds torch's and NumPy's
  generators from the OS as a fresh interpreter does, receives the worker's
  command line, environment, working directory, stdout/stderr descriptors
  and the signals a spawned worker would inherit ignored or blocked,
  and becomes the worker (arming jitckpt, then running the script as
  ``__main__``);
- if that cannot be done, torchrun spawns the worker itself, and the agent
  says why in one line per group (the template did not start, the command is
  not ``python -u script`` or ``python -u -m module``, a variable the template
  read while importing differs for the rank).  A template that died, or whose
  environment the agent changed, is replaced at the next (re)start; three that
  exit while importing turn warm start off for the job.

Forking is safe here because the template never runs an operation: ``import
torch`` starts an OpenMP thread unless ``OMP_NUM_THREADS=1`` (torchrun's
default), and a child forked after one parallel operation hung in its first
one (torch 2.13, tried here), but children of a process that only imported
torch run parallel operations normally (measured: 6 of 6, 2 and 4 threads).
The template refuses to fork if importing touched the CUDA driver
(``standby.cuda_touched``: a child forked after that cannot use CUDA).  ``jit-run
--warm-restart off`` (``JITCKPT_WARM_RESTART=off``) turns all of this off.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from importlib.util import MAGIC_NUMBER
from typing import IO, Any

from jitckpt import config, eventlog
from jitckpt.console import emit
from jitckpt.worker import standby as wire

STANDBY_MODULE = "jitckpt.worker.standby"
# jit-run's agent changes these in its own environment at every (re)start; a
# template never has the first (it must not arm) and reads none of them at import.
AGENT_PER_ATTEMPT = frozenset({config.ENV_ACTIVE, config.ENV_WORKER_GENERATION, config.ENV_RENDEZVOUS_ROUND})
# What torchrun's agent puts in its own environment after a template forked early (``prefork``) and that only
# torch's Python code reads (none at import, which the template watches; no C library reads it): a change of
# one of these alone is no reason for a new template.
AGENT_SET_BY_TORCHRUN = frozenset({"TORCHELASTIC_SIGNALS_TO_HANDLE"})
HANDOVER_TIMEOUT = 10.0
# How long a (re)start waits for a template that is still importing torch (a cold start takes as long).
TEMPLATE_START_TIMEOUT = 180.0
MAX_FAILED_STARTS = 3
PR_SET_CHILD_SUBREAPER = 36


def say(message: str) -> None:
    emit(f"[jit-run] warm restart: {message}")


def enabled() -> bool:
    return os.environ.get(config.ENV_WARM_RESTART, config.DEFAULT_WARM_RESTART) != "off"


def parse_worker_command(args: tuple[str, ...] | list[str], interpreter: str) -> tuple[str, bool, list[str]] | str:
    """``(target, is_module, sys.argv)`` of torchrun's ``[python, -u, script | -m module, args...]``,
    or why a forked worker cannot run it."""
    if not args or os.path.realpath(args[0]) != os.path.realpath(interpreter):
        return "the workers are not started as `python -u script` (torchrun --no-python, or another interpreter)"
    if len(args) < 3 or args[1] != "-u":
        return f"unexpected interpreter options {list(args[1:2])}"
    if args[2] == "-m":
        if len(args) < 4:
            return "`-m` without a module"
        return args[3], True, ["-m", *args[4:]]
    script = args[2]
    if script.startswith("-"):
        return f"unsupported interpreter option {script!r}"
    if not os.path.isfile(script):
        return f"{script!r} is not a file"
    with open(script, "rb") as f:
        head = f.read(len(MAGIC_NUMBER))
    if head == MAGIC_NUMBER or zipfile.is_zipfile(script):
        return f"{script!r} is not Python source (a .pyc or a zip application)"
    return script, False, list(args[2:])


def _environ_snapshot() -> dict[str, str]:
    while True:
        try:
            return dict(os.environ)
        except RuntimeError:  # changed by another thread while being copied
            continue


def spawn_signals() -> dict[str, list[int]]:
    """What a worker that torchrun spawns from this thread inherits: ignored and blocked signals.  A warm worker
    takes them (``standby.become_worker``): its template was forked before torchrun set its handlers, and under
    ``nohup`` it would otherwise ignore SIGHUP where a spawned worker does not."""
    return wire.signal_sets()


def _is_signal(exc: BaseException) -> bool:
    """True for torchrun's ``SignalException`` (its SIGTERM/SIGINT/SIGHUP/SIGQUIT handlers raise it)."""
    return any(cls.__name__ == "SignalException" for cls in type(exc).__mro__)


class AdoptedWorker:
    """A worker the template forked and the agent adopted (a subreaper): what torchrun needs of a ``Popen``
    (``pid``, ``args``, ``returncode``, ``poll``, ``wait``, ``send_signal``, ``terminate``, ``kill``),
    with the exit status read by ``waitpid``, as ``Popen`` reads it."""

    def __init__(self, pid: int, args: list[str]) -> None:
        self.pid = pid
        self.args = args
        self.returncode: int | None = None
        self._lock = threading.Lock()

    def _reap(self, flags: int) -> int | None:
        with self._lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, flags)
                except ChildProcessError:  # (reaped elsewhere: its status is lost; Popen says 0, a failure is safer)
                    self.returncode = 255
                else:
                    if pid == self.pid:
                        self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def poll(self) -> int | None:
        if not self._lock.acquire(blocking=False):
            return None  # (another thread is waiting for it, as Popen.poll() answers then)
        self._lock.release()
        return self._reap(os.WNOHANG)

    def wait(self, timeout: float | None = None) -> int:
        if timeout is None:
            return self._reap(0)  # type: ignore[return-value]
        deadline = time.monotonic() + timeout
        delay = 0.0005
        while self.poll() is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(min(delay, remaining, 0.05))
            delay *= 2
        return self.returncode  # type: ignore[return-value]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Template:
    """The template interpreter and the agent's end of its socket."""

    def __init__(self, popen: subprocess.Popen | AdoptedWorker, sock: socket.socket, env: dict[str, str]) -> None:
        self.popen = popen  # (an AdoptedWorker for a template forked from the agent: the same calls)
        self.sock = sock
        self.env = env  # the environment it was started with
        self.ready = False
        self.env_read: list[str] = []
        self.forked_from_agent = isinstance(popen, AdoptedWorker)

    def exit_status(self, error: BaseException) -> int | None:
        """Its exit status after ``error`` on its socket, or None while it runs (an end of file: it is
        exiting, so it is given a moment)."""
        status = self.popen.poll()
        if status is None and isinstance(error, EOFError):
            try:
                status = self.popen.wait(2)
            except subprocess.TimeoutExpired:
                pass
        return status

    def discard(self) -> None:
        """Close the socket (the template exits), kill it if it is still running, and reap it."""
        self.sock.close()
        if self.popen.poll() is None:
            try:
                self.popen.kill()
            except ProcessLookupError:
                pass
        try:
            self.popen.wait(5)
        except subprocess.TimeoutExpired:
            pass


class WarmStart:
    """The template of one agent's workers (see the module docstring).

    Everything runs in the agent's main thread, from torchrun's
    ``SubprocessHandler``: the template is started when the agent starts,
    and each worker of each (re)start is forked from it once it is ready.
    """

    def __init__(self, interpreter: str) -> None:
        self.interpreter = interpreter
        self.size = 0  # local world size, learned from the first worker group
        self.generation = -1
        self.disabled: str | None = None
        self.cold: list[tuple[int, str]] = []  # (local rank, why) of this group's cold starts
        self._template: _Template | None = None
        self._failed_starts = 0
        self._known: dict[int, Any] = {}  # this agent's workers and templates (their owners reap them), by pid
        self._reaped_at = 0.0
        self._failed_group = -1  # the last group whose template did not start, and why
        self._failed_why = ""

    # ----- called by torchrun's SubprocessHandler (agent main thread) --------------------

    def start_worker(self, handler: Any, args: tuple[str, ...], env: dict[str, str], spawn: Any) -> Any:
        """torchrun's ``SubprocessHandler._popen``: a forked worker, or ``spawn(handler, args, env)``'s Popen."""
        local_rank = handler.local_rank_id
        if local_rank == 0:
            self.generation += 1
            self.cold = []
            self.reap()
        proc = None
        if not self.disabled:
            try:
                proc, why = self.launch(args, env, handler._stdout, handler._stderr, local_rank)
            except Exception as exc:  # (another torch's SubprocessHandler, a bug): never worse than cold
                if _is_signal(exc):  # torchrun's SIGTERM/SIGINT (a preemption): its to handle, never swallowed
                    self._lose_template("interrupted by a signal while starting a worker", failed=False)
                    raise
                self.disable(f"internal error {type(exc).__name__}: {exc}")
                proc, why = None, str(exc)
            if proc is None:
                eventlog.record("warm_fallback", local_rank=local_rank, reason=why)
                if not self.disabled:  # (disable() has said why, once)
                    self.cold.append((local_rank, why))
        try:
            self.size = int(env.get("LOCAL_WORLD_SIZE", ""))
        except ValueError:
            self.size = max(self.size, local_rank + 1)
        if local_rank == self.size - 1 and self.cold:  # one line per group
            ranks = ", ".join(str(r) for r, _ in self.cold)
            reasons = "; ".join(dict.fromkeys(why for _, why in self.cold))
            say(f"local rank{'s' if len(self.cold) > 1 else ''} {ranks} of {self.size} start cold: {reasons}")
        if proc is None:
            proc = spawn(handler, args, env)
        self._known[proc.pid] = proc
        return proc

    def launch(self, args: tuple[str, ...], env: dict[str, str], stdout: IO | None, stderr: IO | None,
               local_rank: int) -> tuple[AdoptedWorker | None, str]:
        """Fork worker ``local_rank`` from the template and hand it the job: the worker, or None and why not."""
        command = parse_worker_command(args, self.interpreter)
        if isinstance(command, str):
            self.disable(command)
            return None, command
        target, is_module, argv = command
        job = {"argv": argv, "orig_argv": list(args), "env": env, "cwd": os.getcwd(), "module": is_module, "target": target,
               "signals": spawn_signals()}
        fds = [stdout.fileno() if stdout else 1, stderr.fileno() if stderr else 2]
        for _ in range(2):  # (a template that died since the last group: one more try, with a new one)
            template, why = self._ready_template(env)
            if template is None:
                return None, why
            try:
                worker = self._fork(template, job, fds, list(args))
            except (OSError, EOFError, ValueError, KeyError, TypeError, subprocess.TimeoutExpired) as exc:
                status = template.exit_status(exc)
                self._lose_template(f"exited with status {status}" if status is not None
                                    else f"failed to fork a worker ({type(exc).__name__}: {exc})", failed=False)
                why = f"the template (pid {template.popen.pid}) failed to fork a worker ({type(exc).__name__})"
                if status is None:  # (alive but out of step: the rest of this group starts cold, the next gets a new one)
                    self._failed_group, self._failed_why = self.generation, why
                    return None, why
                continue
            eventlog.record("warm_handover", local_rank=local_rank, worker_pid=worker.pid, template_pid=template.popen.pid)
            return worker, ""
        return None, why

    @staticmethod
    def _fork(template: _Template, job: dict[str, Any], fds: list[int], args: list[str]) -> AdoptedWorker:
        """Ask the template for a worker interpreter and hand it ``job`` (raises if any of it fails)."""
        template.sock.settimeout(HANDOVER_TIMEOUT)
        wire.send_message(template.sock, {"fork": True})
        reply, received = wire.recv_message(template.sock, max_fds=1)
        if not reply.get("forked") or len(received) != 1:
            raise ValueError(f"unexpected reply {reply}")
        with socket.socket(fileno=received[0]) as worker_sock:
            worker_sock.settimeout(HANDOVER_TIMEOUT)
            hello, _ = wire.recv_message(worker_sock)
            worker = AdoptedWorker(int(hello["pid"]), args)
            try:
                wire.send_message(worker_sock, job, fds)
                reply, _ = wire.recv_message(worker_sock)
                if not reply.get("started"):
                    raise ValueError(f"unexpected reply {reply}")
            except BaseException:
                worker.kill()
                worker.wait(5)
                raise
        return worker

    def reap(self, every: float = 0.0) -> None:
        """Reap the orphans this agent adopted (at most once per ``every`` seconds); forget the workers and
        templates their owners have reaped."""
        now = time.monotonic()
        if now - self._reaped_at < every:
            return
        self._reaped_at = now
        for pid in [pid for pid, proc in self._known.items() if getattr(proc, "returncode", None) is not None]:
            del self._known[pid]
        reap_orphans(set(self._known))

    def disable(self, reason: str) -> None:
        """Stop forking workers (for the rest of the job) and say why, once."""
        if self.disabled is None:
            self.disabled = reason
            say(f"off for this job: {reason}; torchrun spawns the workers itself")
            eventlog.record("warm_restart_off", reason=reason)
            self.close()

    def close(self) -> None:
        """End the template (at the agent's exit): workers it forked are the agent's, and go on."""
        template, self._template = self._template, None
        if template is not None:
            template.discard()

    # ----- the template --------------------------------------------------------------------

    def start_template(self) -> None:
        """Start the template interpreter (it imports ``PRELOAD``, then forks workers on request)."""
        ours, theirs = socket.socketpair()
        env = _environ_snapshot()
        env.pop(config.ENV_ACTIVE, None)  # the bootstrap must not arm a runtime in the template
        cmd = [self.interpreter, "-u", "-m", STANDBY_MODULE, "--fd", str(theirs.fileno()), "--parent", str(os.getpid()),
               "--", *sys.orig_argv]  # (the agent's command: room for the workers' in the template's argument area)
        try:
            popen = subprocess.Popen(cmd, env=env, pass_fds=(theirs.fileno(),), start_new_session=True)
        except OSError as exc:
            ours.close()
            self.disable(f"cannot start the template interpreter: {exc}")
            return
        finally:
            theirs.close()
        self._known[popen.pid] = popen
        self._template = _Template(popen, ours, env)

    def adopt_template(self, template: _Template) -> None:
        """Use the template ``prefork`` forked from this agent (it is importing the rest of ``PRELOAD``)."""
        self._known[template.popen.pid] = template.popen
        self._template = template

    def _lose_template(self, why: str, failed: bool = True) -> None:
        """Discard the template; ``failed``: it did not start (three in a row turn warm start off)."""
        template, self._template = self._template, None
        if template is None:
            return
        template.discard()
        eventlog.record("template_lost", template_pid=template.popen.pid, error=why)
        if failed and not template.ready:
            self._failed_starts += 1
            if self._failed_starts >= MAX_FAILED_STARTS:
                self.disable(f"{MAX_FAILED_STARTS} template interpreters in a row exited while importing torch "
                             f"(last status {template.popen.returncode}; their errors are above)")

    def _ready_template(self, env: dict[str, str]) -> tuple[_Template | None, str]:
        """The template, started if there is none and waited for while it imports; or None and why not."""
        template = self._template
        if template is not None and template.popen.poll() is not None:
            self._lose_template(f"exited with status {template.popen.returncode}")
            template = None
        if template is not None:
            agent_env = _environ_snapshot()
            changed = sorted(k for k in set(template.env) | set(agent_env)
                             if k not in AGENT_PER_ATTEMPT and k != config.ENV_ACTIVE
                             and not (k in AGENT_SET_BY_TORCHRUN and k not in template.env_read)
                             and template.env.get(k) != agent_env.get(k))
            if changed:  # (not a failed start: a forked template's guess of torchrun's settings was wrong)
                self._lose_template(f"the agent's environment changed since it started ({', '.join(changed[:3])})",
                                    failed=False)
                template = None
        if template is None:
            if self.disabled:
                return None, self.disabled
            if self._failed_group == self.generation:  # (one try per group: the rest of it starts cold)
                return None, self._failed_why
            self.start_template()
            template = self._template
            if template is None:
                return None, self.disabled or "no template"
        if not template.ready:
            try:
                template.sock.settimeout(TEMPLATE_START_TIMEOUT)
                message, _ = wire.recv_message(template.sock)
            except (OSError, EOFError, ValueError) as exc:
                status = template.exit_status(exc)
                self._failed_group = self.generation
                self._failed_why = (f"the template interpreter exited with status {status} while importing torch"
                                    if status is not None else
                                    f"the template interpreter was not ready within {TEMPLATE_START_TIMEOUT:.0f}s"
                                    if isinstance(exc, TimeoutError) else
                                    f"the template interpreter broke off while importing torch ({type(exc).__name__})")
                self._lose_template(f"no ready message ({type(exc).__name__}: {exc})")
                return None, self.disabled or self._failed_why
            if not message.get("ready"):
                why = str(message.get("error", "it was not ready"))
                self.disable(f"the template interpreter cannot fork workers: {why}")
                return None, self.disabled or why
            template.ready, template.env_read = True, list(message.get("env_read", []))
            self._failed_starts = 0
            eventlog.record("template_ready", template_pid=template.popen.pid, seconds=message.get("seconds"),
                            forked_from_agent=template.forked_from_agent, env_scanned_by=message.get("env_scanned_by", []))
        per_rank = [k for k in template.env_read if k not in AGENT_PER_ATTEMPT and env.get(k) != template.env.get(k)]
        if per_rank:
            why = "importing torch read the workers' own environment variables " + ", ".join(per_rank[:3])
            self.disable(why)
            return None, why
        return template, ""


_pool: WarmStart | None = None
_preforked: _Template | None = None
REAP_EVERY_SECONDS = 5.0
NOT_PYTHON_OPTIONS = ("--no-python", "--no_python", "--run-path", "--run_path")


def omp_threads_torchrun_sets(torchrun_args: list[str], environ: dict[str, str] | os._Environ) -> str | None | bool:
    """What torchrun will put in ``OMP_NUM_THREADS`` for the workers ("1" when it runs more than one process per
    node and the variable is unset, as ``torch.distributed.run.config_from_args`` does), None when it leaves it
    alone, False when this cannot be told without torch (``--nproc-per-node auto`` or ``gpu``, an abbreviated
    or unreadable option).  A guess: the first workers' environment checks it (``WarmStart._ready_template``)."""
    if "OMP_NUM_THREADS" in environ:
        return None
    nproc: str | None = None
    for i, arg in enumerate(torchrun_args):  # (the first; a script's own option of that name is the rare miss)
        name, sep, value = arg.partition("=")
        if name in ("--nproc-per-node", "--nproc_per_node"):
            nproc = value if sep else (torchrun_args[i + 1] if i + 1 < len(torchrun_args) else "")
            break
        if name.startswith("--nproc"):
            return False  # (an abbreviation argparse would accept)
    if nproc is None:
        nproc = environ.get("PET_NPROC_PER_NODE", "1")  # (torchrun reads PET_<OPTION> for an option not given)
    if nproc == "cpu":  # (torch._utils.cpu_count(): the CPUs this process may run on)
        nproc = str(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)
    if not nproc.isdigit():
        return False
    return "1" if int(nproc) > 1 else None


def prefork(torchrun_args: list[str]) -> None:
    """Import torch in the agent, then fork the template from it, before torchrun starts any thread or opens
    any socket: the template then imports only the rest of ``PRELOAD`` (torch's import, about 1.5 CPU-seconds,
    is not paid twice per node).  The environment is the one the template would have had if started with the
    first workers (``OMP_NUM_THREADS`` as torchrun will set it, which libgomp reads when torch loads it); if
    that guess is wrong, the first workers find the environment changed and a template is started as before.
    Does nothing when warm start is off, or cannot be used for these workers."""
    global _preforked
    if not enabled() or "torch" in sys.modules or any(a in NOT_PYTHON_OPTIONS for a in torchrun_args):
        return
    omp = omp_threads_torchrun_sets(torchrun_args, os.environ)
    if omp is False:
        return  # (the template starts with the first workers, which have torchrun's setting)
    if omp is not None:
        os.environ["OMP_NUM_THREADS"] = omp
    agent = os.getpid()
    reads = wire.EnvironmentReads()
    started = time.monotonic()
    pid = -1
    env = _environ_snapshot()  # (what the template starts with; if importing torch changed it, the check sees it)
    env.pop(config.ENV_ACTIVE, None)
    try:
        reads.start()
        try:
            import torch  # noqa: F401  (what the agent imports first anyway)
        except Exception:  # noqa: BLE001  (torchrun's own import says what is wrong)
            return
        ours, theirs = socket.socketpair()
        try:
            pid = os.fork()
        except OSError:
            ours.close()
            theirs.close()
    finally:
        if pid != 0:
            reads.stop()
            if omp is not None:
                os.environ.pop("OMP_NUM_THREADS", None)  # (torchrun sets it, and says so, as without jit-run)
    if pid == 0:  # the template (outside every try: a worker's exit must not run the agent's clean-ups)
        ours.close()
        wire.serve_forked(theirs, agent, reads, started)
    if pid > 0:
        theirs.close()
        _preforked = _Template(AdoptedWorker(pid, [sys.executable, "-m", STANDBY_MODULE]), ours, env)


def reap_now_and_then() -> None:
    """Called from torchrun's monitor loop: reap adopted orphans every few seconds (a script that starts
    background processes leaves them to the agent, a subreaper)."""
    if _pool is not None:
        _pool.reap(every=REAP_EVERY_SECONDS)


def _close_pool() -> None:
    if _pool is not None:
        _pool.close()


def reap_orphans(known: set[int]) -> list[int]:
    """Reap the exited orphans this agent adopted as a subreaper (a dead worker's DataLoader workers, say):
    children that are zombies, not among ``known``, and of another session than the agent's (so never a
    process some code of the agent started and will wait for).  Returns their pids."""
    reaped = []
    own_session = os.getsid(0)
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return reaped
    children: set[int] = set()
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/children") as f:
                children.update(int(pid) for pid in f.read().split())
        except (OSError, ValueError):
            continue
    for pid in sorted(children - known):
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            state, session = fields[0], int(fields[3])
        except (OSError, IndexError, ValueError):
            continue
        if state == "Z" and session != own_session:
            try:
                if os.waitpid(pid, os.WNOHANG)[0] == pid:
                    reaped.append(pid)
            except ChildProcessError:
                pass
    return reaped


def _become_subreaper() -> str | None:
    """Linux: orphaned descendants (the template's forked workers) become this process's children.
    Returns why not, or None."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return f"prctl(PR_SET_CHILD_SUBREAPER) failed: {os.strerror(ctypes.get_errno())}"
    except (OSError, AttributeError) as exc:
        return f"prctl unavailable ({exc})"
    return None


def install() -> None:
    """Patch torchrun's ``SubprocessHandler._popen`` to fork workers from a template (unless turned off), and
    make this process a subreaper, which adopts them."""
    if not enabled():
        return
    try:
        from torch.distributed.elastic.multiprocessing.subprocess_handler.subprocess_handler import SubprocessHandler
    except ImportError:
        SubprocessHandler = None  # noqa: N806
    original = getattr(SubprocessHandler, "_popen", None)
    if original is None:
        say("not available with this torch (no SubprocessHandler._popen); torchrun spawns the workers itself")
        return
    if getattr(original, "_jitckpt_patched", False):
        return

    global _pool, _preforked
    _pool = WarmStart(interpreter=sys.executable)
    if _preforked is not None:
        _pool.adopt_template(_preforked)
        _preforked = None
    atexit.register(_close_pool)
    why = _become_subreaper()
    if why:
        _pool.disable(why)
    # (the template was forked by prefork(), or starts with the first workers: torchrun sets OMP_NUM_THREADS in
    # the agent's environment just before, and what libgomp reads when torch loads it must be the workers' own)

    def popen(self: Any, args: tuple[str, ...], env: dict[str, str]) -> Any:
        assert _pool is not None
        return _pool.start_worker(self, args, env, original)

    popen._jitckpt_patched = True  # type: ignore[attr-defined]
    SubprocessHandler._popen = popen
