"""The per-worker JIT runtime: minibatch phase, in-flight collectives, and the JIT save.

One ``JitRuntime`` exists per worker process launched by jit-run.  The
instrumentation (``jitckpt.instrument``) reports events to it: optimizer steps,
collectives entering and leaving, collective errors.  The watchdog
(``jitckpt.watchdog``) reports timeouts and SIGTERM.  Any of those can raise a
*JIT event*; the runtime then

1. asks the training thread to park at the next safe point (a collective or
   the optimizer pre-step hook) so that no parameter changes under the save;
2. waits until the training thread is parked, or provably stuck inside a
   collective outside the optimizer step (paper §3.3: the state is then the
   start of minibatch i, or of i+1 if the failure hit the optimizer step);
3. calls the user's ``save(path)`` from its own thread, into a per-rank
   directory, with no collective;
4. copies this host's RNG stashes into the checkpoint, commits it atomically
   with its metadata, and exits with ``JIT_SAVED_EXIT_CODE`` so that torchrun
   restarts the job.
"""

from __future__ import annotations

import itertools
import os
import pickle
import re
import shutil
import sys
import threading
import time
import traceback
import warnings
from pathlib import Path
from typing import Any, Callable

from jitckpt import checkpoint_store, config, ddp_layout, events, faults, module_buffers, rng_state, shutdown

SaveFunction = Callable[[str], Any]


def log(message: str) -> None:
    """Print a jitckpt message prefixed with this worker's rank."""
    print(f"[jitckpt rank {os.environ.get('RANK', '?')}] {message}", file=sys.stderr, flush=True)


