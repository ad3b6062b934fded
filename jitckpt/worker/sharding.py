"""Which ranks hold the same state, observed from the job's own optimizers (DESIGN decision 2).

Nobody has to tell jitckpt how a job is sharded.  Every optimizer the script
builds is noted at construction (a wrapper around ``Optimizer.__init__``),
and whenever the shard identity is needed (when a checkpoint is selected,
before a JIT save) its parameters are looked at:

- a DTensor parameter (FSDP2 ``fully_shard``, tensor parallelism through
  DTensor, HSDP) lives on a device mesh; the mesh dims its placements do not
  replicate are the dims its state is split along (its optimizer state, a
  DTensor of the same layout, with it);
- a ``ZeroRedundancyOptimizer`` splits the optimizer state over its process
  group: no two members hold the same part;
- plain parameters (DDP) are replicas, within the JITCKPT_TP_SIZE /
  JITCKPT_PP_SIZE layout.

``refresh`` puts the result into ``JitRuntime.coords`` (a
``ParallelCoordinates`` carrying these ``Sharding``s), which the save records
and the selection checks.  Before any optimizer exists the sharding is
unknown, and a checkpoint saved then is its own rank's only.  Reading the
layout is local (mesh tensors, process-group rank tables): no collective.
"""

from __future__ import annotations

import functools
import sys
import weakref
from typing import TYPE_CHECKING, Any

from jitckpt.store.shard import ParallelCoordinates, Sharding, format_ranks
from jitckpt.worker.console import log

if TYPE_CHECKING:
    from jitckpt.worker.runtime import JitRuntime

DTENSOR_STATE = "parameters (FSDP2/DTensor)"
ZERO_STATE = "optimizer state (ZeroRedundancyOptimizer)"

_optimizers: list[weakref.ref] = []
_announced: set[str] = set()


def install() -> None:
    """Note every optimizer constructed from now on (idempotent)."""
    from torch.optim import Optimizer

    original = Optimizer.__init__
    if getattr(original, "_jitckpt_sharding", False):
        return

    @functools.wraps(original)
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        _optimizers[:] = [ref for ref in _optimizers if ref() is not None]
        _optimizers.append(weakref.ref(self))

    init._jitckpt_sharding = True  # type: ignore[attr-defined]
    Optimizer.__init__ = init  # type: ignore[method-assign]


def optimizers() -> list[Any]:
    """The optimizers constructed so far that are still alive, oldest first."""
    return [opt for opt in (ref() for ref in _optimizers) if opt is not None]


def observe(opts: list[Any]) -> set[Sharding]:
    """The shardings of these optimizers' state (see the module docstring)."""
    found: set[Sharding] = set()
    dtensor = sys.modules.get("torch.distributed.tensor")
    dtensor_type = getattr(dtensor, "DTensor", None)
    seen_layouts: set[tuple[int, tuple]] = set()
    for opt in opts:
        if _is_zero(opt):
            found.add(_zero_sharding(opt))
        if dtensor_type is None:
            continue
        for group in opt.param_groups:
            for param in group["params"]:
                if not isinstance(param, dtensor_type):
                    continue
                layout = (id(param.device_mesh), tuple(param.placements))
                if layout not in seen_layouts:
                    seen_layouts.add(layout)
                    found.add(_mesh_sharding(param.device_mesh, param.placements))
    return found


def _is_zero(opt: Any) -> bool:
    return any(cls.__name__ == "ZeroRedundancyOptimizer" and cls.__module__.startswith("torch.distributed.optim")
               for cls in type(opt).__mro__)


def _zero_sharding(opt: Any) -> Sharding:
    import torch.distributed as dist

    group = opt.process_group
    ranks = sorted(dist.get_process_group_ranks(group), key=lambda r: dist.get_group_rank(group, r))
    return Sharding(ZERO_STATE, (len(ranks),), tuple(ranks), (0,))


def _mesh_sharding(mesh: Any, placements: tuple) -> Sharding:
    grid = mesh.mesh
    split = tuple(dim for dim, placement in enumerate(placements) if not placement.is_replicate())
    return Sharding(DTENSOR_STATE, tuple(grid.shape), tuple(int(r) for r in grid.flatten().tolist()), split)


def refresh(rt: "JitRuntime") -> ParallelCoordinates:
    """Observe this rank's shard identity now and store it in ``rt.coords``."""
    opts = optimizers()
    try:
        rt.coords = rt.coords.with_sharding(observe(opts), known=bool(opts))
    except Exception as exc:  # a layout we cannot read: assume no replicas rather than wrong ones
        if "failed" not in _announced:
            _announced.add("failed")
            log(f"could not read how this rank's state is sharded ({type(exc).__name__}: {exc}); "
                f"its checkpoints count as its own rank's only")
        rt.coords = rt.coords.with_sharding((), known=False)
    coords = rt.coords
    if coords.shardings and rt.rank == 0 and coords.shard not in _announced:
        _announced.add(coords.shard)
        others = [r for r in coords.replicas if r != rt.rank]
        copies = f"copies on rank(s) {format_ranks(others)}" if others else "no other rank holds a copy"
        log(f"sharded state: rank 0 holds {coords.describe()}; {copies}")
    return coords
