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

import itertools
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from jitckpt import config, eventlog, faults
from jitckpt.jit_event import JitReason
from jitckpt.store import CheckpointInfo, DiskStore, ParallelCoordinates
from jitckpt.worker import module_buffers, rng_state, save, shutdown
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
        self.store = DiskStore(self.checkpoint_root)
        self.hang_timeout = config.env_float(config.ENV_HANG_TIMEOUT, config.DEFAULT_HANG_TIMEOUT)
        self.save_grace = config.env_float(config.ENV_SAVE_GRACE, config.DEFAULT_SAVE_GRACE)
        self.injector = faults.FaultInjector(faults.parse(os.environ.get(config.ENV_FAULT, "")), self.rank, self.attempt)
        shm_dir = os.environ.get(config.ENV_SHM_DIR)
        self.shm_dir = Path(shm_dir) if shm_dir else None
        self.stash = rng_state.RngStash(self.shm_dir, self.rank) if self.shm_dir else None

        self.save_fn: SaveFunction | None = None
        self.buffer_snapshots = module_buffers.BufferSnapshots()
        self.step = 0  # optimizer steps completed == index of the minibatch in progress
        self.phase = "forward"
        self.resumed_from: int | None = None
        self._primary_optimizer: int | None = None
        self._next_rng_stashed: int | None = None  # step+1 once its RNG state is stashed at a gradient collective
        # After a resume: this rank's RNG state for the redone minibatch, put back when that minibatch starts.
        self.pending_rng: bytes | None = None
        self._pending_rng_hook: Any = None
        self._step_started = time.monotonic()
        self._step_seconds_total = 0.0
        self._steps_timed = 0
        self._first_step_after_start = True
        self.training_started = False  # set at this attempt's first collective or optimizer step
        self.located = False
        self.checkpoint: CheckpointInfo | None = None  # what this attempt resumes from (jitckpt.worker.resume)
        self.checkpoint_for: ParallelCoordinates | None = None  # identity it was selected for; None once loaded

        self._lock = threading.Lock()
        self._in_flight: dict[int, tuple[float, str]] = {}
        self._tokens = itertools.count()
        self.park_requested = threading.Event()
        self.main_parked = threading.Event()
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
        module forward (a global forward pre-hook, removed once it fired), or
        at the first tracked collective or optimizer step if no module runs.
        """
        from torch.nn.modules.module import register_module_forward_pre_hook

        self.pending_rng = payload
        if self._pending_rng_hook is None:
            self._pending_rng_hook = register_module_forward_pre_hook(lambda module, args: self.minibatch_starts())

    def take_pending_rng(self) -> bytes | None:
        """Claim the deferred state (a framework adapter restores it at its framework's own minibatch start)."""
        payload, self.pending_rng = self.pending_rng, None
        if self._pending_rng_hook is not None:
            self._pending_rng_hook.remove()
            self._pending_rng_hook = None
        return payload

    def minibatch_starts(self) -> None:
        """The redone minibatch starts: put its RNG state back (once)."""
        payload = self.take_pending_rng()
        if payload is not None:
            rng_state.restore(payload)

    # ----- minibatch phase (continued) ---------------------------------------------------

    def optimizer_pre_step(self, optimizer: object) -> None:
        """Called before every optimizer.step(): a safe point, then the optimizer phase."""
        if self.pending_rng is not None:
            self.minibatch_starts()
        if self._is_primary(optimizer):
            self.park_if_requested()
            self.training_started = True
            self.phase = "optimizer"
            # Stash the RNG state minibatch step+1 starts with now, before the step:
            # if this rank dies inside it, the replicas save step+1 (the optimizer
            # and scheduler draw no random numbers, so this is that state).
            self.stash_rng(self.step + 1)
            self.injector.maybe_fire("optimizer", self.step)

    def optimizer_post_step(self, optimizer: object) -> None:
        """Called after every optimizer.step(): the minibatch is complete."""
        if not self._is_primary(optimizer):
            return
        self.step += 1
        self.phase = "forward"
        # (the pre-step hook already stashed the RNG state this minibatch starts with)
        now = time.monotonic()
        if not self._first_step_after_start:
            self._step_seconds_total += now - self._step_started
            self._steps_timed += 1
        else:
            self._first_step_after_start = False
            eventlog.record("first_step_done", rank=self.rank, attempt=self.attempt, step=self.step, resumed_from=self.resumed_from)
        self._step_started = now

    def _is_primary(self, optimizer: object) -> bool:
        # With several optimizers (GANs, ...) the first one that steps counts minibatches.
        if self._primary_optimizer is None:
            self._primary_optimizer = id(optimizer)
        return self._primary_optimizer == id(optimizer)

    def stash_rng(self, step: int) -> None:
        """Record the RNG state minibatch ``step`` starts with in this host's shared-memory stash."""
        if self.stash is not None:
            self.stash.put(step, rng_state.capture())

    def mean_minibatch_seconds(self) -> float | None:
        return self._step_seconds_total / self._steps_timed if self._steps_timed else None

    # ----- collectives ----------------------------------------------------------------

    def gradient_collective_entry(self, what: str) -> None:
        """The training thread issues a gradient collective of the current minibatch (DDP's all-reduce).

        The forward passes of this minibatch are over (with gradient
        accumulation too: DDP all-reduces during the last micro-batch's
        backward), so the RNG state minibatch step+1 starts with is final
        unless the script draws random numbers between backward() and
        optimizer.step().  Stash it now, once per minibatch: a rank that dies
        before its optimizer pre-step hook (in gradient clipping, logging, a
        GradScaler) is resumed by its replicas at step+1 with this state.
        """
        self.collective_entry(what)
        if self.phase != "optimizer" and self._next_rng_stashed != self.step + 1:
            self._next_rng_stashed = self.step + 1
            self.stash_rng(self.step + 1)

    def collective_entry(self, what: str) -> None:
        """A collective is about to be issued by the training thread: a safe point."""
        if self.pending_rng is not None:
            self.minibatch_starts()
        self.park_if_requested()
        self.training_started = True
        if self.phase != "optimizer":
            self.phase = "allreduce"
        self.injector.maybe_fire("allreduce", self.step)

    def track(self, what: str) -> int:
        token = next(self._tokens)
        with self._lock:
            self._in_flight[token] = (time.monotonic(), what)
        return token

    def untrack(self, token: int) -> None:
        with self._lock:
            self._in_flight.pop(token, None)

    def oldest_in_flight(self) -> tuple[float, str] | None:
        with self._lock:
            return min(self._in_flight.values(), default=None)

    def collective_finished(self, token: int, error: BaseException | None, what: str) -> None:
        """A tracked collective completed.  On error, raise a JIT event and never return."""
        if error is not None:
            self.trigger(JitReason.PEER_ERROR, f"{what} failed: {short_error(error)}")
            self.park_forever()
        # Park before untracking: the collective then still counts as in flight,
        # which tells the save thread that this step cannot reach the optimizer.
        self.park_if_requested()
        self.untrack(token)

    # ----- parking --------------------------------------------------------------------

    def park_if_requested(self) -> None:
        if self.park_requested.is_set():
            self.park_forever()

    def park_forever(self) -> None:
        """Block this thread until the process exits after the JIT save."""
        if threading.current_thread() is self.main_thread:
            self.main_parked.set()
        threading.Event().wait()

    def main_thread_in_collective(self) -> bool:
        """True if the training thread is, right now, inside a torch.distributed / DDP function.

        Only the innermost Python frame counts: a thread blocked in a collective's
        C++ wait has a torch.distributed function on top, while a thread running
        the model's forward under DDP has the model's code on top.
        """
        frame = sys._current_frames().get(self.main_thread.ident)
        if frame is None:
            return False
        filename = frame.f_code.co_filename.replace("\\", "/")
        return "/torch/distributed/" in filename or filename.endswith("/torch/nn/parallel/distributed.py")

    def _safe_to_save(self, reason: JitReason) -> bool:
        if self.main_parked.is_set():
            return True
        if reason.from_device:
            # The C watchdog saw a CUDA event after an NCCL kernel never complete:
            # the device work that would update parameters is queued behind it
            # (cudaStreamWaitEvent), whatever the host thread is doing.
            return True
        if self.phase == "optimizer":
            return False
        # A collective in flight holds the training thread before the optimizer
        # step (its completion path parks); a thread stuck in torch.distributed
        # code outside the optimizer step is equally unable to modify state.
        return self.oldest_in_flight() is not None or self.main_thread_in_collective()

    # ----- the JIT event ---------------------------------------------------------------

    def trigger(self, reason: JitReason, detail: str) -> None:
        """Raise a JIT event (once per process): park training, save from a new thread, exit."""
        if self._begin_jit(reason, detail):
            threading.Thread(target=self._save_and_exit, args=(reason, detail), name="jitckpt-save", daemon=True).start()

    def trigger_in_this_thread(self, reason: JitReason, detail: str) -> None:
        """Raise a JIT event and save on the calling thread (which must be at a safe point); never returns."""
        if not self._begin_jit(reason, detail):
            self.park_forever()
        os._exit(save.save_checkpoint(self, reason, detail))

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
            if time.monotonic() > deadline:
                log(f"no safe point reached within {self.save_grace / 2:.0f}s (phase {self.phase}); exiting without a save")
                eventlog.record("jit_save_failed", rank=self.rank, attempt=self.attempt, error="no safe point reached")
                os._exit(config.JIT_SAVE_FAILED_EXIT_CODE)
            time.sleep(0.01)
        os._exit(save.save_checkpoint(self, reason, detail))

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
