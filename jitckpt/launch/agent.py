"""torchrun's elastic agent, with the changes jit-run needs (run as ``python -m jitckpt.launch.agent``).

jit-run builds on torchrun rather than beside it: rendezvous (c10d, etcd),
``--max-restarts``, multi-node membership and node exclusion all stay
torchrun's.  This module runs ``torch.distributed.run.main`` with seven small
patches to its ``LocalElasticAgent`` and process context:

1. **Grace period.**  When one worker exits, torchrun tears down all local
   workers (SIGTERM, then SIGKILL after a timeout).  Healthy workers turn that
   SIGTERM into a JIT save, so the timeout becomes ``--save-grace`` (in place
   of torchrun's ``--shutdown-timeout``).  torchrun has several teardown
   paths, and all of them end in ``PContext.close``, so that is what is
   patched: ``SubprocessContext._poll`` (and ``MultiprocessContext._poll``)
   calls ``self.close()`` with its own 30 s default as soon as a worker fails;
   ``LocalElasticAgent._shutdown`` calls it from ``_stop_workers`` (restart
   after a failure or a membership change, giving up after
   ``--max-restarts``, a worker stuck in D-state) and from ``run`` (the
   SIGTERM/SIGINT/SIGHUP/SIGQUIT handlers torchrun installs raise
   ``SignalException`` there, and its ``finally``).
2. **Frozen workers.**  A worker stopped by SIGSTOP (a hung node, in tests)
   cannot save and cannot act on SIGTERM; on every teardown path (the same
   ``PContext.close``) it is killed as soon as it is seen stopped, at the
   start or during the grace period (one that freezes in its own save),
   instead of holding the teardown for the whole grace period.  Outside a
   teardown, a worker stopped for twice the hang timeout is killed too: its
   peers would have met it in a collective by then, unless none is left to
   wait for it (they finished the job while it froze in its last minibatch,
   after the last collective), which would otherwise hold torchrun forever.
3. **Events.**  Worker failures and restarts are written to the job's event
   log for the recovery report.
4. **Crashes after a finished script.**  A worker whose training script
   ended successfully (recorded by jitckpt.worker.shutdown at exit) and that then
   dies from a signal during interpreter teardown has finished its work.
   torchrun would count it as a failure, SIGTERM the other workers and redo
   the job from the last JIT checkpoint; the agent counts it as finished
   instead, and the report lists it.
5. **A refused resume stops the job.**  A worker that refuses a resume known
   not to be bit-exact (``jitckpt.worker.resume.inexact_resume``) records a
   ``resume_refused`` event and exits with ``RESUME_REFUSED_EXIT_CODE``;
   every restart would meet the same, so the agent spends no restart on it
   and lets torchrun stop the workers and fail.  The exit status alone is
   not enough: a script may exit with 77 itself, which is a failure like
   any other.
6. **Rendezvous round and generation.**  The workers learn the c10d
   rendezvous round they were started in, which all nodes agree on, and use
   it to namespace their process-group store (see
   ``jitckpt.worker.instrument._give_each_attempt_its_own_store``).  They also learn how
   often this agent has started workers: torchrun does not count a restart
   that another node's failure or arrival caused, and the recovery report
   needs every one.
7. **The workers' port.**  Every rendezvous round, rank 0's agent picks the
   ``MASTER_PORT`` its workers' store will listen on with torch's
   ``get_free_port``: a port the kernel hands out for binding to port 0,
   from the ephemeral range, released until rank 0's worker binds it.  Any
   outgoing connection on the host (another job's, a data loader's) may be
   given that very port as its local one meanwhile; rank 0 then fails in
   ``init_process_group`` with EADDRINUSE and the attempt is lost (seen in
   this project's CI, with tests side by side).  The agent picks a free port
   below the ephemeral range instead (``free_port``; torchrun's default
   master port, 29500, is there too), which the kernel never hands out on
   its own.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from jitckpt import config, eventlog
from jitckpt.console import emit


def _process_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def _teardown_timeout() -> float:
    """Patch 1: seconds a teardown waits between SIGTERM and SIGKILL: jit-run's --save-grace."""
    return config.env_float(config.ENV_SAVE_GRACE, config.DEFAULT_SAVE_GRACE)


