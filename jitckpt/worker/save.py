"""The JIT save (paper §3.2): the user's save into a pending checkpoint, then a commit.

Runs on the runtime's save thread (or, for an uncaught distributed error, on
the training thread itself) once the training thread is parked or provably
stuck before the optimizer step.  It needs no collective: the user's
``save(path)`` writes this rank's state into a pending per-rank checkpoint;
jitckpt adds every local rank's own state for the saved minibatch (RNG, data
loaders; dead ranks included, from the host's shared-memory stash) and DDP's bucket layout, and
commits with metadata last, which records the rank's shard identity
(``jitckpt.worker.sharding``: which ranks hold the same state).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Any, Iterator

from jitckpt import config, eventlog
from jitckpt.jit_event import JitReason
from jitckpt.native import interposer
from jitckpt.store.base import PendingCheckpoint
from jitckpt.worker import ddp_layout, fsdp_layout, sharding, stash
from jitckpt.worker.console import log

if TYPE_CHECKING:
    from jitckpt.worker.runtime import JitRuntime


class _SaveFlag(threading.local):
    active = False


_saving = _SaveFlag()


def in_jit_save() -> bool:
    """True on the thread that is running the user's save function."""
    return _saving.active


class _MinibatchStart:
    """Where the training thread's CUDA stream reached the start of the current minibatch (a recorded event)."""

    event: Any = None  # torch.cuda.Event, re-recorded at every minibatch start; None where CUDA never started
    device: Any = None
    stream: Any = None  # the save's side stream, made here, ahead of any hang (see note_minibatch_start)


_start = _MinibatchStart()


def note_minibatch_start() -> None:
    """Training thread, after the optimizer step of the previous minibatch: record where its stream is now.

    Everything enqueued before it (the previous minibatch's optimizer kernels)
    writes the state that a JIT save of this minibatch saves; nothing of this
    minibatch's collectives is.  A few microseconds per minibatch; nothing at
    all where CUDA is not initialised.

    The save's side stream is made here too, the first time: the first stream
    taken from torch's pool initialises the pool, and on an H100 (torch 2.11)
    that waited for the blocked default stream (2 s behind a spinning kernel,
    and the copy then included the update queued behind it), where a stream
    made before the hang did not (13 ms, the start-of-minibatch state).
    """
    cuda = sys.modules.get("torch.cuda")
    if cuda is None or not cuda.is_initialized():
        return
    if _start.event is None or _start.device != cuda.current_device():
        _start.device = cuda.current_device()
        _start.event = cuda.Event()
        _start.stream = cuda.Stream()
    _start.event.record()


@contextlib.contextmanager
def off_the_blocked_stream() -> Iterator[None]:
    """Run the user's save on a fresh CUDA stream that waits only for the start of the minibatch.

    The save thread's current stream is the default stream, which on a CUDA 12
    job (legacy default-stream semantics, no interposer redirecting it) waits
    for the training stream, itself blocked behind the hung NCCL collective:
    the save's device-to-host copies would never run.  A stream from torch's
    pool does not synchronise with the default stream; it waits for the event
    recorded at the start of the minibatch (``note_minibatch_start``), so it
    reads the parameters as the previous optimizer step left them, and the
    save synchronises only it.  Before the first minibatch ends there is no
    event: the parameters were written by the model's construction or the
    resume's load, both finished on the host's side.  Checked on an H100 with
    one GPU (``scripts/gpu-check.sh save-stream``: a kernel spinning on the
    training stream stands for the hang); NCCL across GPUs is unverified.
    """
    cuda = sys.modules.get("torch.cuda")
    if cuda is None or not cuda.is_initialized():
        yield
        return
    device = _start.device if _start.device is not None else cuda.current_device()
    with cuda.device(device):
        side = _start.stream if _start.stream is not None else cuda.Stream()
        if _start.event is not None:
            side.wait_event(_start.event)
        with cuda.stream(side):
            yield
        side.synchronize()


