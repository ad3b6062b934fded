"""A test process-group backend with NCCL's ordering on CPU tensors: see ``backend``.

Select it with ``dist.init_process_group("ncclorder")`` after calling
``register()`` (the test programs take ``--backend ncclorder``).
"""

from __future__ import annotations

from .backend import BACKEND_NAME, NcclOrderProcessGroup, OrderedWork, register

__all__ = ["BACKEND_NAME", "NcclOrderProcessGroup", "OrderedWork", "register"]