def _kill_frozen_workers(pcontext: Any, stopped_since: dict[int, float] | None = None, after: float = 0.0) -> None:
    """Patch 2: SIGKILL every worker of ``pcontext`` that is stopped (state T), and record it.

    With ``stopped_since`` (pid -> when it was first seen stopped), only those stopped for ``after`` seconds.
    """
    try:
        pids = pcontext.pids()
    except AssertionError:  # MultiprocessContext before start(): nothing to kill
        return
    now = time.monotonic()
    for local_rank, pid in pids.items():
        if _process_state(pid) != "T":
            if stopped_since is not None:
                stopped_since.pop(pid, None)
            continue
        if stopped_since is not None and now - stopped_since.setdefault(pid, now) < after:
            continue
        rank = getattr(pcontext, "envs", {}).get(local_rank, {}).get("RANK")
        eventlog.record("worker_frozen_killed", rank=None if rank is None else int(rank), worker_pid=pid,
                        seconds=round(now - stopped_since[pid], 1) if stopped_since is not None else None)
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class _FrozenWatch:
    """During a teardown's grace period: kill a worker that freezes while the others save (patch 2)."""

    def __init__(self, pcontext: Any) -> None:
        import threading

        self._pcontext = pcontext
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="jitckpt-frozen-watch", daemon=True)

    def __enter__(self) -> "_FrozenWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            _kill_frozen_workers(self._pcontext)


def _patch_teardown() -> None:
    """Patches 1 and 2 on ``PContext.close``, where every torchrun teardown path ends."""
    from torch.distributed.elastic.multiprocessing.api import PContext

    original_close = getattr(PContext, "close", None)
    if original_close is None:
        emit("[jit-run] warning: this torch has no PContext.close; torchrun's own teardown timeout applies "
             "(--save-grace and the killing of frozen workers are not in effect)")
        return
    if getattr(original_close, "_jitckpt_patched", False):
        return

    def close(self: Any, death_sig: signal.Signals | None = None, timeout: int = 30) -> None:
        # ``timeout`` is torchrun's (30 s, --shutdown-timeout or a caller's default): --save-grace replaces it.
        _kill_frozen_workers(self)
        with _FrozenWatch(self):
            original_close(self, death_sig, _teardown_timeout())  # type: ignore[arg-type]

    close._jitckpt_patched = True  # type: ignore[attr-defined]
    PContext.close = close  # type: ignore[method-assign]


_PORT_FLOOR = 10000  # the lowest port free_port picks (well above the registered services people run)


def _port_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int] | None:
    """The host's ephemeral port range (Linux), or None where it cannot be read."""
    try:
        low, high = (int(word) for word in open(path).read().split())
        return low, high
    except (OSError, ValueError):
        return None