def save_checkpoint(rt: "JitRuntime", reason: JitReason, detail: str) -> int:
    """Run the user's save into a pending rank checkpoint and commit it; returns the worker's exit code."""
    if rt.resumed_from is not None and not rt.training_started:
        log(f"JIT event before this attempt resumed training: the checkpoint of minibatch {rt.resumed_from} "
            f"it was loading from is still the newest; nothing new to save")
        eventlog.record("jit_save_failed", rank=rt.rank, attempt=rt.attempt, error="training had not resumed yet")
        return config.JIT_SAVE_FAILED_EXIT_CODE
    if rt.save_fn is None:
        log("JIT event but no save function registered (call jitckpt.register_save_checkpoint); nothing saved")
        eventlog.record("jit_save_failed", rank=rt.rank, attempt=rt.attempt, error="no save function registered")
        return config.JIT_SAVE_FAILED_EXIT_CODE
    started = time.time()
    step, phase = rt.step, rt.phase
    # From here to the commit, this thread's CUDA work on blocked streams (the
    # BatchNorm rewind, the user's copies) goes to a fresh stream (DESIGN decision 4).
    interposer.save_in_progress(True)
    try:
        # Which ranks hold this state (FSDP/DTensor, ZeRO, DDP): recorded in the metadata.
        pending = rt.store.begin_save(step, sharding.refresh(rt))
        # Forward passes of this minibatch may have updated BatchNorm statistics.
        buffers_rewound = rt.buffer_snapshots.rewind(step)
        resharded = fsdp_layout.freeze()
        if resharded:
            log(f"{resharded} FSDP2 parameter group(s) were unsharded ({phase}): their shards, the state at the "
                f"start of minibatch {step}, are what is saved")
        with off_the_blocked_stream():
            run_user_save(rt, pending)
        rt.injector.maybe_fire("save", step)
        rt.gap.before_save()  # (still between two minibatches: whether the global generators moved there)
        copied = copy_stashes(rt, pending, step)
        ddp_layout.write(pending)
        final = pending.commit(
            {
                "reason": reason.value,
                "detail": detail,
                "phase_at_detection": phase,
                "saved_state": f"start of minibatch {step}",
                "attempt": rt.attempt,
                "rng_ranks": copied[stash.RNG],
                "loader_ranks": copied[stash.LOADER],
                "module_buffers_rewound": buffers_rewound,
            }
        )
    except BaseException as exc:  # report, keep the partial dir out of sight, exit non-zero
        log(f"JIT save failed: {type(exc).__name__}: {exc}")
        traceback.print_exc()
        eventlog.record("jit_save_failed", rank=rt.rank, attempt=rt.attempt, error=f"{type(exc).__name__}: {exc}")
        return config.JIT_SAVE_FAILED_EXIT_CODE
    finally:
        interposer.save_in_progress(False)
    seconds = time.time() - started
    eventlog.record("jit_saved", rank=rt.rank, attempt=rt.attempt, step=step, path=str(final), seconds=seconds, phase=phase)
    log(f"JIT checkpoint of minibatch {step} committed to {final} in {seconds:.2f}s")
    return config.JIT_SAVED_EXIT_CODE


def run_user_save(rt: "JitRuntime", pending: PendingCheckpoint) -> None:
    """The user's registered ``save(path)`` into ``pending`` (``in_jit_save()`` is True meanwhile)."""
    assert rt.save_fn is not None
    _saving.active = True
    try:
        rt.save_fn(str(pending.path))
    finally:
        _saving.active = False


def copy_stashes(rt: "JitRuntime", pending: PendingCheckpoint, step: int,
                 only_rank: int | None = None) -> dict[str, list[int]]:
    """Copy every local rank's stashed state for ``step`` (dead ranks included; with ``only_rank``, that
    rank's) into the checkpoint, through the store.

    Returns {kind: ranks copied}: the RNG states, and the data loaders'
    positions and seeds (``jitckpt.adapters.torchdata_loader``).
    """
    copied: dict[str, list[int]] = {kind: [] for kind in stash.KINDS}
    if rt.shm_dir is None or not rt.shm_dir.is_dir():
        return copied
    for kind in stash.KINDS:
        for rank, path in stash.stashed_ranks(rt.shm_dir, kind).items():
            if only_rank is not None and rank != only_rank:
                continue
            payload = stash.read_stash(path).get(step)
            if payload is None:
                continue
            pending.write_file(stash.checkpoint_file_name(kind, rank), payload)
            copied[kind].append(rank)
    return copied
