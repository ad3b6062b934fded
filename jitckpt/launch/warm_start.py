"""Warm restart: replacement workers started ahead of time, so a restart skips Python start-up and ``import torch``.

After a failure, most of the time until training resumes is spent starting
fresh interpreters and importing torch in every one of them (DESIGN.md,
decision 3).  jit-run's agent therefore keeps a pool of *standbys*, one per
local rank: interpreters started with the job's environment that have
imported torch, torch.distributed, torch.optim (with torch._dynamo, which the
first optimizer imports) and jitckpt's worker hooks, and then wait on a
socket (``jitckpt.worker.standby``).  torchrun itself is unchanged: its agent,
rendezvous, restarts and teardown all run as before.  Only the place where
its ``SubprocessHandler`` calls ``subprocess.Popen`` for a worker is patched:

- if a ready standby matches, it receives that worker's command line,
  environment, working directory and stdout/stderr descriptors, becomes the
  worker (arming jitckpt, then running the script as ``__main__``), and its
  ``Popen`` object is what torchrun gets;
- otherwise torchrun spawns the worker itself, and the agent says why in
  one line (no standby ready yet, a standby died, the command is not
  ``python -u script`` or ``python -u -m module``, the environment changed).

Standbys are started by the agent with ``subprocess.Popen`` in a new session,
exactly like torchrun's workers, so a warm worker is the agent's own child:
torchrun polls and reaps it, reads its exit code, signals its process group
(SIGTERM, which the worker turns into a JIT save, then SIGKILL), and jit-run
sees its state in ``/proc`` (a SIGSTOPped worker is killed at once).

Why not fork workers from a process that has imported torch?  Forked
children would be that process's children, not the agent's, so torchrun
could not wait for them, and fork after torch has started threads is unsafe:
``import torch`` alone starts an OpenMP thread unless OMP_NUM_THREADS=1, and a
child forked after one parallel operation hung in its first one (torch
2.13, tried here).  Standbys are fresh interpreters that never fork.

The pool refills in the background once the workers have finished their
first minibatch (or a minute after they started), and standbys still
importing are paused while torchrun starts workers, so warming never
competes with a (re)start.  A failure before the pool is
ready restarts those ranks cold.  ``jit-run --warm-restart off``
(``JITCKPT_WARM_RESTART=off``) turns all of this off.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from importlib.util import MAGIC_NUMBER
from pathlib import Path
from typing import IO, Any

from jitckpt import config, eventlog
from jitckpt.console import emit
from jitckpt.worker import standby as wire

STANDBY_MODULE = "jitckpt.worker.standby"
# jit-run's agent changes these in its own environment at every (re)start; a
# standby never has the first (it must not arm) and reads none of them at import.
AGENT_PER_ATTEMPT = frozenset({config.ENV_ACTIVE, config.ENV_WORKER_GENERATION, config.ENV_RENDEZVOUS_ROUND})
HANDOVER_TIMEOUT = 10.0
# Warm standbys this long after a worker group started even if its first minibatch was not logged.
WARM_AFTER_SECONDS = 60.0
POLL_SECONDS = 0.2
MAX_FAILED_STARTS = 3


def say(message: str) -> None:
    emit(f"[jit-run] warm restart: {message}")


def enabled() -> bool:
    return os.environ.get(config.ENV_WARM_RESTART, config.DEFAULT_WARM_RESTART) != "off"


def parse_worker_command(args: tuple[str, ...] | list[str], interpreter: str) -> tuple[str, bool, list[str]] | str:
    """``(target, is_module, sys.argv)`` of torchrun's ``[python, -u, script | -m module, args...]``,
    or why a standby cannot run it."""
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


class _Standby:
    """One standby interpreter and the agent's end of its socket."""

    def __init__(self, popen: subprocess.Popen, sock: socket.socket, env: dict[str, str]) -> None:
        self.popen = popen
        self.sock = sock
        self.env = env  # the environment it was started with
        self.ready = False
        self.ready_at = 0.0
        self.env_read: list[str] = []
        self.paused = False

    def signal(self, sig: int) -> None:
        try:
            os.kill(self.popen.pid, sig)
        except ProcessLookupError:
            pass  # (exited; reaped by the pool thread)

    def discard(self) -> None:
        """Close the socket, kill it if it is still running, and reap it."""
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