def free_port(tries: int = 64) -> int:
    """Patch 7: a port free to listen on now, outside the ephemeral range (torch's ``get_free_port`` where that
    range leaves none below it, or it cannot be read, or no port there is free)."""
    import errno
    import random
    import socket

    from torch.distributed.elastic.utils.distributed import get_free_port

    ephemeral = _port_range()
    if ephemeral is None or ephemeral[0] <= _PORT_FLOOR + 1000:
        return get_free_port()
    pick = random.Random()
    for _ in range(tries):
        port = pick.randrange(_PORT_FLOOR, ephemeral[0])
        free = True
        for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
            try:
                with socket.socket(family, socket.SOCK_STREAM) as probe:
                    probe.bind((host, port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE or family == socket.AF_INET:
                    free = False
                    break  # (no IPv6 on the host: the IPv4 bind decides)
        if free:
            return port
    return get_free_port()


def patch_agent() -> None:
    """Install the patches on torchrun's LocalElasticAgent and its process context."""
    from torch.distributed.elastic.agent.server import api as agent_api
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.rendezvous import api as rendezvous_api

    if hasattr(rendezvous_api, "get_free_port"):  # patch 7 (another torch version: torchrun's own choice)
        rendezvous_api.get_free_port = free_port

    original_monitor = LocalElasticAgent._monitor_workers
    original_restart = agent_api.SimpleElasticAgent._restart_workers

    def monitor(self: Any, worker_group: Any) -> Any:
        result = original_monitor(self, worker_group)
        from jitckpt.launch import warm_start

        warm_start.reap_now_and_then()  # (the orphans this agent adopts as a subreaper)
        pcontext = getattr(self, "_pcontext", None)
        if not result.failures and pcontext is not None:  # patch 2: frozen with no peer left to notice
            hang = config.env_float(config.ENV_HANG_TIMEOUT, config.DEFAULT_HANG_TIMEOUT)
            _kill_frozen_workers(pcontext, self.__dict__.setdefault("_jitckpt_stopped_since", {}), 2 * hang)
        if result.failures:
            seen = self.__dict__.setdefault("_jitckpt_reported", set())
            for rank, failure in result.failures.items():
                key = (self._remaining_restarts, rank)
                if key not in seen:
                    seen.add(key)
                    eventlog.record(
                        "worker_failed",
                        rank=rank,
                        exitcode=failure.exitcode,
                        worker_pid=failure.pid,
                        restarts_left=self._remaining_restarts,
                    )
            refused = sorted(rank for rank, failure in result.failures.items()
                             if failure.exitcode == config.RESUME_REFUSED_EXIT_CODE and _refused_resume(failure.pid))
            if refused and self._remaining_restarts > 0:  # patch 5
                emit(f"[jit-run] rank{'s' if len(refused) > 1 else ''} {', '.join(map(str, refused))} refused to "
                     f"resume (the resume would not be bit-exact; the reason is above): stopping the job, no restart")
                self._remaining_restarts = 0
        return result

    original_rendezvous = agent_api.SimpleElasticAgent._rendezvous

    def rendezvous(self: Any, worker_group: Any) -> None:
        # Every worker (re)start goes through a rendezvous: count them.
        generation = self.__dict__.get("_jitckpt_generation", -1) + 1
        self._jitckpt_generation = generation
        os.environ[config.ENV_WORKER_GENERATION] = str(generation)
        original_rendezvous(self, worker_group)
        state = getattr(getattr(worker_group.spec.rdzv_handler, "_state_holder", None), "state", None)
        if isinstance(getattr(state, "round", None), int):
            os.environ[config.ENV_RENDEZVOUS_ROUND] = str(state.round)  # workers inherit it

    def restart(self: Any, worker_group: Any) -> None:
        eventlog.record("restart_begin", restarts_left=self._remaining_restarts)
        original_restart(self, worker_group)
        eventlog.record("restart_done")

    _patch_teardown()
    _forgive_crashes_after_finished_scripts()
    LocalElasticAgent._monitor_workers = monitor
    agent_api.SimpleElasticAgent._restart_workers = restart
    agent_api.SimpleElasticAgent._rendezvous = rendezvous


def _refused_resume(pid: int) -> bool:
    """True if worker ``pid`` recorded that it refused a resume (not merely exited with the same status)."""
    run_dir = os.environ.get(config.ENV_RUN_DIR)
    if not run_dir:
        return False
    return any(event["event"] == "resume_refused" and event.get("pid") == pid for event in eventlog.read_all(run_dir))


def _forgive_crashes_after_finished_scripts() -> None:
    """Patch 4: a signal death after the script succeeded is not a worker failure."""
    from torch.distributed.elastic.multiprocessing.api import SubprocessContext

    original_capture = getattr(SubprocessContext, "_capture_process_failures", None)
    if original_capture is None or getattr(original_capture, "_jitckpt_patched", False):
        return  # (another torch version: torchrun's own rule applies)

    def capture_process_failures(self: Any, done_local_ranks: set[int]) -> None:
        original_capture(self, done_local_ranks)
        run_dir = os.environ.get(config.ENV_RUN_DIR)
        if not run_dir:
            return
        finished = {
            local_rank: eventlog.successful_exit(run_dir, failure.pid) if failure.exitcode < 0 else None
            for local_rank, failure in self._failures.items()
        }
        if not finished or None in finished.values():
            return  # a real failure: the others' exits (e.g. torchrun's SIGTERM) are bookkeeping, not crashes
        for local_rank, worker_exit in finished.items():
            failure = self._failures.pop(local_rank)
            rank = worker_exit.get("rank")
            eventlog.record("worker_crashed_after_finishing", rank=rank, attempt=worker_exit.get("attempt"),
                          worker_pid=failure.pid, signal=-failure.exitcode)
            emit(f"[jit-run] worker pid {failure.pid} (local rank {local_rank}, rank {rank}) finished its script, then died "
                 f"from signal {-failure.exitcode} during interpreter shutdown; counted as finished, not as a failure")

    capture_process_failures._jitckpt_patched = True  # type: ignore[attr-defined]
    SubprocessContext._capture_process_failures = capture_process_failures


def main(argv: list[str]) -> int:
    """Run torchrun with the jit-run patches; returns its exit status."""
    from jitckpt.launch import warm_start

    warm_start.prefork(argv)  # (first: it imports torch and forks the workers' template before any thread starts)
    patch_agent()
    warm_start.install()  # workers are forked from a template that imported torch (--warm-restart)
    os.environ[config.ENV_ACTIVE] = "1"  # workers inherit it; this process stays inactive
    from torch.distributed.run import main as torchrun_main

    started = time.time()
    try:
        torchrun_main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except Exception as exc:  # ChildFailedError after --max-restarts is exhausted
        emit(f"[jit-run] torchrun gave up: {type(exc).__name__}")
        code = 1
    else:
        code = 0
    eventlog.record("agent_done", exitcode=code, seconds=time.time() - started)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
