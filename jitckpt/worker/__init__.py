"""Everything that runs inside a training process launched by jit-run.

- ``runtime``: ``JitRuntime``, the minibatch phase, in-flight collectives,
  parking at a safe point, and raising the JIT event (paper §3.1, §3.3);
- ``instrument``: the hooks into PyTorch that feed it (optimizer steps,
  collectives, DDP's gradient all-reduce, the last-resort excepthook);
- ``watchdog``: the Python watchdog thread (hang timeouts, SIGTERM);
- ``save`` and ``resume``: the JIT save and the way back (paper §3.2);
- ``rng_state``: per-rank RNG capture (``private_rng``: the script's own
  generators in it); ``stash``: the host shared-memory
  stash of each rank's own state (RNG, data loaders) per minibatch;
- ``minibatch``: which optimizers make up a minibatch, and whether its
  optimizer phase has applied anything; ``skipped_steps``: GradScaler's
  skipped steps counted;
- ``step_agreement``: every rank resumes from the same step (the job's store);
- ``importhook``: run a function right after a named module is imported;
- ``module_buffers``: BatchNorm statistics rewound to the saved minibatch;
- ``ddp_layout``: DDP's gradient bucket order, kept across a restart;
- ``sharding``: which ranks hold the same state (FSDP2/DTensor, HSDP, ZeRO, DDP);
- ``memory_snapshots``: each rank's shard snapshotted into the node's memory
  tier at every minibatch's start, where it has no copy on another rank;
  ``memory_peers``: in a multi-node job, a copy of each snapshot (or XOR or
  Reed-Solomon parities of groups of them) in other hosts' memory tiers,
  handed over to the shared file system at a JIT event;
- ``standby``: the template interpreter (torch imported) that every worker is forked from;
- ``shutdown``: a clean end of a finished script;
- ``console``: what a worker prints.

jit-run's bootstrap (``_bootstrap/sitecustomize.py``) calls ``arm()`` before
the training script runs; nothing here has effects on import.
"""

from __future__ import annotations

import atexit
import os
from typing import TYPE_CHECKING

from jitckpt import config

if TYPE_CHECKING:
    from jitckpt.worker.runtime import JitRuntime

_runtime: "JitRuntime | None" = None


def current() -> "JitRuntime | None":
    """This worker's runtime if it has been armed, else None."""
    return _runtime


def arm() -> "JitRuntime | None":
    """Create this worker's runtime and install its hooks, watchdog and exit hook (once); None outside jit-run."""
    global _runtime
    if _runtime is None and config.is_active():
        from jitckpt.native import interposer
        from jitckpt.worker import instrument, shutdown
        from jitckpt.worker.runtime import JitRuntime
        from jitckpt.worker.watchdog import CollectiveWatchdog

        rt = JitRuntime()
        _runtime = rt
        # Python subprocesses this worker starts must not arm a second runtime
        # for the same rank (they would overwrite its RNG stash).
        os.environ[config.ENV_ACTIVE] = config.ACTIVE_CLAIMED
        instrument.install(rt)
        watchdog = CollectiveWatchdog(rt)
        watchdog.start()
        # If jit-run preloaded the CUDA/NCCL interposer, its C watchdog raises JIT events here.
        interposer.install_runtime_handler(rt.trigger)
        shutdown.install()
        atexit.register(_at_script_end, rt, watchdog)
    return _runtime


def _at_script_end(rt: "JitRuntime", watchdog: object) -> None:
    """atexit: the training script is over.  Record how it ended and step aside before interpreter teardown."""
    from jitckpt.worker import shutdown

    if rt.jit_event_started():
        rt.park_forever()  # the save thread commits the checkpoint and ends the process
    rt.record_exit()
    # Nothing is left to save.  Dropping the save function also lets the
    # script's globals (which it usually closes over) be finalised as usual.
    rt.save_fn = None
    watchdog.stop()  # type: ignore[attr-defined]
    shutdown.hand_over_to_backend_threads()