def short_error(error: BaseException) -> str:
    """The gist of a backend error: first line, without source paths and boilerplate advice."""
    text = str(error).splitlines()[0] if str(error) else type(error).__name__
    text = re.sub(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*", "", text)
    return text.split(". This is typically caused")[0]


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
        self.coords = checkpoint_store.ParallelCoordinates.from_layout(
            self.rank,
            self.world_size,
            tp_size=int(os.environ.get(config.ENV_TP_SIZE, "1")),
            pp_size=int(os.environ.get(config.ENV_PP_SIZE, "1")),
        )
        self.checkpoint_root = Path(os.environ.get(config.ENV_CHECKPOINT_DIR, config.DEFAULT_CHECKPOINT_DIR))
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
        self._step_started = time.monotonic()
        self._step_seconds_total = 0.0
        self._steps_timed = 0
        self._first_step_after_start = True
        self.training_started = False  # set at this attempt's first collective or optimizer step
        self._located = False
        self._checkpoint: checkpoint_store.CheckpointInfo | None = None

        self._lock = threading.Lock()
        self._in_flight: dict[int, tuple[float, str]] = {}
        self._tokens = itertools.count()
        self.park_requested = threading.Event()
        self.main_parked = threading.Event()
        self._jit_started = False
        self.main_thread = threading.main_thread()
        events.record("worker_start", rank=self.rank, attempt=self.attempt, world_size=self.world_size,
                      rendezvous_round=os.environ.get(config.ENV_RENDEZVOUS_ROUND))

    # ----- minibatch phase ------------------------------------------------------------

    def optimizer_pre_step(self, optimizer: object) -> None:
        """Called before every optimizer.step(): a safe point, then the optimizer phase."""
        if self._is_primary(optimizer):
            self.park_if_requested()
            self.training_started = True
            self.phase = "optimizer"
            # Stash the RNG state minibatch step+1 starts with now, before the step:
            # if this rank dies inside it, the replicas save step+1 (the optimizer
            # and scheduler draw no random numbers, so this is that state).
            self._stash_rng(self.step + 1)
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
            events.record("first_step_done", rank=self.rank, attempt=self.attempt, step=self.step, resumed_from=self.resumed_from)
        self._step_started = now

    def _is_primary(self, optimizer: object) -> bool:
        # With several optimizers (GANs, ...) the first one that steps counts minibatches.
        if self._primary_optimizer is None:
            self._primary_optimizer = id(optimizer)
        return self._primary_optimizer == id(optimizer)

    def _stash_rng(self, step: int) -> None:
        if self.stash is not None:
            self.stash.put(step, rng_state.capture())

    def mean_minibatch_seconds(self) -> float | None:
        return self._step_seconds_total / self._steps_timed if self._steps_timed else None

    # ----- collectives ----------------------------------------------------------------

    def collective_entry(self, what: str) -> None:
        """A collective is about to be issued by the training thread: a safe point."""
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
            self.trigger("peer-error", f"{what} failed: {short_error(error)}")
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

    def _safe_to_save(self, reason: str) -> bool:
        if self.main_parked.is_set():
            return True
        if reason.startswith("cuda-"):
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

    def trigger(self, reason: str, detail: str) -> None:
        """Raise a JIT event (once per process): park training, save from a new thread, exit."""
        if self._begin_jit(reason, detail):
            threading.Thread(target=self._save_and_exit, args=(reason, detail), name="jitckpt-save", daemon=True).start()

    def trigger_in_this_thread(self, reason: str, detail: str) -> None:
        """Raise a JIT event and save on the calling thread (which must be at a safe point); never returns."""
        if not self._begin_jit(reason, detail):
            self.park_forever()
        os._exit(self.save_now(reason, detail))

    def _begin_jit(self, reason: str, detail: str) -> bool:
        with self._lock:
            if self._jit_started:
                return False
            self._jit_started = True
        self.park_requested.set()
        detected = time.time()
        in_flight = self.oldest_in_flight()
        events.record(
            "jit_detected",
            rank=self.rank,
            attempt=self.attempt,
            reason=reason,
            detail=detail,
            step=self.step,
            phase=self.phase,
            collective_since=None if in_flight is None else detected - (time.monotonic() - in_flight[0]),
        )
        log(f"JIT event: {reason} ({detail}) at minibatch {self.step}, phase {self.phase}")
        return True

    def _save_and_exit(self, reason: str, detail: str) -> None:
        # Half the grace period at most: the save itself must still fit before torchrun's SIGKILL.
        deadline = time.monotonic() + self.save_grace / 2
        while not self._safe_to_save(reason):
            if time.monotonic() > deadline:
                log(f"no safe point reached within {self.save_grace / 2:.0f}s (phase {self.phase}); exiting without a save")
                events.record("jit_save_failed", rank=self.rank, attempt=self.attempt, error="no safe point reached")
                os._exit(config.JIT_SAVE_FAILED_EXIT_CODE)
            time.sleep(0.01)
        code = self.save_now(reason, detail)
        os._exit(code)

    def save_now(self, reason: str, detail: str) -> int:
        """Run the user's save into a pending rank directory and commit it; returns the exit code."""
        if self.resumed_from is not None and not self.training_started:
            log(f"JIT event before this attempt resumed training: the checkpoint of minibatch {self.resumed_from} "
                f"it was loading from is still the newest; nothing new to save")
            events.record("jit_save_failed", rank=self.rank, attempt=self.attempt, error="training had not resumed yet")
            return config.JIT_SAVE_FAILED_EXIT_CODE
        if self.save_fn is None:
            log("JIT event but no save function registered (call jitckpt.register_save_checkpoint); nothing saved")
            events.record("jit_save_failed", rank=self.rank, attempt=self.attempt, error="no save function registered")
            return config.JIT_SAVE_FAILED_EXIT_CODE
        started = time.time()
        step, phase = self.step, self.phase
        pending = None
        try:
            pending = checkpoint_store.PendingSave(self.checkpoint_root, step, self.coords)
            # Forward passes of this minibatch may have updated BatchNorm statistics.
            buffers_rewound = self.buffer_snapshots.rewind(step)
            _saving.active = True
            _interposer_save_mode(True)
            try:
                self.save_fn(str(pending.path))
            finally:
                _saving.active = False
                _interposer_save_mode(False)
            self.injector.maybe_fire("save", step)
            rng_files = self._copy_rng_stashes(pending.path, step)
            ddp_layout.write(pending.path)
            final = pending.commit(
                {
                    "reason": reason,
                    "detail": detail,
                    "phase_at_detection": phase,
                    "saved_state": f"start of minibatch {step}",
                    "attempt": self.attempt,
                    "rng_ranks": rng_files,
                    "module_buffers_rewound": buffers_rewound,
                }
            )
        except BaseException as exc:  # report, keep the partial dir out of sight, exit non-zero
            log(f"JIT save failed: {type(exc).__name__}: {exc}")
            traceback.print_exc()
            events.record("jit_save_failed", rank=self.rank, attempt=self.attempt, error=f"{type(exc).__name__}: {exc}")
            return config.JIT_SAVE_FAILED_EXIT_CODE
        seconds = time.time() - started
        events.record("jit_saved", rank=self.rank, attempt=self.attempt, step=step, path=str(final), seconds=seconds, phase=phase)
        log(f"JIT checkpoint of minibatch {step} committed to {final} in {seconds:.2f}s")
        return config.JIT_SAVED_EXIT_CODE

    def _copy_rng_stashes(self, directory: Path, step: int) -> list[int]:
        """Copy every local rank's RNG state for ``step`` (dead ranks included) into the checkpoint."""
        if self.shm_dir is None or not self.shm_dir.is_dir():
            return []
        out = directory / "jitckpt-rng"
        out.mkdir(exist_ok=True)
        ranks = []
        for stash in sorted(self.shm_dir.glob("rng-rank-*.bin")):
            payload = rng_state.read_stash(stash).get(step)
            if payload is None:
                continue
            rank = int(stash.stem.rsplit("-", 1)[1])
            (out / f"rank-{rank:05d}.pkl").write_bytes(payload)
            ranks.append(rank)
        return ranks

    # ----- resume ---------------------------------------------------------------------

    def locate_checkpoint(self) -> checkpoint_store.CheckpointInfo | None:
        """Find (once) the checkpoint this rank resumes from; warnings about skipped ones are printed."""
        if self._located:
            return self._checkpoint
        allow = os.environ.get(config.ENV_ALLOW_WORLD_SIZE_CHANGE) == "1"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", checkpoint_store.CheckpointWarning)
            info = checkpoint_store.find_checkpoint(self.checkpoint_root, self.coords, allow_world_size_change=allow)
        for warning in caught:
            log(f"warning: {warning.message}")
        self._checkpoint, self._located = info, True
        if info is not None:
            ddp_layout.load(info.path)
        return info

    def resume_from(self, info: checkpoint_store.CheckpointInfo) -> None:
        """Adopt a checkpoint's step and restore this rank's own RNG state from it."""
        self.step = info.step
        self.resumed_from = info.step
        payload = self._find_rng_payload(info)
        if payload is not None:
            rng_state.restore(pickle.loads(payload))
        else:
            log(
                f"no RNG state for rank {self.rank} at minibatch {info.step} in any replica "
                f"(its host was lost?); the redone minibatch will draw different random numbers"
            )
        self._stash_rng(self.step)
        events.record("resumed", rank=self.rank, attempt=self.attempt, step=info.step, path=str(info.path), rng_restored=payload is not None)

    def _find_rng_payload(self, info: checkpoint_store.CheckpointInfo) -> bytes | None:
        name = f"jitckpt-rng/rank-{self.rank:05d}.pkl"
        if name in info.meta.get("files", {}):
            return (info.path / name).read_bytes()
        for other in sorted(info.path.parent.iterdir()):
            if other == info.path or other.name.startswith("."):
                continue
            meta_ok = checkpoint_store.verify(other, check_content=False)
            if meta_ok and name in meta_ok.meta.get("files", {}):
                return (other / name).read_bytes()
        return None

    def fresh_start(self) -> None:
        self._stash_rng(self.step)
        events.record("fresh_start", rank=self.rank, attempt=self.attempt)

    def jit_event_started(self) -> bool:
        """True once a JIT event has been raised in this process (its save thread then ends the process)."""
        with self._lock:
            return self._jit_started

    def record_exit(self) -> None:
        """Record how this worker's script ended (see jitckpt.shutdown)."""
        events.record(
            "worker_exit",
            rank=self.rank,
            attempt=self.attempt,
            step=self.step,
            mean_minibatch_seconds=self.mean_minibatch_seconds(),
            script_succeeded=shutdown.script_succeeded(),
        )


class _SaveFlag(threading.local):
    active = False


_saving = _SaveFlag()


def _interposer_save_mode(active: bool) -> None:
    """Tell the interposition library (if preloaded) that this thread's CUDA copies belong to a JIT save.

    During a save, copies on the legacy default stream or on streams blocked
    behind the hung collective are redirected to a fresh stream (DESIGN decision 4).
    """
    try:
        from jitckpt import interpose
    except ImportError:
        return
    if interpose.is_loaded():
        interpose.save_in_progress(active)


def in_jit_save() -> bool:
    """True on the thread that is running the user's save function."""
    return _saving.active


def cleanup_shm(shm_dir: str | os.PathLike) -> None:
    shutil.rmtree(shm_dir, ignore_errors=True)
