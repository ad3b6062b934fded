"""The per-worker JIT runtime: minibatch phase, in-flight collectives, parking, and the JIT event.

One ``JitRuntime`` exists per worker process launched by jit-run.  The hooks
(``jitckpt.worker.instrument``) report to it: optimizer steps, collectives
entering and leaving, collective errors.  The watchdog
(``jitckpt.worker.watchdog``) reports timeouts and SIGTERM, the interposer's
C watchdog hung CUDA events.  Any of those can raise a *JIT event*
(``jitckpt.jit_event``); the runtime then

1. asks the training thread to park at the next safe point (a collective or
   the optimizer pre-step hook) so that no parameter changes under the save;
2. waits until the training thread is parked, or provably stuck inside a
   collective outside the optimizer step (paper §3.3: the state is then the
   start of minibatch i, or of i+1 if the failure hit the optimizer step);
3. saves from its own thread (``jitckpt.worker.save``) and exits with
   ``JIT_SAVED_EXIT_CODE`` so that torchrun restarts the job.

Resuming from a checkpoint is ``jitckpt.worker.resume``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

from jitckpt import config, eventlog, faults
from jitckpt.jit_event import JitReason
from jitckpt.store import CheckpointInfo, CheckpointStore, DiskStore, ParallelCoordinates
from jitckpt.store.tiered import TieredStore
from jitckpt.store.memory import peer_copies
from jitckpt.worker import data_position, ddp_layout, minibatch, minibatch_gap, module_buffers, private_rng, rng_state, save, sharding, shutdown, stash
from jitckpt.worker.memory_snapshots import MemorySnapshots
from jitckpt.worker.console import log, short_error

SaveFunction = Callable[[str], Any]


class JitRuntime:
    """State of one worker: see the module docstring."""

    def __init__(self) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        # This node's worker generation (jit-run's agent counts every restart,
        # also one caused by another node); torchrun's own count otherwise.
        self.attempt = int(os.environ.get(config.ENV_WORKER_GENERATION) or os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
        self.coords = ParallelCoordinates.from_layout(
            self.rank,
            self.world_size,
            tp_size=int(os.environ.get(config.ENV_TP_SIZE, "1")),
            pp_size=int(os.environ.get(config.ENV_PP_SIZE, "1")),
        )
        self.checkpoint_root = Path(os.environ.get(config.ENV_CHECKPOINT_DIR, config.DEFAULT_CHECKPOINT_DIR))
        shm_dir = os.environ.get(config.ENV_SHM_DIR)
        self.shm_dir = Path(shm_dir) if shm_dir else None
        # The node's memory tier (snapshots of shards with no replica), read as one more tier of the store.
        self.memory_tier = MemorySnapshots.from_env(self.shm_dir, self.rank)
        disk = DiskStore(self.checkpoint_root)
        self.store: CheckpointStore = (TieredStore(disk, self.memory_tier.store, peer_copies(self.checkpoint_root))
                                       if self.memory_tier else disk)
        self.hang_timeout = config.env_float(config.ENV_HANG_TIMEOUT, config.DEFAULT_HANG_TIMEOUT)
        self.save_grace = config.env_float(config.ENV_SAVE_GRACE, config.DEFAULT_SAVE_GRACE)
        self.injector = faults.FaultInjector(faults.parse(os.environ.get(config.ENV_FAULT, "")), self.rank, self.attempt)
        self.stash = rng_state.RngStash(self.shm_dir, self.rank) if self.shm_dir else None
        self._rank_stashes: dict[str, stash.StepStash] = {}
        # After a resume: this rank's own stashed state of other kinds (stash.LOADER) for the resumed step.
        self.own_state: dict[str, bytes] = {}
        # Called wherever what minibatch step+1 starts with is stashed (every collective, and
        # stash_next_minibatch's other callers), after the RNG state: per-rank state of other
        # kinds (the data loaders' positions, jitckpt.adapters.torchdata_loader) is stashed there too.
        self.next_minibatch_hooks: list[Callable[[], None]] = []
        # The batches each minibatch took from DataLoaders; after a resume, the check of the redone one.
        self.taken_batches = data_position.TakenBatches(self)
        # What each minibatch's gap drew (a new epoch's iterator, evaluation); after a resume, where RNG goes back.
        self.gap = minibatch_gap.MinibatchGap(self)
        # The framework whose adapter saves and resumes (jitckpt.adapters.base.claim).
        self.framework: str | None = None
        self.framework_reruns_evaluation = False  # (its adapter can run an interrupted evaluation again: HF's)
        self.framework_last_minibatch: int | None = None  # (the step it stops at, if it says: HF's max_steps)
        self._rng_by_step: dict[int, bytes] = {}  # the RNG state stashed for each minibatch (this one and the next)

        self.save_fn: SaveFunction | None = None
        self.buffer_snapshots = module_buffers.BufferSnapshots()
        self.step = 0  # optimizer steps completed == index of the minibatch in progress
        self.phase = "forward"
        self.resumed_from: int | None = None
        # Which optimizers make up a minibatch, and whether its optimizer phase has applied anything.
        self.optimizer_phase = minibatch.OptimizerPhase(sharding.optimizers)
        self._blocked_at: tuple[tuple[int, object, int], float] | None = None  # main_thread_in_collective
        self._forward_park_hook: Any = None
        self._rng_stashed: tuple[int, bytes] | None = None  # (step, payload) of the last RNG state stashed
        # After a resume: this rank's RNG state for the redone minibatch, put back when that minibatch starts.
        self.pending_rng: bytes | None = None
        self._rng_restored_at_fetch = False  # a DataLoader fetch put pending_rng back (batch_fetch_starts)
        self._pending_rng_hook: Any = None
        # From a minibatch's start until its first fetch, forward, collective or optimizer step: the script's
        # own generators are captured once more at the first fetch or forward (note_own_generators_at_start).
        self._own_window = False
        self._own_window_hook: Any = None
        self._step_started = time.monotonic()
        self._step_seconds_total = 0.0
        self._steps_timed = 0
        self._first_step_after_start = True
        self.training_started = False  # set at this attempt's first collective or optimizer step
        self.located = False
        self.checkpoint: CheckpointInfo | None = None  # what this attempt resumes from (jitckpt.worker.resume)
        self.checkpoint_for: ParallelCoordinates | None = None  # identity it was selected for; None once loaded
        self.held_back: str | None = None  # why this rank selected the step before the newest (resume.locate)

        self._lock = threading.Lock()
        self._in_flight: dict[int, tuple[float, str]] = {}
        self._tokens = itertools.count()
        # In-flight collectives whose end is polled (NCCL-like backends: their Work, or an event after it), not their future's.
        self._polled: dict[int, PolledWork] = {}
        self._gradient: set[int] = set()  # in flight and a gradient collective (the optimizer pre-step waits)
        self._issued_in: dict[int, int] = {}  # in flight: token -> the minibatch it was issued in
        self._failed_tokens: set[int] = set()  # in flight for good: they failed
        self._optimizer_entered_for: int | None = None  # the step whose pre-step wait the training thread passed
        self.park_requested = threading.Event()
        self.main_parked = threading.Event()
        self._parked: dict[int, str] = {}  # ident -> name of every thread parked for good (park_forever)
        self._jit_started = False
        self.main_thread = threading.main_thread()
        eventlog.record("worker_start", rank=self.rank, attempt=self.attempt, world_size=self.world_size,
                      rendezvous_round=os.environ.get(config.ENV_RENDEZVOUS_ROUND))

    # ----- minibatch phase ------------------------------------------------------------

    # ----- the RNG state of a redone minibatch -----------------------------------------

    def defer_rng_restore(self, payload: bytes) -> None:
        """Put ``payload`` (rng_state.capture() bytes) back when the redone minibatch starts, not now.

        The script may draw random numbers between jit_get_checkpoint_path()
        and its first minibatch (creating a DataLoader iterator draws a seed
        from the global generator); in the fault-free run those draws happened
        before this state was captured.  The minibatch starts at the first
        training module forward (``data_position.trains``: a global forward
        pre-hook, removed once it fired; an evaluation the script runs before
        its loop is not the minibatch, and the DataLoader fetches after it
        still put the state back), or at the optimizer step if no module
        runs.  Never at a collective: one before the loop (a barrier after
        loading the checkpoint, an evaluation metric's all-reduce) is not the
        minibatch, and the draws after it (a new DataLoader iterator's seed)
        would come from the restored state; before, such a resume ended with
        other dropout masks, ``completed``.
        """
        from torch.nn.modules.module import register_module_forward_pre_hook

        self.pending_rng = payload
        if self._pending_rng_hook is None:
            self._pending_rng_hook = register_module_forward_pre_hook(
                lambda module, args: self.minibatch_starts() if data_position.trains(module) else None)

    def take_pending_rng(self) -> bytes | None:
        """Claim the deferred state (a framework adapter restores it at its framework's own minibatch start)."""
        payload, self.pending_rng = self.pending_rng, None
        if self._pending_rng_hook is not None:
            self._pending_rng_hook.remove()
            self._pending_rng_hook = None
        return payload

    def minibatch_starts(self) -> None:
        """The redone minibatch starts: put its RNG state back (once; not again after a data loader did)."""
        payload = self.take_pending_rng()
        if payload is not None and not self._rng_restored_at_fetch:
            rng_state.restore(payload)
        if payload is not None:
            private_rng.warn_absent()  # (after the last restore: the script has made its generators by now)

    def open_own_generators_window(self) -> None:
        """Minibatch ``step`` starts: capture the script's own generators again at its first fetch or forward.

        The state minibatch i starts with is captured at the end of minibatch
        i-1 (its collectives, its optimizer step); a redone minibatch gets it
        back at its DataLoader fetches before its first module forward, or at
        that forward.  For the global generators nothing is drawn between the
        two in the common case.  For the script's own generators the start of
        an epoch matters: a generator made or reseeded for the new epoch
        exists only after minibatch i-1 ended.  So the script's own generators
        are captured once more, at minibatch i's first DataLoader fetch, or
        its first module forward if that comes first, and that capture
        replaces theirs in the stash for minibatch i
        (``jitckpt.worker.private_rng``).  Its first collective or optimizer
        step ends the chance (a forward inside a compiled function may fire
        no hook: a later fetch must not capture the middle of the
        minibatch), and so does a framework adapter's own capture at its
        minibatch start.  Nothing is armed when the script has no generators
        of its own.
        """
        if self._own_window_hook is None and private_rng.tracking():
            self._own_window = True
            from torch.nn.modules.module import register_module_forward_pre_hook

            self._own_window_hook = register_module_forward_pre_hook(lambda module, args: self._first_forward())

    def _first_forward(self) -> None:
        if self.pending_rng is not None:
            self.minibatch_starts()  # (put the redone minibatch's state back before capturing it)
        self.note_own_generators_at_start()

    def note_own_generators_at_start(self) -> None:
        """Replace the script's own generators' states in the stash of the minibatch that is starting (see above),
        once: the window closes here."""
        if not self._own_window:
            return
        self.close_own_generators_window()
        if self.stash is None or self._rng_stashed is None or self._rng_stashed[0] != self.step:
            return  # (nothing stashed for this minibatch's start: it is not a saved state's start either)
        private = private_rng.capture()
        if private is None:
            return
        payload = rng_state.with_own_generators(self._rng_stashed[1], private)
        if payload != self._rng_stashed[1]:
            self.stash_rng(self.step, payload)

    def close_own_generators_window(self) -> None:
        """The minibatch's first fetch, forward, collective or optimizer step has come: no capture after it."""
        if self._own_window_hook is not None:
            self._own_window_hook.remove()
            self._own_window_hook = None
        self._own_window = False

    def batch_fetch_starts(self) -> None:
        """A DataLoader's sampler has just chosen the next batch, which is about to be fetched.

        Until the redone minibatch's first module forward, every such point
        puts its RNG state back, so that the last one before the forward
        wins: the batch of that minibatch then draws its augmentation (in
        this process, ``num_workers=0``) and the script its noise (between
        ``next()`` and the forward) from the state the fault-free run had,
        whatever batches the script fetched and dropped to reach its
        position.  Draws made before (a new iterator's base seed, the
        sampler's own seed at an iterator's first index) are left alone, as
        the fault-free run made them before this state was captured.
        """
        if self.pending_rng is not None:
            rng_state.restore(self.pending_rng)
            self._rng_restored_at_fetch = True

    # ----- minibatch phase (continued) ---------------------------------------------------

    def optimizer_pre_step(self, optimizer: object) -> None:
        """Called before every optimizer.step(); the minibatch's first one is a safe point.

        One minibatch spans every optimizer that steps in it
        (``jitckpt.worker.minibatch``): its optimizer phase lasts from the first
        pre-step to the last post-step, and no state inside it that has
        applied part of the update is ever saved.
        """
        self.taken_batches.minibatch_committed(collective=False)
        self.close_own_generators_window()
        self.wait_for_gradient_collectives()
        ddp_layout.note_backward_done()
        if self.pending_rng is not None:
            self.minibatch_starts()
        phase = self.optimizer_phase
        if phase.close_previous(optimizer):
            self._minibatch_done()  # the set was being learned: the previous minibatch ended at its last post-step
        top_level = not phase.inside
        opening = not phase.in_phase
        if opening:
            # The last point before this minibatch's update begins: the state is its start.
            self.park_if_requested()
            self.training_started = True
        phase.enter(optimizer)
        self.phase = "optimizer"
        if top_level:
            # Stash the RNG state minibatch step+1 starts with now, before this step:
            # if this rank dies inside it, the replicas save step+1 (optimizers
            # and schedulers draw no random numbers, so this is that state).  Every
            # optimizer of the minibatch stashes again if the state moved: a GAN's
            # generator draws its noise after the discriminator's step.
            self.stash_next_rng()
        if opening:
            self.injector.maybe_fire("optimizer", self.step)

    def optimizer_post_step(self, optimizer: object) -> None:
        """Called after every optimizer.step(): the minibatch is complete after its last optimizer's."""
        if self.optimizer_phase.post_step(optimizer):
            self._minibatch_done()

    def optimizer_step_skipped(self, optimizer: object) -> None:
        """``GradScaler.step`` skipped ``optimizer.step()`` (inf/nan gradients): a step that changed nothing.

        No optimizer hook fired; counting it keeps the minibatch count (which
        keys the RNG stash and labels the save) equal to the script's.
        """
        self.optimizer_pre_step(optimizer)
        self.optimizer_post_step(optimizer)

    def _minibatch_done(self) -> None:
        self.step += 1
        self.phase = "forward"
        self.taken_batches.minibatch_started()
        self.gap.minibatch_started()
        self.open_own_generators_window()
        self.arm_memory_snapshot()
        save.note_minibatch_start()  # where a JIT save's side stream starts reading (CUDA only; else nothing)
        # (the pre-step hooks already stashed the RNG state this minibatch starts with)
        now = time.monotonic()
        if not self._first_step_after_start:
            self._step_seconds_total += now - self._step_started
            self._steps_timed += 1
        else:
            self._first_step_after_start = False
            eventlog.record("first_step_done", rank=self.rank, attempt=self.attempt, step=self.step, resumed_from=self.resumed_from)
        self._step_started = now

    def arm_memory_snapshot(self) -> None:
        """The memory tier snapshots this rank's shard at the first training forward of the minibatch that starts."""
        if self.memory_tier is not None:
            self.memory_tier.arm(self)

    def state_consistent(self) -> bool:
        """False while the optimizer phase has applied part of this minibatch's update (such a state is never saved)."""
        return not self.optimizer_phase.changed()

    def stash_rng(self, step: int, payload: bytes | None = None) -> None:
        """Record the RNG state minibatch ``step`` starts with (``payload``, or the current one) in this host's stash."""
        if self.stash is not None:
            payload = rng_state.capture() if payload is None else payload
            self.stash.put(step, payload)
            self._rng_stashed = (step, payload)
            self._rng_by_step = {s: p for s, p in self._rng_by_step.items() if s >= self.step}
            self._rng_by_step[step] = payload

    def rng_stashed_for(self, step: int) -> bytes | None:
        """The RNG state last stashed for minibatch ``step`` by this process (None if none)."""
        return self._rng_by_step.get(step)

    def stash_next_rng(self) -> None:
        """Record the current RNG state as the one minibatch step+1 starts with, if it moved since the last record.

        Called at every collective, at every optimizer pre-step, and after a
        data-loader fetch that follows them: each record replaces the one
        before, so the stash holds the state after the last random draw of
        minibatch ``step`` that one of them saw.  Comparing the captured bytes
        (~20 us here) finds any draw, wherever it came from (a forward pass, a
        second micro-batch, a second model, the script's own noise, a batch
        augmented in this process); an unchanged state is not written again.
        """
        if self.stash is None:
            return
        step, payload = self.step + 1, rng_state.capture()
        if self._rng_stashed != (step, payload):
            self.stash_rng(step, payload)

    def stash_next_minibatch(self) -> None:
        """Record what minibatch step+1 starts with, as it stands now: the RNG state, then the hooks' state (loaders)."""
        self.stash_next_rng()
        for hook in self.next_minibatch_hooks:
            hook()

    def stash_rank_state(self, kind: str, step: int, payload: bytes) -> None:
        """Record this rank's own state of ``kind`` (``jitckpt.worker.stash``) that minibatch ``step`` starts with."""
        if self.shm_dir is None:
            return
        if kind not in self._rank_stashes:
            self._rank_stashes[kind] = stash.StepStash(self.shm_dir, kind, self.rank)
        self._rank_stashes[kind].put(step, payload)

    def mean_minibatch_seconds(self) -> float | None:
        return self._step_seconds_total / self._steps_timed if self._steps_timed else None

    # ----- collectives ----------------------------------------------------------------

    def collective_entry(self, what: str) -> None:
        """A collective is about to be issued (by the training thread, or DDP's hook for it): a safe point.

        It is also where the state minibatch step+1 starts with is stashed
        (``stash_next_minibatch``), whoever issues the collective: DDP's
        all-reduce, or a script that all-reduces its own gradients.  If the
        replicas save step+1, this rank took part in every collective of
        this minibatch, so the stash holds its state at the last one: after
        the minibatch's forward passes (every micro-batch's, with gradient
        accumulation with or without ``no_sync``; every model's).  A rank
        that dies after it, before its optimizer pre-step hook (gradient
        clipping, logging, a GradScaler, a wrapper around
        ``optimizer.step``), is resumed by its replicas at step+1 with it.
        Random numbers the script draws itself between its last collective
        and ``optimizer.step()`` are in it only if the rank reaches torch's
        step hooks (a batch fetched there is: the data-loader adapter stashes
        again after it).  An earlier collective of the minibatch (a broadcast
        before the forward) stashes an older state, which a later one
        replaces; the state at the start of minibatch ``step`` itself is
        never touched.
        """
        self.taken_batches.minibatch_committed(collective=True)  # (before this rank contributes to the minibatch)
        self.close_own_generators_window()
        self.optimizer_phase.collective_issued()
        self.park_if_requested()
        self.training_started = True
        if self.phase != "optimizer":
            self.phase = "allreduce"
        self.stash_next_minibatch()
        self.injector.maybe_fire("allreduce", self.step)

    def track(self, what: str, work: Any = None, gradient: bool = False) -> int:
        """Count a collective as in flight from now on; returns its token.

        ``work``: what says when the collective ended, through
        ``is_completed()`` (and ``exception()``), when its end cannot be read
        from its future (NCCL and NCCL-like backends, whose future completes
        when the collective is *enqueued*): its ``torch.distributed`` Work, or
        for NCCL an event after it (``instrument._StreamEnd``); the watchdog
        polls it, the optimizer pre-step too.  None: the collective's completion path
        (its future's callback on gloo, a blocking wait returning) calls
        ``collective_finished``.  ``gradient``: a collective whose result may
        feed this minibatch's update, which the optimizer pre-step waits for
        (the instrumentation counts every collective issued outside the
        optimizer phase, whoever issues it: DDP, a script reducing its own
        gradients, FSDP, point-to-point transfers).
        """
        token = next(self._tokens)
        with self._lock:
            self._in_flight[token] = (time.monotonic(), what)
            self._issued_in[token] = self.step
            if work is not None:
                self._polled[token] = PolledWork(work)
            if gradient:
                self._gradient.add(token)
        return token

    def untrack(self, token: int) -> None:
        with self._lock:
            self._in_flight.pop(token, None)
            self._issued_in.pop(token, None)
            self._polled.pop(token, None)
            self._gradient.discard(token)

    def _failed(self, token: int) -> None:
        """A tracked collective failed: it stays in flight for good (nothing behind it may run), unpolled."""
        with self._lock:
            self._polled.pop(token, None)
            self._failed_tokens.add(token)

    def _retire_if_complete(self, token: int) -> bool:
        """Untrack ``token`` if its collective finished; True if it did.

        A collective with a Work to poll finished when ``work.is_completed()``
        says so (NCCL: its end event, queried without blocking); one without,
        when its completion path got here.  A Work that completed with an
        exception raises a JIT event and stays in flight.
        """
        with self._lock:
            handle = self._polled.get(token)
            what = self._in_flight.get(token, (0.0, "a collective"))[1]
        if handle is not None:
            state = handle.state(blocking=False)
            if state is None:  # a thread is in this Work's wait (wait_for_work): it reports the end
                return False
            done, error = state
            if not done:
                return False
            if error is not None:
                self._collective_failed(token, error, what)
                return False
        self.untrack(token)
        return True

    def _collective_failed(self, token: int, error: BaseException, what: str) -> None:
        """A polled collective completed with an error: it stays in flight for good, and a JIT event is raised."""
        self._failed(token)
        self.trigger(JitReason.PEER_ERROR, f"{what} failed: {short_error(error)}")

    def wait_for_work(self, token: int, wait: Callable[[], Any], host_blocking: bool) -> Any:
        """``Work.wait()`` of a polled collective (``wait`` calls the real one), without letting it abort the communicator.

        On NCCL, ``WorkNCCL::isCompleted()`` records a communicator error on
        the Work, and a later ``wait()`` of that Work calls ``ncclCommAbort``
        and throws: the device work queued behind the hang is released
        (parameters change) before the JIT save.  jitckpt polls a separate
        handle for NCCL's Works (``instrument._StreamEnd``), and any Work it
        does poll is queried under its lock: the real ``wait()`` runs under
        that lock, right after a query that found no error (the watchdog
        skips a Work whose lock is held), so nothing jitckpt does can record
        an error in between.  A failed collective raises the JIT event and
        parks the thread, whichever thread it is (the collective stays in
        flight for good).

        ``host_blocking``: the real ``wait()`` would block the host until the
        collective is done (``TORCH_NCCL_BLOCKING_WAIT=1``, whose wait aborts
        on an error or its timeout; a barrier).  Then the end is polled here
        first, as the optimizer pre-step polls: a safe point where the thread
        parks if a JIT save waits (unless the optimizer phase has applied part
        of the update), with the hang timeout in charge of a collective that
        never ends, and NCCL's errors read from the process group
        (``watchdog.communicator_errors``).  Unverified on GPU (fakes of
        NCCL's Work in tests/test_runtime_hooks.py).
        """
        delay = 0.0002
        while True:
            with self._lock:
                handle = self._polled.get(token)
                failed = handle is None and token in self._in_flight  # _failed() keeps it in flight
            if failed:
                self.park_forever()  # its error raised the JIT event already
            if handle is None:
                return wait()  # retired: it completed without an error
            with handle.lock:
                done, error = handle.query()
                if error is None and (done or not host_blocking):
                    try:
                        result = wait()
                        break
                    except Exception as exc:  # torch's wait raised: the collective failed
                        error = exc
            if error is not None:
                with self._lock:
                    what = self._in_flight.get(token, (0.0, "a collective"))[1]
                self._collective_failed(token, error, what)
                self.park_forever()
            self.park_if_requested()
            time.sleep(delay)
            delay = min(2 * delay, 0.01)
        self._retire_if_complete(token)
        return result

    def poll_collectives(self) -> None:
        """Watchdog thread: retire the polled collectives that completed (a failed one is a JIT event).

        Each query runs in relaxed CUDA stream-capture mode (``work_state``), so that it
        cannot invalidate a CUDA graph another thread is capturing.
        """
        with self._lock:
            tokens = list(self._polled)
        for token in tokens:
            self._retire_if_complete(token)

    def wait_for_gradient_collectives(self) -> None:
        """Block until the gradient collectives of this minibatch have completed (first thing in every optimizer pre-step).

        On NCCL the host gets here while DDP's all-reduce may still run on the
        device: without this wait it would move step counters, learning rate
        and RNG ahead of the device state.  On gloo the all-reduce's future
        callback has already retired them (one set look-up, nothing else).
        The wait polls completion, so the hang timeout still applies, and the
        thread parks here if a JIT save is waiting: the state is the start of
        this minibatch.  Once past it, the training thread is marked as having
        entered the optimizer pre-step of this minibatch (``_safe_to_save``).
        """
        if self._gradient:
            delay = 0.0002
            while True:
                with self._lock:
                    polled = [token for token in self._gradient if token in self._polled]
                for token in polled:
                    self._retire_if_complete(token)
                with self._lock:
                    if not self._gradient:
                        break
                self.park_if_requested()
                time.sleep(delay)
                delay = min(2 * delay, 0.01)
        self._optimizer_entered_for = self.step

    def oldest_in_flight(self) -> tuple[float, str] | None:
        with self._lock:
            return min(self._in_flight.values(), default=None)

    def collective_finished(self, token: int, error: BaseException | None, what: str) -> None:
        """A tracked collective's completion path ran: its future completed, or its wait returned.

        On error: raise a JIT event; the collective stays in flight and the
        thread parks for good.  Otherwise park if a JIT save is waiting, then
        retire the collective if it has finished (with a polled Work, NCCL,
        that is usually later: the watchdog or the optimizer pre-step
        retires it).

        Only two kinds of thread park here.  The training thread.  And a
        callback thread of a collective whose future is its end (gloo's worker
        thread): it parks before untracking, so the collective stays in flight
        and the training thread, waiting for that future in backward, is held
        at the start of the minibatch.  Any other thread (an autograd device
        thread running an NCCL collective's callback inline) returns: the
        collective is in flight until its Work completes whatever that thread
        does, and a parked thread there would hold the training thread in
        backward while the collective completes, where it is no safe point.
        On error such a thread returns too (the caller decides what to return).
        """
        with self._lock:
            polled = token in self._polled
        may_park = not polled or threading.current_thread() is self.main_thread
        if error is not None:
            self._collective_failed(token, error, what)
            if may_park:
                self.park_forever()
            return
        if may_park:
            # Park before retiring: the collective then still counts as in flight,
            # which tells the save thread that this step cannot reach the optimizer.
            self.park_if_requested()
        self._retire_if_complete(token)

    # ----- parking --------------------------------------------------------------------

    def park_if_requested(self) -> None:
        """Park here if a JIT save is waiting, unless the state here is half applied.

        Inside an optimizer phase that has applied part of the update (ZeRO's
        parameter broadcast after its local step, a generator's backward after
        the discriminator's step) training goes on instead, to the next safe
        point after the minibatch's last optimizer step, whose state is the
        start of the next minibatch.  If a dead peer stops it on the way, the
        save is refused (``_refusal``).
        """
        if self.park_requested.is_set() and self.state_consistent():
            self.park_forever()

    def park_forever(self) -> None:
        """Block this thread until the process exits after the JIT save.

        Every thread parked here counts (``threads_parked``), not only the
        training thread: DDP's comm hook runs on an autograd device thread
        during ``backward()``, and a thread parked at a collective's entry
        holds that collective, so the minibatch cannot get past it.
        """
        thread = threading.current_thread()
        with self._lock:
            self._parked[thread.ident or 0] = thread.name
        if thread is self.main_thread:
            self.main_parked.set()
        threading.Event().wait()

    def threads_parked(self, main: bool = True) -> list[str]:
        """The names of the threads parked for good (``main=False``: other than the training thread)."""
        with self._lock:
            return [name for ident, name in self._parked.items() if main or ident != self.main_thread.ident]

    def main_thread_in_collective(self) -> bool:
        """True if the training thread is blocked in a collective that jitckpt does not track.

        Such a collective (DDP's buffer broadcast ``_broadcast_coalesced`` at the
        start of a forward, send/recv, coalesced collectives) has no completion
        path that parks, so the old rule "the innermost Python frame is in
        torch/distributed or DDP" called states safe that were not:

        - a thread merely passing through such a frame (DDP's ``_pre_forward``,
          DTensor's dispatch inside an optimizer step, ZeRO's own file) is
          running, and goes on to update BatchNorm statistics, or parameters;
        - a blocked collective whose peers are alive (a preemption's SIGTERM)
          completes, and the thread runs the forward (BatchNorm) while the
          save is writing.

        Now the innermost frame must be a call site that blocks in a collective
        (``_BLOCKING_CALL_SITES``), seen at the same instruction for
        ``_BLOCKED_FOR`` seconds, with no optimizer step or GradScaler step on
        the stack; and before it answers True, a global module forward
        pre-hook is armed that parks the thread at the next forward (its
        state there is still the start of the minibatch), so a collective that
        does complete leads to a park, not into the model.
        """
        frame = sys._current_frames().get(self.main_thread.ident)
        if frame is None or not _at_blocking_call_site(frame) or _inside_optimizer_step(frame):
            self._blocked_at = None
            return False
        key = (id(frame), frame.f_code, frame.f_lasti)
        now = time.monotonic()
        if self._blocked_at is None or self._blocked_at[0] != key:
            self._blocked_at = (key, now)
            return False
        if now - self._blocked_at[1] < _BLOCKED_FOR:
            return False
        self._park_at_next_forward()
        frame = sys._current_frames().get(self.main_thread.ident)  # still there, now that the hook is armed?
        return frame is not None and (id(frame), frame.f_code, frame.f_lasti) == key

    def _park_at_next_forward(self) -> None:
        if self._forward_park_hook is None:
            from torch.nn.modules.module import register_module_forward_pre_hook

            self._forward_park_hook = register_module_forward_pre_hook(lambda module, args: self.park_if_requested())

    def _gradient_collective_in_flight(self) -> bool:
        """True while a gradient collective whose future is its end (gloo) is in flight.

        The thread in that backward cannot leave it: backward waits for the
        future, and its completion callback parks (or, on error, never
        completes it).  A polled one (NCCL) holds nothing: its future
        completed when it was enqueued, and the host runs on.
        """
        with self._lock:
            return any(token not in self._polled for token in self._gradient)

    def _safe_to_save(self, reason: JitReason) -> bool:
        if not self.state_consistent():
            # Part of this minibatch's update is applied: never saved (see _refusal), whatever
            # reported the event (a GAN's D stepped, G's backward hung: D's step is no start).
            return False
        if reason.from_device:
            # The C watchdog saw a CUDA event after an NCCL kernel never complete:
            # the device work that would update parameters is queued behind it
            # (cudaStreamWaitEvent), whatever the host thread is doing.
            return True
        if self.main_parked.is_set():
            return True
        if self.optimizer_phase.in_phase:
            # Inside an optimizer step that has changed nothing yet (a closure's forward
            # and backward): only a thread held in backward cannot change a parameter next.
            return self._gradient_collective_in_flight()
        if self._optimizer_entered_for == self.step:
            # Past the pre-step's wait for this minibatch's gradients, on its way into the
            # optimizer phase: it parks there (a save is requested), but has not yet.
            return False
        # The training thread has not passed this minibatch's optimizer pre-step, and
        # it cannot pass it without parking (park_requested is set) or while a gradient
        # collective is incomplete (wait_for_gradient_collectives).  So a collective in
        # flight (until its Work completes: on NCCL the host runs ahead of it and blocks
        # at whatever consumes its data, in any frame) means the state is the start of
        # this minibatch wherever the thread is blocked; a thread stuck in an untracked
        # blocking collective outside the optimizer step is equally unable to modify state.
        # So is a thread parked at a collective's entry before issuing it (DDP's comm hook on an
        # autograd thread, the training thread in backward() or in next(loader)): the
        # minibatch cannot get past that collective.
        return (self.oldest_in_flight() is not None or bool(self.threads_parked(main=False))
                or self.main_thread_in_collective())

    def _refusal(self) -> str | None:
        """Why no consistent state can be reached any more, or None while one still may be.

        The state is half applied and the training thread will not move on to
        the end of the minibatch: it is parked (at an error, or at exit after
        an uncaught one), or a collective has been in flight past the hang
        timeout.  Waiting would only use up the grace period.
        """
        if self.state_consistent():
            return None
        in_flight = self.oldest_in_flight()
        if self.main_parked.is_set() or (in_flight is not None and time.monotonic() - in_flight[0] > self.hang_timeout):
            return self.optimizer_phase.describe()
        return None

    def _refuse(self, why: str) -> None:
        """Exit without a save: the job falls back to an older checkpoint (or starts afresh)."""
        log(f"refusing to save minibatch {self.step}: {why}; exiting without a save (the job falls back "
            f"to an older checkpoint)")
        eventlog.record("jit_save_failed", rank=self.rank, attempt=self.attempt, error=f"half-applied step refused: {why}")
        self._leave(config.JIT_SAVE_FAILED_EXIT_CODE)

    # ----- the JIT event ---------------------------------------------------------------

    def trigger(self, reason: JitReason, detail: str) -> None:
        """Raise a JIT event (once per process): park training, save from a new thread, exit."""
        if self._begin_jit(reason, detail):
            threading.Thread(target=self._save_and_exit, args=(reason, detail), name="jitckpt-save", daemon=True).start()

    def trigger_in_this_thread(self, reason: JitReason, detail: str) -> None:
        """Raise a JIT event and save on the calling thread (which must be at a safe point); never returns."""
        if not self._begin_jit(reason, detail):
            self.park_forever()
        if not self.state_consistent():
            self._refuse(self.optimizer_phase.describe())
        self._leave(save.save_checkpoint(self, reason, detail))

    def _begin_jit(self, reason: JitReason, detail: str) -> bool:
        with self._lock:
            if self._jit_started:
                return False
            self._jit_started = True
        self.park_requested.set()
        detected = time.time()
        in_flight = self.oldest_in_flight()
        eventlog.record(
            "jit_detected",
            rank=self.rank,
            attempt=self.attempt,
            reason=reason.value,
            detail=detail,
            step=self.step,
            phase=self.phase,
            collective_since=None if in_flight is None else detected - (time.monotonic() - in_flight[0]),
        )
        log(f"JIT event: {reason} ({detail}) at minibatch {self.step}, phase {self.phase}")
        return True

    def _save_and_exit(self, reason: JitReason, detail: str) -> None:
        # Half the grace period at most: the save itself must still fit before torchrun's SIGKILL.
        deadline = time.monotonic() + self.save_grace / 2
        while not self._safe_to_save(reason):
            refusal = self._refusal()
            if refusal is not None:
                self._refuse(refusal)
            if time.monotonic() > deadline:
                log(f"no safe point reached within {self.save_grace / 2:.0f}s (phase {self.phase}); exiting without a save")
                eventlog.record("jit_save_failed", rank=self.rank, attempt=self.attempt, error="no safe point reached")
                self._leave(config.JIT_SAVE_FAILED_EXIT_CODE)
            time.sleep(0.01)
        self._wait_for_earlier_minibatches(deadline)
        self._leave(save.save_checkpoint(self, reason, detail))

    def _leave(self, code: int) -> None:
        """End this worker after its JIT event, once the memory tier handed over what it holds for others."""
        try:
            if self.memory_tier is not None:
                self.memory_tier.hand_over(self, self.step if code == config.JIT_SAVED_EXIT_CODE else None)
        finally:
            os._exit(code)

    def _wait_for_earlier_minibatches(self, deadline: float) -> None:
        """Before saving "start of minibatch i": every collective issued in an earlier minibatch has completed.

        The optimizer step of minibatch i-1 may issue collectives that change
        parameters (ZeRO's broadcast of each owner's updated shard); on NCCL
        and NCCL-like backends the host is past them at enqueue and may reach
        a safe point of minibatch i (a preemption's park in its forward)
        while they are still on the device.  A save then would hold other
        ranks' shards as they were before i-1's update: a resume that is
        silently wrong (found with ZeRO and SIGTERM in the forward on the
        ``ncclorder`` test backend).  So the save waits for them (polling,
        as the optimizer pre-step does); one that failed, or that is still
        in flight at the save's deadline, means this rank's parameters are
        partly updated: the save is refused.
        """
        why = self.earlier_minibatches_settled(deadline)
        if why is not None:
            self._refuse(why)

    def earlier_minibatches_settled(self, deadline: float, poll: float = 0.005) -> str | None:
        """Wait until every collective issued in an earlier minibatch has completed; None then, else why not
        (one failed, or one is still in flight at ``deadline``): see ``_wait_for_earlier_minibatches``."""
        while True:
            with self._lock:
                earlier = [t for t, step in self._issued_in.items() if step < self.step]
                failed = [self._in_flight[t][1] for t in earlier if t in self._failed_tokens]
                polled = [t for t in earlier if t in self._polled]
            if failed:
                return (f"{failed[0]}, issued in an earlier minibatch, failed: the parameters it would "
                        f"have updated are not those of minibatch {self.step}")
            for token in polled:  # the others end through their completion path (a future's callback)
                self._retire_if_complete(token)
            with self._lock:
                left = [self._in_flight[t][1] for t, step in self._issued_in.items() if step < self.step]
            if not left:
                return None
            if time.monotonic() > deadline:
                return (f"{left[0]}, issued in an earlier minibatch, has not completed: the parameters it "
                        f"updates may not be those of minibatch {self.step}")
            time.sleep(poll)

    def jit_event_started(self) -> bool:
        """True once a JIT event has been raised in this process (its save thread then ends the process)."""
        with self._lock:
            return self._jit_started

    def record_exit(self) -> None:
        """Record how this worker's script ended (see jitckpt.worker.shutdown)."""
        eventlog.record(
            "worker_exit",
            rank=self.rank,
            attempt=self.attempt,
            step=self.step,
            mean_minibatch_seconds=self.mean_minibatch_seconds(),
            script_succeeded=shutdown.script_succeeded(),
        )


class PolledWork:
    """A collective's Work whose end the runtime reads from ``is_completed()``, queried by one thread at a time.

    ``lock`` is held by every query and, in ``JitRuntime.wait_for_work``,
    across a query and the Work's real ``wait()``; the watchdog and the
    optimizer pre-step skip a Work whose lock is held (``state``).
    """

    __slots__ = ("work", "lock")

    def __init__(self, work: Any) -> None:
        self.work = work
        self.lock = threading.Lock()

    def query(self) -> tuple[bool, BaseException | None]:
        """``work_state(work)``; the caller holds ``lock``."""
        return work_state(self.work)

    def state(self, blocking: bool) -> tuple[bool, BaseException | None] | None:
        """``query()`` under the lock; None if another thread holds it and ``blocking`` is False."""
        if not self.lock.acquire(blocking=blocking):
            return None
        try:
            return self.query()
        finally:
            self.lock.release()


def work_state(work: Any) -> tuple[bool, BaseException | None]:
    """(completed, error) of a ``torch.distributed`` Work, without blocking.

    ``work`` is a Work or a handle with the same two methods
    (``instrument._StreamEnd``: an event after an NCCL collective).  The query
    runs in relaxed CUDA stream-capture mode (``relaxed_capture_mode``).
    """
    try:
        with relaxed_capture_mode():
            if not work.is_completed():
                return False, None
            error = _work_error(work)
    except Exception as exc:  # a failed work may raise from its accessors
        return True, exc
    if error is None or isinstance(error, BaseException):
        return True, error
    return True, RuntimeError(str(error))


def _work_error(work: Any) -> Any:
    """The error a completed Work ended with, or None.

    A C++ Work's ``exception()`` cannot be called from Python (its binding
    returns a ``std::exception_ptr`` pybind cannot convert: TypeError, for a
    healthy Work too), and ``WorkNCCL::isSuccess()`` raises "deprecated" (both
    seen with torch 2.11 on an H100).  So ``is_success()`` answers where it
    can, and otherwise no error is read here: NCCL's Works are not polled
    (``instrument._work_to_poll`` polls an event after them) and its errors
    are the process group's (``get_error()``).  Python Works (the
    ``ncclorder`` test backend) answer ``exception()``.
    """
    try:
        return work.exception()
    except TypeError:
        pass
    try:
        success = work.is_success()
    except Exception:
        return None
    return None if success else RuntimeError("the collective completed with an error (see the process group's log)")


# cudaStreamCaptureMode / CUstreamCaptureMode values.
CAPTURE_MODE_RELAXED = 2


@contextlib.contextmanager
def relaxed_capture_mode() -> Iterator[None]:
    """Run the body with this thread in relaxed CUDA stream-capture mode (nothing to do where CUDA never started).

    A Work's ``is_completed()`` queries a CUDA event (``cudaEventQuery``), a
    call that is illegal while another thread captures a CUDA graph in the
    default (global) mode: it fails and invalidates that capture.  Torch's own
    NCCL watchdog switches its thread's mode for its queries
    (``CUDAStreamCaptureModeGuard``); torch exposes no Python binding for it,
    so the driver's ``cuThreadExchangeStreamCaptureMode`` is called through
    ctypes.  Relaxed rather than thread-local: the training thread polls too
    (the optimizer pre-step, a guarded ``wait()``), possibly inside its own
    capture, where only relaxed mode permits the query of an event recorded
    before the capture began (works enqueued during a capture are never
    polled: ``instrument._work_to_poll``).  Checked on an H100 and an H200
    (torch 2.11): such a query, from another thread or from the capturing
    one, invalidated a global-mode capture without this and left it intact
    with it; about 5 us a query.  Not run by CI (no GPU).
    """
    exchange = _capture_mode_exchange()
    previous = None if exchange is None else exchange(CAPTURE_MODE_RELAXED)
    try:
        yield
    finally:
        if previous is not None:
            exchange(previous)  # type: ignore[misc]


def _capture_mode_exchange() -> Callable[[int], int | None] | None:
    """The per-thread capture-mode exchange, or None before CUDA is initialised (checked at no cost)."""
    cuda = sys.modules.get("torch.cuda")
    if cuda is None or not cuda.is_initialized():
        return None
    return _driver_capture_mode_exchange()


@functools.cache
def _driver_capture_mode_exchange() -> Callable[[int], int | None] | None:
    """``cuThreadExchangeStreamCaptureMode`` of the CUDA driver the process has loaded, or None without one."""
    try:
        function = ctypes.CDLL("libcuda.so.1").cuThreadExchangeStreamCaptureMode
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.POINTER(ctypes.c_int)]
    function.restype = ctypes.c_int

    def exchange(mode: int) -> int | None:
        """Set this thread's mode to ``mode``; returns the one it had, or None if the driver refused."""
        value = ctypes.c_int(mode)
        return value.value if function(ctypes.byref(value)) == 0 else None

    return exchange


# main_thread_in_collective: (path suffix, function names or None for any) of the Python frames a
# thread blocked in an untracked collective has on top.
_BLOCKING_CALL_SITES: tuple[tuple[str, frozenset[str] | None], ...] = (
    ("/torch/distributed/distributed_c10d.py", None),  # the Python API waits on its work there
    ("/torch/nn/parallel/distributed.py", frozenset({"_distributed_broadcast_coalesced"})),  # DDP's buffer sync
    ("/torch/distributed/utils.py", frozenset({"_sync_params_and_buffers"})),  # DDP's construction
    ("/torch/distributed/_functional_collectives.py", frozenset({"wait_tensor"})),
)
_BLOCKED_FOR = 0.05  # seconds at one instruction: blocked in the call, not passing through


def _at_blocking_call_site(frame: Any) -> bool:
    filename = frame.f_code.co_filename.replace("\\", "/")
    for suffix, functions in _BLOCKING_CALL_SITES:
        if filename.endswith(suffix):
            return functions is None or frame.f_code.co_name in functions
    return False


def _inside_optimizer_step(frame: Any) -> bool:
    """True if an optimizer's step (torch.optim's hooked wrapper) or a GradScaler step is on the stack."""
    while frame is not None:
        filename = frame.f_code.co_filename.replace("\\", "/")
        name = frame.f_code.co_name
        if (filename.endswith("/torch/optim/optimizer.py") and name == "wrapper") or (
                filename.endswith("/torch/amp/grad_scaler.py") and name == "step"):
            return True
        frame = frame.f_back
    return False
