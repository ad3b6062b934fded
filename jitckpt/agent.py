"""torchrun's elastic agent, with the changes jit-run needs (run as ``python -m jitckpt.agent``).

jit-run builds on torchrun rather than beside it: rendezvous (c10d, etcd),
``--max-restarts``, multi-node membership and node exclusion all stay
torchrun's.  This module runs ``torch.distributed.run.main`` with three small
patches to its ``LocalElasticAgent``:

1. **Grace period.**  When one worker exits, the agent tears down all local
   workers (SIGTERM, then SIGKILL after a timeout).  Healthy workers turn that
   SIGTERM into a JIT save, so the timeout becomes ``--save-grace``.
2. **Frozen workers.**  A worker stopped by SIGSTOP (a hung node, in tests)
   cannot save and cannot act on SIGTERM; it is killed at once instead of
   holding the teardown for the whole grace period.
3. **Events.**  Worker failures and restarts are written to the job's event
   log for the recovery report.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from typing import Any

from jitckpt import config, events


def _process_state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def patch_agent() -> None:
    """Install the three patches on torchrun's LocalElasticAgent."""
    from torch.distributed.elastic.agent.server import api as agent_api
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent

    grace = config.env_float(config.ENV_SAVE_GRACE, config.DEFAULT_SAVE_GRACE)
    original_shutdown = LocalElasticAgent._shutdown
    original_monitor = LocalElasticAgent._monitor_workers
    original_restart = agent_api.SimpleElasticAgent._restart_workers

    def shutdown(self: Any, death_sig: signal.Signals = signal.SIGTERM, timeout: int = 30) -> None:
        pcontext = getattr(self, "_pcontext", None)
        if pcontext is not None:
            group = getattr(self, "_worker_group", None)
            by_pid = {w.id: w.global_rank for w in group.workers} if group is not None else {}
            for pid in pcontext.pids().values():
                if _process_state(pid) == "T":
                    events.record("worker_frozen_killed", rank=by_pid.get(pid), worker_pid=pid)
                    os.kill(pid, signal.SIGKILL)
        original_shutdown(self, death_sig, max(timeout, int(grace + 1)))

    def monitor(self: Any, worker_group: Any) -> Any:
        result = original_monitor(self, worker_group)
        if result.failures:
            seen = self.__dict__.setdefault("_jitckpt_reported", set())
            for rank, failure in result.failures.items():
                key = (self._remaining_restarts, rank)
                if key not in seen:
                    seen.add(key)
                    events.record(
                        "worker_failed",
                        rank=rank,
                        exitcode=failure.exitcode,
                        worker_pid=failure.pid,
                        restarts_left=self._remaining_restarts,
                    )
        return result

    def restart(self: Any, worker_group: Any) -> None:
        events.record("restart_begin", restarts_left=self._remaining_restarts)
        original_restart(self, worker_group)
        events.record("restart_done")

    LocalElasticAgent._shutdown = shutdown
    LocalElasticAgent._monitor_workers = monitor
    agent_api.SimpleElasticAgent._restart_workers = restart


def main(argv: list[str]) -> int:
    """Run torchrun with the jit-run patches; returns its exit status."""
    patch_agent()
    os.environ[config.ENV_ACTIVE] = "1"  # workers inherit it; this process stays inactive
    from torch.distributed.run import main as torchrun_main

    started = time.time()
    try:
        torchrun_main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except Exception as exc:  # ChildFailedError after --max-restarts is exhausted
        print(f"[jit-run] torchrun gave up: {type(exc).__name__}", file=sys.stderr, flush=True)
        code = 1
    else:
        code = 0
    events.record("agent_done", exitcode=code, seconds=time.time() - started)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
