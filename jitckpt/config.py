"""Environment variable names and defaults shared by jit-run and the workers.

Every knob jitckpt reads from the environment is named here once, so that the
launcher, the workers and the docs agree on the spelling.
"""

from __future__ import annotations

import os

from jitckpt.validate import positive_number

# Set by jit-run in every worker's environment; the library is a no-op without it.
ENV_ACTIVE = "JITCKPT_ACTIVE"
# Value of ENV_ACTIVE in the torchrun agent itself, which must not arm a runtime.
ACTIVE_IN_AGENT = "agent"
# Value a worker sets once its runtime exists, so that its own subprocesses stay inactive.
ACTIVE_CLAIMED = "claimed"
# Cluster-admin switch: JITCKPT_ENABLE=0 turns jit-run into a plain pass-through.
ENV_ENABLE = "JITCKPT_ENABLE"
ENV_CHECKPOINT_DIR = "JITCKPT_CHECKPOINT_DIR"
ENV_HANG_TIMEOUT = "JITCKPT_HANG_TIMEOUT"
ENV_SAVE_GRACE = "JITCKPT_SAVE_GRACE"
# Seconds a worker waits for every other rank's choice of checkpoint step
# (jitckpt.worker.step_agreement) before giving up with an error naming the missing ranks.
ENV_AGREEMENT_TIMEOUT = "JITCKPT_AGREEMENT_TIMEOUT"
ENV_FAULT = "JITCKPT_FAULT"
ENV_REPORT = "JITCKPT_REPORT"
# Per-job scratch: event logs of every worker attempt, read back for the report.
ENV_RUN_DIR = "JITCKPT_RUN_DIR"
# Host shared-memory directory where every rank stashes its RNG state each minibatch.
ENV_SHM_DIR = "JITCKPT_SHM_DIR"
# "auto"/"on"/"off" (jit-run --memory-tier): per-minibatch snapshots of each rank's shard in host memory
# (jitckpt.worker.memory_snapshots); "auto" takes them when some rank's state has no replica (FSDP2, ZeRO).
ENV_MEMORY_TIER = "JITCKPT_MEMORY_TIER"
# Multi-node jobs (jit-run --memory-redundancy): how the memory tier covers a lost host
# (jitckpt.worker.memory_peers): "replicate" (a copy on the next node), "xor" (one parity per group of
# JITCKPT_MEMORY_GROUP nodes, default the number of nodes less one, at most 8) or "rs" (JITCKPT_MEMORY_PARITIES
# Reed-Solomon parities, default 2, per group of JITCKPT_MEMORY_GROUP nodes, default the nodes less those, at most 8).
ENV_MEMORY_REDUNDANCY = "JITCKPT_MEMORY_REDUNDANCY"
ENV_MEMORY_GROUP = "JITCKPT_MEMORY_GROUP"
ENV_MEMORY_PARITIES = "JITCKPT_MEMORY_PARITIES"
# replicate: how many copies of each snapshot, on the next nodes of the ring (default 1)
ENV_MEMORY_COPIES = "JITCKPT_MEMORY_COPIES"
# Set by jit-run's agent for its workers: the rendezvous round they were started
# in, which every node of the job agrees on (restart counts can differ by node).
ENV_RENDEZVOUS_ROUND = "JITCKPT_RENDEZVOUS_ROUND"
# Set by jit-run's agent: how many times it has started its workers before
# (0 for the first start).  Unlike TORCHELASTIC_RESTART_COUNT it also counts a
# restart caused by another node leaving or joining the rendezvous.
ENV_WORKER_GENERATION = "JITCKPT_WORKER_GENERATION"
ENV_INTERPOSE = "JITCKPT_INTERPOSE"
# "on"/"off": workers are forked from a template interpreter that has already imported torch (jitckpt.launch.warm_start).
ENV_WARM_RESTART = "JITCKPT_WARM_RESTART"
ENV_TP_SIZE = "JITCKPT_TP_SIZE"
ENV_PP_SIZE = "JITCKPT_PP_SIZE"
ENV_ALLOW_WORLD_SIZE_CHANGE = "JITCKPT_ALLOW_WORLD_SIZE_CHANGE"
# "1" (jit-run --allow-inexact-resume): a resume known not to repeat the fault-free run
# (a rank's own per-rank state lost) goes on, and the report says "not bit-exact"; else the job stops.
ENV_ALLOW_INEXACT_RESUME = "JITCKPT_ALLOW_INEXACT_RESUME"
# Transparent mode (jit-run --transparent): "1" in every worker's environment.
ENV_TRANSPARENT = "JITCKPT_TRANSPARENT"
# The interpreter transparent mode's remote library runs the recovery rendezvous with.
ENV_PYTHON = "JITCKPT_PYTHON"
# Seconds transparent mode's recovery rendezvous may take (jitckpt.transparent.rendezvous).
ENV_TRANSPARENT_RDZV_TIMEOUT = "JITCKPT_TRANSPARENT_RDZV_TIMEOUT"

DEFAULT_CHECKPOINT_DIR = "./jit-checkpoints"
DEFAULT_HANG_TIMEOUT = 60.0
DEFAULT_SAVE_GRACE = 60.0
DEFAULT_AGREEMENT_TIMEOUT = 300.0
DEFAULT_WARM_RESTART = "on"
DEFAULT_MEMORY_TIER = "auto"
MEMORY_TIER_MODES = ("auto", "on", "off")
DEFAULT_MEMORY_REDUNDANCY = "replicate"
MEMORY_REDUNDANCY_SCHEMES = ("replicate", "xor", "rs")

# Exit status of a worker that completed its just-in-time save (EX_TEMPFAIL:
# "temporary failure, retry"); never 0, so torchrun's agent restarts the group.
JIT_SAVED_EXIT_CODE = 75
# Exit status of a worker whose JIT save failed or could not reach a safe point.
JIT_SAVE_FAILED_EXIT_CODE = 76
# Exit status of a worker that refused a resume known not to be bit-exact (DESIGN decision 15):
# jit-run's agent stops the job on it instead of restarting, since every restart would meet the same.
RESUME_REFUSED_EXIT_CODE = 77
# jit-run's own exit status when it stopped the job because resuming would not have repeated the
# fault-free run (a rank refused, above): distinct from a failed job (torchrun's status, usually 1),
# so that a scheduler's requeue or retry wrapper does not rerun into the same stop.
JOB_STOPPED_EXIT_CODE = 77


def env_float(name: str, default: float) -> float:
    """Read a positive, finite number of seconds from the environment, with a clear error on nonsense."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return positive_number(raw, name)


def is_active() -> bool:
    """True inside a worker launched by jit-run."""
    return os.environ.get(ENV_ACTIVE) == "1"
