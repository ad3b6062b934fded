"""One rank of a data-parallel loop whose all-reduce hangs, driven from Python.

Used by tests/test_interpose.py.  It runs under LD_PRELOAD=libjitckpt_interpose.so
on the CPU device emulator, the way a PyTorch worker would: the CUDA runtime
and NCCL are shared libraries loaded into the interpreter (here with ctypes,
RTLD_GLOBAL), and every call goes through the global symbol scope, where the
preloaded interposer comes first.

Each round: ncclAllReduce on a non-blocking NCCL stream, cudaEventRecord on
it, cudaStreamWaitEvent of the legacy default stream (PyTorch's default
compute stream) on that event, a copy back on the default stream, and a host
wait.  With JITCKPT_SIMDEV_FAULT=rank=1,op=ncclAllReduce,call=3,kind=hang the
third round never completes on any rank; the interposer's watchdog must raise
a JIT event and call the save registered with jitckpt.native.interposer.install().

How the main thread waits (argv[1]):
  release  cudaStreamSynchronize through ctypes.CDLL (releases the GIL)
  hold     cudaStreamSynchronize through ctypes.PyDLL (keeps the GIL): only
           the interposer's SIGUSR1 GIL release lets the save run
  late     the main thread is in Python when the JIT event comes; once the
           save has started it calls cudaStreamSynchronize through PyDLL,
           holding the GIL: the interposer must park it at the call
  runtime  as hold, with a stand-in for the jit-run runtime registered with
           install_runtime_handler: the callback must call its trigger(), which
           saves on a Python thread of its own, as JitRuntime.trigger does; that
           thread marks itself as saving (save_in_progress), as
           jitckpt/worker/save.py does
  peer_dies  as hold, but instead of a hang rank 1 exits before its third
           all-reduce: NCCL reports the lost peer as an asynchronous error
           (ncclCommGetAsyncError), which must be a JIT event long before the
           hang timeout
  scoped   as runtime, and the save mode must stay the saving thread's and the
           save's own: a bystander thread that copies on the blocked default
           stream during the save must stay blocked, and a copy issued after
           save_in_progress(False) must not be redirected

The save copies the parameters back with cudaMemcpy (device to host, on the
blocked legacy stream) and with cudaMemcpyAsync + cudaStreamSynchronize on
stream 0, then writes OUT_DIR/save-rank<r>.json and the process exits 75.

Environment: RANK, WORLD_SIZE, JITCKPT_TEST_ID_FILE, OUT_DIR, and
DRIVER_TIMEOUT (if set, passed to install(timeout=...)).
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import os
import sys
import threading
import time

from jitckpt.native import interposer as interpose

N = 1024
ROUNDS = 3
SAVED_EXIT = 75
PEER_DIED_EXIT = 9
D2H, H2D = 2, 1
NCCL_FLOAT, NCCL_SUM = 7, 0

mode = sys.argv[1]
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
out_dir = os.environ["OUT_DIR"]

cudart_lib = ctypes.CDLL("libcudart.so.13", mode=ctypes.RTLD_GLOBAL)
nccl_lib = ctypes.CDLL("libnccl.so.2", mode=ctypes.RTLD_GLOBAL)
G = ctypes.CDLL(None)  # the global scope: the preloaded interposer first
P = ctypes.PyDLL(None)  # the same functions, called without releasing the GIL

vp, sz, ci = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


SIGNATURES = {
    "cudaSetDevice": [ci],
    "cudaMalloc": [ctypes.POINTER(vp), sz],
    "cudaMallocHost": [ctypes.POINTER(vp), sz],
    "cudaMemcpy": [vp, vp, sz, ci],
    "cudaMemcpyAsync": [vp, vp, sz, ci, vp],
    "cudaStreamCreateWithFlags": [ctypes.POINTER(vp), ctypes.c_uint],
    "cudaStreamSynchronize": [vp],
    "cudaEventCreateWithFlags": [ctypes.POINTER(vp), ctypes.c_uint],
    "cudaEventRecord": [vp, vp],
    "cudaStreamWaitEvent": [vp, vp, ctypes.c_uint],
    "ncclGetUniqueId": [ctypes.POINTER(UniqueId)],
    "ncclCommInitRank": [ctypes.POINTER(vp), ci, UniqueId, ci],
    "ncclAllReduce": [vp, vp, sz, ci, ci, vp, vp],
}


def fn(lib: ctypes.CDLL, name: str):
    f = getattr(lib, name)
    f.argtypes = SIGNATURES[name]
    f.restype = ci
    return f


def check(rc: int, what: str) -> None:
    if rc != 0:
        print(f"rank {rank}: {what} returned {rc}", file=sys.stderr, flush=True)
        os._exit(1)


def exchange_id() -> UniqueId:
    uid = UniqueId()
    path = os.environ["JITCKPT_TEST_ID_FILE"]
    if rank == 0:
        check(fn(G, "ncclGetUniqueId")(ctypes.byref(uid)), "ncclGetUniqueId")
        with open(path + ".tmp", "wb") as f:
            f.write(bytes(uid))
        os.rename(path + ".tmp", path)
        return uid
    deadline = time.monotonic() + 30
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            check(1, "waiting for the ncclUniqueId file")
        time.sleep(0.01)
    with open(path, "rb") as f:
        ctypes.memmove(ctypes.byref(uid), f.read(128), 128)
    return uid


def expected_param() -> list[float]:
    return [float(rank * 1000 + i) for i in range(N)]


# ---- set-up ------------------------------------------------------------------

check(fn(G, "cudaSetDevice")(0), "cudaSetDevice")
uid = exchange_id()
comm = vp()
check(fn(G, "ncclCommInitRank")(ctypes.byref(comm), world, uid, rank), "ncclCommInitRank")
nccl_stream = vp()
check(fn(G, "cudaStreamCreateWithFlags")(ctypes.byref(nccl_stream), 1), "cudaStreamCreateWithFlags")
LEGACY = None  # stream 0: the legacy default stream

nbytes = N * 4
param, grad, pinned = vp(), vp(), vp()
check(fn(G, "cudaMalloc")(ctypes.byref(param), nbytes), "cudaMalloc")
check(fn(G, "cudaMalloc")(ctypes.byref(grad), nbytes), "cudaMalloc")
check(fn(G, "cudaMallocHost")(ctypes.byref(pinned), nbytes), "cudaMallocHost")
host = (ctypes.c_float * N)(*expected_param())
check(fn(G, "cudaMemcpy")(param, host, nbytes, H2D), "cudaMemcpy H2D")
ones = (ctypes.c_float * N)(*([1.0] * N))
check(fn(G, "cudaMemcpy")(grad, ones, nbytes, H2D), "cudaMemcpy H2D")

hang_issued_at = None


# ---- the JIT save ------------------------------------------------------------


def save(reason: str, detail: str, write: bool = True) -> dict:
    """Runs on the interposer's watchdog thread, or on the stand-in runtime's save thread."""
    detected = time.monotonic()
    started = os.path.join(out_dir, f"started-rank{rank}")
    open(started, "w").close()
    if mode == "late":
        time.sleep(0.3)  # lets the main thread reach its blocking call, GIL in hand
    copy = (ctypes.c_float * N)()
    rc_memcpy = fn(G, "cudaMemcpy")(copy, param, nbytes, D2H)
    copy_async = (ctypes.c_float * N)()
    rc_async = fn(G, "cudaMemcpyAsync")(copy_async, param, nbytes, D2H, LEGACY)
    rc_sync = fn(G, "cudaStreamSynchronize")(LEGACY)
    record = {
        "rank": rank,
        "mode": mode,
        "thread": threading.current_thread().name,
        "reason": reason,
        "detail": detail,
        "seconds_after_hang": detected - hang_issued_at if hang_issued_at is not None else None,
        "rc": [rc_memcpy, rc_async, rc_sync],
        "memcpy_ok": list(copy) == expected_param(),
        "memcpy_async_ok": list(copy_async) == expected_param(),
        "nccl_stream": nccl_stream.value,
        "in_flight": [dataclasses.asdict(e) for e in interpose.in_flight_events()],
        "counters": interpose.counters(),
        "timeout": interpose.timeout(),
    }
    if write:
        write_record(record)
    return record


def write_record(record: dict) -> None:
    path = os.path.join(out_dir, f"save-rank{rank}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.rename(path + ".tmp", path)


class StandInRuntime:
    """What the interposer binding needs of JitRuntime: trigger() saves on a new thread, then exits."""

    def __init__(self) -> None:
        self.triggers: list[tuple[str, str]] = []

    def trigger(self, reason: str, detail: str) -> None:
        self.triggers.append((reason, detail))
        threading.Thread(target=self._save_and_exit, args=(reason, detail), name="jitckpt-save").start()

    def _save_and_exit(self, reason: str, detail: str) -> None:
        interpose.save_in_progress(True)  # as jitckpt/worker/save.py marks the runtime's save thread
        if mode != "scoped":
            save(reason, detail)
            os._exit(SAVED_EXIT)
        bystander = Bystander()
        record = save(reason, detail, write=False)
        record["bystander_escaped"] = bystander.done.wait(1.0)
        interpose.save_in_progress(False)
        # After the save: an ordinary copy on the blocked default stream, queued behind the hang.
        rc_after = fn(G, "cudaMemcpyAsync")(pinned, param, nbytes, D2H, LEGACY)
        record["rc_after"] = rc_after
        record["counters_after"] = interpose.counters()
        write_record(record)
        os._exit(SAVED_EXIT)


class Bystander:
    """A thread that is not saving and copies on the blocked default stream while another thread saves."""

    def __init__(self) -> None:
        self.done = threading.Event()
        threading.Thread(target=self._run, name="bystander", daemon=True).start()

    def _run(self) -> None:
        copy = (ctypes.c_float * N)()
        fn(G, "cudaMemcpy")(copy, param, nbytes, D2H)  # ctypes.CDLL: without the GIL
        self.done.set()


assert interpose.is_loaded(), "run me with LD_PRELOAD=libjitckpt_interpose.so"
timeout = os.environ.get("DRIVER_TIMEOUT")
if mode in ("runtime", "scoped"):
    interpose.install(on_jit_event=None, timeout=float(timeout) if timeout else None)
    interpose.install_runtime_handler(StandInRuntime().trigger)
else:
    interpose.install(on_jit_event=save, exit_code=SAVED_EXIT, timeout=float(timeout) if timeout else None)

# ---- the training loop -------------------------------------------------------

# One event, re-recorded every round, as PyTorch's event pools do.
ev = vp()
check(fn(G, "cudaEventCreateWithFlags")(ctypes.byref(ev), 2), "cudaEventCreateWithFlags")
for r in range(ROUNDS):
    if r == ROUNDS - 1:
        hang_issued_at = time.monotonic()
        if mode == "peer_dies" and rank == 1:
            print(f"rank {rank}: exiting before round {r}", flush=True)
            os._exit(PEER_DIED_EXIT)
    check(fn(G, "ncclAllReduce")(grad, grad, N, NCCL_FLOAT, NCCL_SUM, comm, nccl_stream), "ncclAllReduce")
    check(fn(G, "cudaEventRecord")(ev, nccl_stream), "cudaEventRecord")
    check(fn(G, "cudaStreamWaitEvent")(LEGACY, ev, 0), "cudaStreamWaitEvent")
    # Into pinned memory, so the copy itself returns at once and the wait below blocks.
    check(fn(G, "cudaMemcpyAsync")(pinned, grad, nbytes, D2H, LEGACY), "cudaMemcpyAsync")
    print(f"rank {rank}: round {r} issued", flush=True)
    if mode == "release":
        rc = fn(G, "cudaStreamSynchronize")(LEGACY)
    elif mode in ("hold", "runtime", "scoped", "peer_dies") or r < ROUNDS - 1:
        rc = fn(P, "cudaStreamSynchronize")(LEGACY)
    else:  # late: wait in Python until the save has started, then block holding the GIL
        while not os.path.exists(os.path.join(out_dir, f"started-rank{rank}")):
            time.sleep(0.005)
        print(f"rank {rank}: save started, now blocking with the GIL", flush=True)
        rc = fn(P, "cudaStreamSynchronize")(LEGACY)
    check(rc, "cudaStreamSynchronize")
    got = (ctypes.c_float * N).from_address(pinned.value)
    want = float(world ** (r + 1))
    if any(v != want for v in got):
        check(1, f"round {r}: all-reduce result {got[0]} != {want}")
    print(f"rank {rank}: round {r} ok", flush=True)

print(f"rank {rank}: all rounds completed (no hang?)", flush=True)
sys.exit(3)
