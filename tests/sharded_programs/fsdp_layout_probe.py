"""One process, real FSDP2 on gloo: what a JIT save sees while the model is unsharded (tests/test_fsdp_layout.py).

A forward leaves the root module's parameters unsharded (FSDP2 keeps the
root's after forward, for the backward).  A preemption's save thread then
freezes the layout (``jitckpt.worker.fsdp_layout.freeze``) and must see the
sharded DTensors, with the full tensors' storage left alone; a thread that
tries to swap parameters after that parks.  Prints one ``CHECK name value``
line per fact, then ``DONE``.
"""

import os
import threading

import torch
import torch.distributed as dist
from torch import nn

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "0")


class Runtime:
    """What fsdp_layout asks of jitckpt's worker runtime: the JIT event's park request and the park."""

    def __init__(self) -> None:
        self.park_requested = threading.Event()
        self.parked: list[str] = []

    def park_if_requested(self) -> None:
        if self.park_requested.is_set():
            self.park_forever()

    def park_forever(self) -> None:
        self.parked.append(threading.current_thread().name)
        threading.Event().wait()


def main() -> None:
    store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    from jitckpt.worker import fsdp_layout

    runtime = Runtime()
    fsdp_layout.install(runtime)  # before FSDP2 is imported, as jit-run's worker does
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("shard",))
    fully_shard(model[0], mesh=mesh)
    fully_shard(model, mesh=mesh)  # the root holds model[2]'s parameters
    model(torch.randn(3, 4)).sum()  # forward only: the root stays unsharded
    full = model[2].weight
    print("CHECK unsharded_before", not isinstance(full, DTensor), flush=True)

    runtime.park_requested.set()  # a JIT event; the save thread freezes the layout
    result: dict[str, object] = {}

    def save() -> None:
        result["changed"] = fsdp_layout.freeze()
        state = model.state_dict()
        result["all_dtensor"] = all(isinstance(v, DTensor) for v in state.values())
        result["full_storage_kept"] = full.untyped_storage().nbytes() > 0

    saver = threading.Thread(target=save, name="jitckpt-save")
    saver.start()
    saver.join(30)
    print("CHECK groups_changed", result.get("changed"), flush=True)
    print("CHECK state_dict_sharded", result.get("all_dtensor"), flush=True)
    print("CHECK full_storage_kept", result.get("full_storage_kept"), flush=True)

    swapper = threading.Thread(target=model.unshard, name="training", daemon=True)  # a swap after the freeze
    swapper.start()
    swapper.join(2)
    print("CHECK swap_parked", swapper.is_alive() and runtime.parked == ["training"], flush=True)
    print("CHECK still_sharded", isinstance(model[2].weight, DTensor), flush=True)
    print("DONE", flush=True)
    os._exit(0)  # the parked thread never returns


if __name__ == "__main__":
    main()
