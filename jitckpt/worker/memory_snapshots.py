"""Per-minibatch snapshots of this rank's shard in host memory: the worker's side of the memory tier.

A JIT save needs a healthy replica of every shard.  In a sharded job (FSDP2,
ZeroRedundancyOptimizer) a rank's shard has none: when the rank dies, nobody
can save its state.  So every rank snapshots its own state, as of the start
of each minibatch, into the node's memory tier (``jitckpt.store.memory``:
host shared memory that outlives the workers, two snapshots per rank), and
the selection reads the snapshots as one more tier (``jitckpt.store.tiered``):
the lost rank's shard comes back in the format its own load reads, from its
own ``save(path)``.

When.  At the first training forward of every minibatch (a one-shot global
module forward pre-hook, armed when the previous minibatch's optimizer step
ends, and when the script asks for its checkpoint): the state is then that of
the start of the minibatch, and the script is inside the minibatch, exactly
where a JIT save during its forward or backward would find it, so the user's
own ``save(path)`` writes what such a JIT save writes (the parameters and
optimizer state the previous step left, the script's own step counter and
loader state for this minibatch).  A forward with gradients off (an
evaluation between minibatches) is not a minibatch's start and takes none.
The snapshot first waits for the previous minibatch's collectives to
complete (ZeRO's parameter broadcast after its step, which on NCCL the host
is past at enqueue: without the wait, the ``ncclorder`` test backend showed
a snapshot holding parameters from before that broadcast, and a resume from
it ended with wrong parameters).

Only the training thread of the process that armed the hook takes one (not a
forked DataLoader worker's transform, not another thread's forward), and not
after an optimizer of the minibatch has stepped (a GAN's second forward).

Which jobs.  ``auto`` (the default): single-node jobs of several ranks where
some rank's state has no copy on another rank (FSDP2, ZeroRedundancyOptimizer),
decided from the shard identity once the first optimizer exists, with
``/dev/shm`` writable; a DDP or HSDP job takes none.  In a multi-node job each
snapshot is also copied to a rank of another host (``jitckpt.worker.
memory_peers``), which hands it over to the shared file system at a JIT
event; a rank whose copies cannot be set up takes no snapshots.  ``on``: every job.
``off``: none (a lost shard then means the newest checkpoint that covers
every shard, often a fresh start).

What it costs.  One run of the user's save into memory per minibatch, on the
training thread, not overlapped with training (the save reads state that the
next forward may swap, FSDP2's unsharded parameters), with the training's
RNG state put back after it; its time and size are printed once, and rank 0
warns when it exceeds a tenth of a minibatch.  A snapshot that fails, or
that would leave less than one snapshot's size free in shared memory, turns
the tier off for this worker with a message; it never stops training.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jitckpt import config, eventlog
from jitckpt.store.memory import MemoryStore, peer_copies
from jitckpt.worker import ddp_layout, rng_state, save, sharding, stash
from jitckpt.store import CheckpointError
from jitckpt.worker.memory_peers import KEY_PREFIX as PEERS_KEY_PREFIX, HandOverError, PeerCopies, PeerError, is_multi_node
from jitckpt.worker.step_agreement import generation, job_store
from jitckpt.worker.console import log

if TYPE_CHECKING:
    from jitckpt.worker.runtime import JitRuntime

_COSTLY = 0.10  # a snapshot taking more than this fraction of a minibatch is worth a warning


class MemorySnapshots:
    """This worker's snapshots into the node's memory tier (see the module docstring)."""

    def __init__(self, shm_dir: Path, rank: int, mode: str = config.DEFAULT_MEMORY_TIER) -> None:
        if mode not in config.MEMORY_TIER_MODES:
            raise ValueError(f"{config.ENV_MEMORY_TIER} must be one of {', '.join(config.MEMORY_TIER_MODES)} "
                             f"(got {mode!r})")
        self.store = MemoryStore(shm_dir)
        self._checkpoint_root = Path(os.environ.get(config.ENV_CHECKPOINT_DIR, config.DEFAULT_CHECKPOINT_DIR))
        self.root = self.store.root
        self.rank = rank
        self.mode = mode
        self.needed: bool | None = None if mode == "auto" else mode == "on"
        self.failed = False
        self.taken = 0
        self.seconds = 0.0
        self.bytes = 0
        self._hook: Any = None
        self._armed_in: int | None = None  # the process that armed the hook (a forked DataLoader worker is not it)
        self._pruned_future = False
        self._warned_cost = False
        self.peers: PeerCopies | None = None  # a multi-node job's copies on another host (jitckpt.worker.memory_peers)
        self._peer_failing = False

    @classmethod
    def from_env(cls, shm_dir: Path | None, rank: int) -> "MemorySnapshots | None":
        """The tier as jit-run configured it, or None (no shared-memory directory, or ``off``)."""
        mode = os.environ.get(config.ENV_MEMORY_TIER, config.DEFAULT_MEMORY_TIER)
        if shm_dir is None or mode == "off":
            return None
        return cls(shm_dir, rank, mode)

    # ----- when ----------------------------------------------------------------------

    def arm(self, rt: "JitRuntime") -> None:
        """Minibatch ``rt.step`` is about to start: snapshot at its first training forward."""
        if self._hook is not None or self.failed or self.needed is False:
            return
        from torch.nn.modules.module import register_module_forward_pre_hook

        self._armed_in = os.getpid()
        self._hook = register_module_forward_pre_hook(lambda module, args: self._first_forward(rt))

    def _disarm(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def at_forward(self, rt: "JitRuntime") -> None:
        """A module forward starts: the snapshot now, if one is due (jit-run's ``--fault`` forward phase
        fires after it, as a fault inside the forward computation would)."""
        if self._hook is not None:
            self._first_forward(rt)

    def _first_forward(self, rt: "JitRuntime") -> None:
        import torch

        if os.getpid() != self._armed_in or threading.current_thread() is not rt.main_thread:
            return  # a forked DataLoader worker's transform, a forward on another thread: not the training step
        if not torch.is_grad_enabled():
            return  # an evaluation forward between minibatches: not a minibatch's start
        self._disarm()
        phase = rt.optimizer_phase
        if phase.in_phase or phase.done:
            return  # an optimizer of this minibatch has stepped already (a GAN's second forward): not its start
        self.take(rt)

    # ----- what ----------------------------------------------------------------------

    def _decide(self, rt: "JitRuntime") -> bool | None:
        """Whether this job needs snapshots (``auto``): once the first optimizer exists; None before."""
        if self.needed is not None:
            return self.needed
        if not sharding.optimizers():
            return None
        coords = sharding.refresh(rt)
        alone = coords.unreplicated_ranks() if coords.shardings and rt.world_size > 1 else []
        why_not = None
        if alone and self.root.parent.parent != Path("/dev/shm"):
            why_not = f"no writable host shared memory (/dev/shm): the snapshots would go to {self.root.parent}"
            if is_multi_node(rt):
                self._publish_off(rt, why_not)
        elif alone and is_multi_node(rt):
            why_not = self._start_peers(rt)
        self.needed = bool(alone) and why_not is None
        if rt.rank == 0 and why_not is not None:
            log(f"memory tier off: {why_not}; a rank whose state has no copy falls back to the newest checkpoint "
                f"that covers every shard [{config.ENV_MEMORY_TIER}=on takes the snapshots anyway]")
        if self.needed and rt.rank == 0:
            log(f"memory tier: the state of rank(s) {', '.join(map(str, alone[:8]))}{' ...' if len(alone) > 8 else ''} "
                f"has no copy on another rank; every rank's shard is snapshotted into host memory ({self.root}) at "
                f"the start of every minibatch{self._redundancy()} "
                f"[{config.ENV_MEMORY_TIER}=off turns this off]")
        return self.needed

    def _start_peers(self, rt: "JitRuntime") -> str | None:
        """A multi-node job: set up the copies of this rank's snapshots on another host; why not, if it fails."""
        node = int(os.environ.get("GROUP_RANK", rt.rank // max(rt.local_world_size, 1)))
        # Every rank gets here at the same minibatch's first forward; a peer that never says where it listens
        # must not hold this one past the point where the others' hang watchdogs would fire.
        timeout = max(rt.hang_timeout / 2, 1.0)
        scheme = os.environ.get(config.ENV_MEMORY_REDUNDANCY, config.DEFAULT_MEMORY_REDUNDANCY)
        group = int(os.environ.get(config.ENV_MEMORY_GROUP) or 0)
        parities = int(os.environ.get(config.ENV_MEMORY_PARITIES) or 0)
        copies = int(os.environ.get(config.ENV_MEMORY_COPIES) or 1)
        try:
            peers = PeerCopies(self.store, rt.rank, rt.world_size, rt.local_world_size, node, timeout, scheme, group,
                               parities, copies)
        except PeerError as exc:
            log(f"memory tier off for rank {rt.rank}: {exc}")
            return f"the redundancy across hosts cannot be set up ({exc})"
        try:
            store = job_store(rt, timeout)
            if store is None:
                raise PeerError("no job store to find the other hosts' ranks in (not started by torchrun?)")
            peers.start(store, f"{PEERS_KEY_PREFIX}/{generation(rt)}")
        except (PeerError, OSError, CheckpointError) as exc:
            peers.close()
            self._publish_off(rt, str(exc))
            log(f"memory tier off for rank {rt.rank}: its snapshots cannot be copied to another host ({exc})")
            return "its snapshots could not be copied to another host (a host's memory dies with the host)"
        self.peers = peers
        peers.timeout = max(rt.hang_timeout, 5.0)  # (a copy waits no longer than a collective would)
        return None

    def _publish_off(self, rt: "JitRuntime", why: str) -> None:
        """Tell the rank that would send its copies here that this rank keeps none (it need not wait)."""
        try:
            store = job_store(rt, max(rt.hang_timeout / 2, 1.0))
            if store is not None:
                PeerCopies.publish_off(store, f"{PEERS_KEY_PREFIX}/{generation(rt)}", rt.rank, why)
        except Exception:  # (nobody to tell: the sender's own wait ends at its timeout)
            pass

    def _redundancy(self) -> str:
        """How the snapshots survive a lost host, in words (for rank 0's line)."""
        if self.peers is None:
            return ""
        if self.peers.scheme == "xor":
            return (f", each group of {len(self.peers.members)} host(s) with one XOR parity on another host "
                    f"(rank {self.peers.successors[0]} keeps rank {self.peers.rank}'s group's)")
        if self.peers.scheme == "rs":
            return (f", each group of {len(self.peers.members)} host(s) with {self.peers.parities} Reed-Solomon "
                    f"parities on other hosts (ranks {', '.join(map(str, self.peers.successors))} keep rank "
                    f"{self.peers.rank}'s group's; any {self.peers.parities} lost hosts are rebuilt)")
        if len(self.peers.successors) == 1:
            return ", each with a copy on a rank of another host"
        return f", each with {len(self.peers.successors)} copies on ranks of the next hosts"

    def rebuild(self, rt: "JitRuntime") -> None:
        """Before a selection: rebuild, from the XOR or Reed-Solomon parities handed over, any lost snapshot
        of a group whose parities and other members suffice (``jitckpt.store.parity``); says what it did and could not do."""
        from jitckpt.store.memory import parity_area
        from jitckpt.store.parity import rebuild

        if not parity_area(rt.checkpoint_root).is_dir():
            return
        started = time.perf_counter()
        done, failed = rebuild(parity_area(rt.checkpoint_root), peer_copies(rt.checkpoint_root).root)
        if done:
            log(f"memory tier: rebuilt {', '.join(done)} in {time.perf_counter() - started:.2f}s")
            eventlog.record("memory_rebuilt", rank=rt.rank, attempt=rt.attempt, rebuilt=done)
        for why in failed:
            log(f"memory tier: {why}")

    def holds(self, path: Path) -> bool:
        """True for a snapshot of this tier: in this host's memory, or handed over from another host's."""
        return self.store.holds(path) or Path(path).is_relative_to(peer_copies(self._checkpoint_root).root)

    def hand_over(self, rt: "JitRuntime", saved_step: int | None) -> None:
        """A JIT event: put the snapshots this rank holds for another host's rank (and its own) where every
        host's ranks find them (``PeerCopies.hand_over``); never raises."""
        if self.peers is None:
            return
        started = time.perf_counter()
        try:
            handed = self.peers.hand_over(rt.checkpoint_root, saved_step)
        except HandOverError as exc:
            handed = exc.handed
            log(f"memory tier: {exc}")
            eventlog.record("memory_hand_over_failed", rank=rt.rank, attempt=rt.attempt, error=str(exc))
        except Exception as exc:  # (never in the way of the worker's exit)
            log(f"memory tier: could not hand over the snapshots held in this host's memory "
                f"({type(exc).__name__}: {exc})")
            eventlog.record("memory_hand_over_failed", rank=rt.rank, attempt=rt.attempt, error=str(exc))
            return
        if handed:
            shared = peer_copies(rt.checkpoint_root).root
            where = str(shared) + (f" and {shared.name}-parity" if any("/group-" in h for h in handed) else "")
            log(f"memory tier: handed over {', '.join(handed)} from this host's memory to {where} "
                f"in {time.perf_counter() - started:.2f}s")
            eventlog.record("memory_handed_over", rank=rt.rank, attempt=rt.attempt, copies=handed)

    def take(self, rt: "JitRuntime") -> Path | None:
        """Snapshot this rank's state as of the start of minibatch ``rt.step``; None if none was taken."""
        if rt.save_fn is None or self.failed or rt.jit_event_started() or not self._decide(rt):
            return None
        step = rt.step
        started = time.perf_counter()
        # The previous minibatch's collectives that update parameters (ZeRO's broadcast after its step) may still
        # be on the device (NCCL: the host is past them at enqueue): the state is the minibatch's start once they
        # are done.  One that failed or hangs means a failure is under way: no snapshot of this minibatch.
        unsettled = rt.earlier_minibatches_settled(time.monotonic() + rt.hang_timeout, poll=0.0005)
        if unsettled is not None:
            eventlog.record("memory_snapshot_skipped", rank=rt.rank, attempt=rt.attempt, step=step, why=unsettled)
            return None
        # The previous copy to another host has ended (it overlapped the previous minibatch; its socket's timeout
        # bounds a frozen peer): one in flight at most, never more than a minibatch behind.
        copy_free = self._previous_copy_ended(rt)
        if rt.jit_event_started():
            return None
        # Room first: the previous snapshot stays whole, older ones go (two per rank, a third only while written).
        self.store.prune_rank(self.rank, step, drop_later=not self._pruned_future)
        self._pruned_future = True
        full = self._no_room()
        if full:
            return self._turn_off(rt, step, full)
        pending = None
        random_state = rng_state.capture()  # the user's save must not move the training's random numbers
        try:
            pending = self.store.begin_save(step, rt.coords)
            save.run_user_save(rt, pending)
            rt.injector.maybe_fire("snapshot", step)
            copied = save.copy_stashes(rt, pending, step, only_rank=rt.rank)
            ddp_layout.write(pending)
            final = pending.commit({
                "reason": "memory-tier snapshot",
                "saved_state": f"start of minibatch {step}",
                "attempt": rt.attempt,
                "rng_ranks": copied[stash.RNG],
                "loader_ranks": copied[stash.LOADER],
            })
        except Exception as exc:  # never stop training: the tier is off for this worker, and it says so
            if pending is not None:
                pending.abandon()
            return self._turn_off(rt, step, f"the snapshot of minibatch {step} failed ({type(exc).__name__}: {exc})")
        finally:
            rng_state.restore(random_state)
        self._account(rt, final, step, time.perf_counter() - started)
        if self.peers is not None and copy_free:
            self.peers.send_in_background(final, step, lambda size, error, seconds: self._copied(
                rt, step, size, error, seconds))
        return final

    def _previous_copy_ended(self, rt: "JitRuntime") -> bool:
        """Wait for the copy of the previous snapshot to end (it overlapped the previous minibatch), at most a
        hang timeout and never past the start of a JIT event; False if it is still going (this snapshot then
        gets no copy: the peer is frozen or gone, and a JIT event is on its way)."""
        if self.peers is None:
            return True
        deadline = time.monotonic() + rt.hang_timeout
        while not self.peers.wait_sent(0.05):
            if rt.jit_event_started() or time.monotonic() > deadline:
                return False
        return True

    def _copied(self, rt: "JitRuntime", step: int, size: int | None, error: str | None, seconds: float) -> None:
        """A copy to another host ended (on its own thread): say the first one, and failures once."""
        assert self.peers is not None
        if error is not None:  # (its peer is dead or frozen: a JIT event follows; training goes on meanwhile)
            if not self._peer_failing:
                log(f"memory tier: {error}; this snapshot has no copy on another host")
            self._peer_failing = True
            eventlog.record("memory_peer_copy_failed", rank=rt.rank, attempt=rt.attempt, step=step, error=error)
            return
        if self.peers.sent == 1 or self._peer_failing:
            kept = {"xor": "folded into the XOR parity kept", "rs": "folded into the Reed-Solomon parities kept"}
            holders = ", ".join(map(str, self.peers.successors))
            log(f"memory tier: copy of minibatch {step}'s snapshot {kept.get(self.peers.scheme, 'kept')} by "
                f"rank(s) {holders} on other host(s) ({(size or 0) / 1024:.0f} KiB sent in {seconds * 1000:.1f} ms, "
                f"beside the training)")
            eventlog.record("memory_peer_copy", rank=rt.rank, attempt=rt.attempt, step=step, bytes=size,
                            seconds=seconds)
        self._peer_failing = False

    def _no_room(self) -> str | None:
        """Why the next snapshot would not fit in host shared memory (with room to spare for the job), or None."""
        if not self.bytes:
            return None
        try:
            fs = os.statvfs(self.root.parent)
        except OSError:
            return None
        free = fs.f_bavail * fs.f_frsize
        if free >= 2 * self.bytes:
            return None
        return (f"host shared memory is nearly full ({free / 2**20:.0f} MiB free in {self.root.parent}, a snapshot "
                f"takes {self.bytes / 2**20:.0f} MiB; NCCL and DataLoader workers need it too)")

    def _turn_off(self, rt: "JitRuntime", step: int, why: str) -> None:  # (returns take's "none taken")
        self.failed = True
        self._disarm()
        log(f"memory tier off for rank {rt.rank}: {why}; a lost shard of this rank falls back to the newest "
            f"checkpoint that covers every shard")
        eventlog.record("memory_snapshot_failed", rank=rt.rank, attempt=rt.attempt, step=step, error=why)
        return None

    def _account(self, rt: "JitRuntime", final: Path, step: int, seconds: float) -> None:
        self.taken += 1
        self.seconds += seconds
        self.bytes = sum(f.stat().st_size for f in final.rglob("*") if f.is_file())
        if self.taken == 1:
            log(f"memory tier: snapshot of minibatch {step} in {seconds * 1000:.1f} ms, {self.bytes / 1024:.0f} KiB")
            eventlog.record("memory_snapshot", rank=rt.rank, attempt=rt.attempt, step=step, seconds=seconds,
                            bytes=self.bytes, path=str(final))
        minibatch = rt.mean_minibatch_seconds()
        mean = self.seconds / self.taken
        if rt.rank == 0 and not self._warned_cost and self.taken >= 5 and minibatch and mean > _COSTLY * minibatch:
            self._warned_cost = True
            log(f"warning: memory tier snapshots take {mean * 1000:.1f} ms, {100 * mean / minibatch:.0f}% of a "
                f"minibatch ({minibatch * 1000:.1f} ms): the user's save runs once per minibatch into host memory; "
                f"{config.ENV_MEMORY_TIER}=off (jit-run --memory-tier off) turns the snapshots off")
