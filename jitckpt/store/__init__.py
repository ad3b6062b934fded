"""Checkpoint storage: one interface (``base.CheckpointStore``), tiers behind it.

- ``errors``: ``CheckpointError`` and ``CheckpointWarning``, raised by all of them;
- ``shard``: shard identity (``ParallelCoordinates``): which ranks are replicas, a value the interface uses;
- ``base``: the interface (``CheckpointStore``, ``PendingCheckpoint``) and ``CheckpointInfo``;
- ``selection``: which step a restarted rank loads (paper §3.3), for any tier;
- ``disk``: ``DiskStore``, per-rank directories committed atomically with checksummed metadata;
- ``memory``: ``MemoryStore``, the node's memory tier (snapshots of each rank's shard in host memory);
- ``tiered``: ``TieredStore``, several tiers read as one (disk and memory);
- ``parity``: XOR or Reed-Solomon parities of groups of snapshots, and the rebuild of lost ones from them;
- ``isal``: Cauchy Reed-Solomon coding with Intel's ISA-L (loaded when the ``rs`` scheme is used).
"""

from jitckpt.store.base import CheckpointInfo, CheckpointStore
from jitckpt.store.disk import DiskStore, check_writable
from jitckpt.store.errors import CheckpointError, CheckpointWarning
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
