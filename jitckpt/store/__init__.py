"""Checkpoint storage: one interface (``base.CheckpointStore``), tiers behind it.

- ``base``: the interface, ``CheckpointInfo`` and the errors;
- ``shard``: shard identity (``ParallelCoordinates``): which ranks are replicas;
- ``selection``: which step a restarted rank loads (paper §3.3), for any tier;
- ``disk``: ``DiskStore``, per-rank directories committed atomically with checksummed metadata.
"""

from jitckpt.store.base import CheckpointError, CheckpointInfo, CheckpointStore, CheckpointWarning
from jitckpt.store.disk import DiskStore, check_writable
from jitckpt.store.selection import is_complete, select
from jitckpt.store.shard import ParallelCoordinates

__all__ = [
    "CheckpointError",
    "CheckpointInfo",
    "CheckpointStore",
    "CheckpointWarning",
    "DiskStore",
    "ParallelCoordinates",
    "check_writable",
    "is_complete",
    "select",
]