class StandbyPool:
    """Standby interpreters for the workers of one agent (see the module docstring).

    The agent's main thread calls :meth:`start_worker` from torchrun's
    ``SubprocessHandler``; a background
    thread starts standbys, collects their "ready" messages and notices
    standbys that died.  All socket reads happen under ``_lock``, and a standby
    is removed from the pool (under the lock) before it is handed a worker.
    """

    def __init__(self, interpreter: str) -> None:
        self.interpreter = interpreter
        self.size = 0  # local world size, learned from the first worker group
        self.generation = -1
        self.disabled: str | None = None
        self._standbys: list[_Standby] = []
        self._lock = threading.Lock()
        self._group_pids: dict[int, int] = {}
        self._group_started = time.monotonic()
        self._trained: set[int] = set()
        self.cold: list[tuple[int, str]] = []  # (local rank, why) of this group's cold starts
        self._failed_starts = 0
        self._closed = False
        # Standbys die with this thread (PR_SET_PDEATHSIG), so it lives as long as the agent.
        self._thread = threading.Thread(target=self._maintain, name="jitckpt-standby-pool", daemon=True)
        self._thread.start()

    # ----- called by torchrun's SubprocessHandler (agent main thread) --------------------

    def start_worker(self, handler: Any, args: tuple[str, ...], env: dict[str, str], spawn: Any) -> subprocess.Popen:
        """torchrun's ``SubprocessHandler._popen``: a standby's Popen, or ``spawn(handler, args, env)``'s."""
        local_rank = handler.local_rank_id
        if local_rank == 0:
            self.new_group()
        proc = None
        if self.generation == 0 and local_rank == 0:  # (the first group has no standbys yet)
            command = parse_worker_command(args, self.interpreter)
            if isinstance(command, str):
                self.disable(command)
        elif self.generation > 0 and not self.disabled:
            try:
                proc, why = self.launch(args, env, handler._stdout, handler._stderr, local_rank)
            except Exception as exc:  # (another torch's SubprocessHandler, a bug): never worse than cold
                self.disable(f"internal error {type(exc).__name__}: {exc}")
                proc, why = None, str(exc)
            if proc is None:
                eventlog.record("warm_fallback", local_rank=local_rank, reason=why)
                if not self.disabled:  # (disable() has said why, once)
                    self.cold.append((local_rank, why))
            if local_rank == self.size - 1 and self.cold:  # one line per group
                ranks = ", ".join(str(r) for r, _ in self.cold)
                reasons = "; ".join(dict.fromkeys(why for _, why in self.cold))
                say(f"local rank{'s' if len(self.cold) > 1 else ''} {ranks} of {self.size} start cold: {reasons}")
        if proc is None:
            proc = spawn(handler, args, env)
        self.note_worker(local_rank, proc.pid)
        return proc

    def new_group(self) -> None:
        """torchrun is starting a new group of workers (local rank 0 comes first).

        Standbys still importing are paused (SIGSTOP) until the new workers train, so
        that they do not slow a cold (re)start down; ready ones are idle anyway."""
        self.generation += 1
        self._group_pids = {}
        self._trained = set()
        self._group_started = time.monotonic()
        self.cold = []
        with self._lock:
            for standby in self._standbys:
                if not standby.ready and not standby.paused:
                    standby.signal(signal.SIGSTOP)
                    standby.paused = True

    def note_worker(self, local_rank: int, pid: int) -> None:
        self._group_pids[local_rank] = pid
        self.size = max(self.size, local_rank + 1)

    def launch(self, args: tuple[str, ...], env: dict[str, str], stdout: IO | None, stderr: IO | None,
               local_rank: int) -> tuple[subprocess.Popen | None, str]:
        """Hand worker ``local_rank`` to a standby: its Popen, or None and why not."""
        command = parse_worker_command(args, self.interpreter)
        if isinstance(command, str):
            self.disable(command)
            return None, command
        target, is_module, argv = command
        standby, why = self._take(env)
        if standby is None:
            return None, why
        job = {"argv": argv, "orig_argv": list(args), "env": env, "cwd": os.getcwd(), "module": is_module, "target": target}
        fds = [stdout.fileno() if stdout else 1, stderr.fileno() if stderr else 2]
        pid = standby.popen.pid
        try:
            standby.sock.settimeout(HANDOVER_TIMEOUT)
            wire.send_message(standby.sock, job, fds)
            reply, _ = wire.recv_message(standby.sock)
            if not reply.get("started"):
                raise ValueError(f"unexpected reply {reply}")
        except (OSError, EOFError, ValueError) as exc:
            standby.discard()
            eventlog.record("standby_lost", standby_pid=pid, during="hand-over", error=str(exc))
            return None, f"standby pid {pid} failed during the hand-over ({type(exc).__name__})"
        standby.sock.close()
        standby.popen.args = list(args)
        eventlog.record("warm_handover", local_rank=local_rank, worker_pid=pid,
                        idle_seconds=round(time.monotonic() - standby.ready_at, 3))
        return standby.popen, ""

    def disable(self, reason: str) -> None:
        """Stop warming (for the rest of the job) and say why, once."""
        if self.disabled is None:
            self.disabled = reason
            say(f"off for this job: {reason}; torchrun spawns the workers itself")
            eventlog.record("warm_restart_off", reason=reason)
            self.close(stop_thread=False)

    def close(self, stop_thread: bool = True) -> None:
        """Kill and reap every standby not handed out (at the agent's exit)."""
        self._closed = self._closed or stop_thread
        with self._lock:
            standbys, self._standbys = self._standbys, []
        for standby in standbys:
            standby.discard()

    # ----- choosing a standby ------------------------------------------------------------

    def _take(self, env: dict[str, str]) -> tuple[_Standby | None, str]:
        lost = []
        try:
            with self._lock:
                if self.disabled:
                    return None, self.disabled
                agent_env = _environ_snapshot()
                for standby in [s for s in self._standbys if s.ready]:
                    self._standbys.remove(standby)
                    if standby.popen.poll() is not None:
                        lost.append((standby, f"exited with status {standby.popen.returncode}"))
                        continue
                    changed = sorted(k for k in set(standby.env) | set(agent_env)
                                     if k not in AGENT_PER_ATTEMPT and standby.env.get(k) != agent_env.get(k))
                    if changed:
                        lost.append((standby, f"the agent's environment changed since it started ({', '.join(changed[:3])})"))
                        continue
                    per_rank = [k for k in standby.env_read if k not in AGENT_PER_ATTEMPT and env.get(k) != standby.env.get(k)]
                    if per_rank:
                        self._standbys.append(standby)  # (disabled below: every standby would read them)
                        why = "importing torch read the workers' own environment variables " + ", ".join(per_rank[:3])
                        break
                    return standby, ""
                else:
                    warming = len(self._standbys)
                    why = "no standby ready" + (f" ({warming} still warming)" if warming else "")
        finally:
            for standby, reason in lost:
                eventlog.record("standby_lost", standby_pid=standby.popen.pid, during="idle", error=reason)
                standby.discard()
        if why.startswith("importing"):
            self.disable(why)
        elif lost:
            why = f"standby pid {lost[-1][0].popen.pid} {lost[-1][1]}; " + why
        return None, why

    # ----- the background thread -----------------------------------------------------------

    def _maintain(self) -> None:
        while not self._closed:
            try:
                self._collect()
                self._resume_paused()
                for _ in range(self._missing()):
                    self._spawn()
            except Exception as exc:  # the pool must never take the agent down
                self.disable(f"internal error {type(exc).__name__}: {exc}")
            time.sleep(POLL_SECONDS)

    def _collect(self) -> None:
        """Read "ready" messages; drop standbys that died."""
        dead = []
        with self._lock:
            socks = [s.sock for s in self._standbys]
            readable = set(select.select(socks, [], [], 0)[0]) if socks else set()
            for standby in [s for s in self._standbys if s.sock in readable]:
                message: dict[str, Any] = {}
                try:
                    standby.sock.settimeout(5.0)
                    message, _ = wire.recv_message(standby.sock)
                except (OSError, EOFError, ValueError):
                    pass
                if message.get("ready") and not standby.ready:
                    standby.ready, standby.ready_at, standby.env_read = True, time.monotonic(), message.get("env_read", [])
                    if standby.paused:  # (paused just after it sent "ready": an idle standby takes no CPU)
                        standby.signal(signal.SIGCONT)
                        standby.paused = False
                    self._failed_starts = 0
                    eventlog.record("standby_ready", standby_pid=standby.popen.pid, seconds=message.get("seconds"),
                                    env_scanned_by=message.get("env_scanned_by", []))
                else:  # EOF: it died (an idle standby sends nothing else)
                    self._standbys.remove(standby)
                    dead.append(standby)
        for standby in dead:
            standby.discard()
            if not standby.ready:
                self._failed_starts += 1
                if self._failed_starts >= MAX_FAILED_STARTS:
                    self.disable(f"{MAX_FAILED_STARTS} standbys in a row exited while starting "
                                 f"(last status {standby.popen.returncode}; their errors are above)")
            eventlog.record("standby_lost", standby_pid=standby.popen.pid, during="idle" if standby.ready else "start",
                            error=f"exited with status {standby.popen.returncode}")

    def _resume_paused(self) -> None:
        with self._lock:
            paused = [s for s in self._standbys if s.paused]
        if paused and self._group_training():
            for standby in paused:
                standby.signal(signal.SIGCONT)
                standby.paused = False

    def _missing(self) -> int:
        """How many standbys to start now: the pool refills all at once, while no standby is starting
        and once the current workers are training."""
        if self.disabled or self._closed or self.generation < 0:
            return 0
        with self._lock:
            if any(not s.ready for s in self._standbys):
                return 0
            missing = self.size - len(self._standbys)
        return missing if missing > 0 and self._group_training() else 0

    def _group_training(self) -> bool:
        """True once every worker of the current group has logged its first minibatch (or after a while)."""
        if time.monotonic() - self._group_started >= WARM_AFTER_SECONDS:
            return True
        run_dir = os.environ.get(config.ENV_RUN_DIR)
        pids = set(self._group_pids.values())
        if not run_dir or not pids:
            return False
        for pid in pids - self._trained:
            for log in (Path(run_dir) / "events").glob(f"{pid}-*.jsonl"):
                try:
                    if '"first_step_done"' in log.read_text(errors="replace"):
                        self._trained.add(pid)
                except OSError:
                    pass
        return pids <= self._trained

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair()
        env = _environ_snapshot()
        env.pop(config.ENV_ACTIVE, None)  # the bootstrap must not arm a runtime in a standby
        cmd = [self.interpreter, "-u", "-m", STANDBY_MODULE, "--fd", str(theirs.fileno()), "--parent", str(os.getpid())]
        try:
            popen = subprocess.Popen(cmd, env=env, pass_fds=(theirs.fileno(),), start_new_session=True)
        except OSError as exc:
            ours.close()
            self.disable(f"cannot start a standby: {exc}")
            return
        finally:
            theirs.close()
        with self._lock:
            self._standbys.append(_Standby(popen, ours, env))


_pool: StandbyPool | None = None


def _close_pool() -> None:
    if _pool is not None:
        _pool.close()


def install() -> None:
    """Patch torchrun's ``SubprocessHandler._popen`` to take workers from a standby pool (unless turned off)."""
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

    def popen(self: Any, args: tuple[str, ...], env: dict[str, str]) -> subprocess.Popen:
        global _pool
        if _pool is None:
            _pool = StandbyPool(interpreter=sys.executable)
            atexit.register(_close_pool)
        return _pool.start_worker(self, args, env, original)

    popen._jitckpt_patched = True  # type: ignore[attr-defined]
    SubprocessHandler._popen = popen
