"""Resuming a worker: find the checkpoint this rank loads, and put its own RNG state back.

``jitckpt.jit_get_checkpoint_path()`` calls ``locate`` and then ``resume``
(or ``fresh_start``).  The checkpoint comes from the store's selection (the
newest step covering every shard, from any replica of this rank's shard);
the RNG state is this rank's own, found in whichever replica's checkpoint
carried the host stash that held it.

A resume that jitckpt knows cannot repeat the fault-free run (a rank's own
per-rank state, its RNG or its data loaders', is nowhere to be found) goes
through ``inexact_resume``: it stops the job with the reason (DESIGN decision
15), unless the user asked to go on with ``jit-run --allow-inexact-resume``.
"""

from __future__ import annotations

import os
import sys
import warnings
from typing import TYPE_CHECKING

from jitckpt import config, eventlog
from jitckpt.store import CheckpointError, CheckpointInfo, CheckpointWarning, safe_codec, select
from jitckpt.store.disk import check_private
from jitckpt.worker import data_position, ddp_layout, minibatch_gap, private_rng, rng_state, sharding, stash
from jitckpt.worker.console import log
from jitckpt.worker.step_agreement import agreed_selection, overruled_to_fresh_start

if TYPE_CHECKING:
    from jitckpt.worker.runtime import JitRuntime

_logged: set[str] = set()


def locate(rt: "JitRuntime") -> CheckpointInfo | None:
    """Find the checkpoint this rank resumes from; warnings about skipped ones are printed.

    Once per process, and again if the rank's shard identity has changed since
    (a DDP module built before the optimizer that shards its state: the first
    look could only trust the checkpoints' recorded replica groups).
    """
    coords = sharding.refresh(rt)
    if rt.located and (rt.checkpoint_for is None or rt.checkpoint_for == coords):
        return rt.checkpoint
    if rt.checkpoint_root.is_dir():
        check_private(rt.checkpoint_root)  # CheckpointError: the script stops before loading anything
    allow = os.environ.get(config.ENV_ALLOW_WORLD_SIZE_CHANGE) == "1"
    if rt.memory_tier is not None and not rt.located:
        rt.memory_tier.rebuild(rt)  # (a lost host's snapshots from the XOR or Reed-Solomon parities the survivors handed over)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CheckpointWarning)
        # every rank loads the same step: the ranks agree through the job's store (the first look only)
        held_back: list[tuple[int, str]] = []  # (the step this rank offers instead of the newest, why)

        def choose(step: int | None) -> CheckpointInfo | None:
            info = select(rt.store, rt.coords, allow_world_size_change=allow, step=step)
            if step is None and info is not None:
                older, why = _step_before_if_unknown(rt, info, allow)
                if older is not None:
                    held_back[:] = [(older.step, why)]
                    return older
            return info

        info = agreed_selection(rt, choose, lambda: held_back[0][1] if held_back else None)
    lines = [f"warning: {warning.message}" for warning in caught]
    if held_back and info is not None and info.step == held_back[0][0]:
        lines.append(held_back[0][1])
        rt.held_back = held_back[0][1]
    steps = rt.store.list_steps() if info is None else []
    if steps and not overruled_to_fresh_start(rt):
        lines.append(f"no checkpoint in {rt.checkpoint_root} covers every shard of this job: "
                     f"a fresh start from minibatch 0")
        if not rt.located:  # (the report names what was passed over: a fresh start is not a quiet one)
            eventlog.record("checkpoints_unusable", rank=rt.rank, attempt=rt.attempt, steps=steps,
                            reasons=[str(warning.message) for warning in caught])
    for line in lines:
        if line not in _logged:  # a second look (identity now known) repeats only what is new
            _logged.add(line)
            log(line)
    rt.checkpoint, rt.located, rt.checkpoint_for = info, True, coords
    if info is not None:
        ddp_layout.load(info.path)
    return info


def _step_before_if_unknown(rt: "JitRuntime", info: CheckpointInfo,
                            allow: bool) -> tuple[CheckpointInfo | None, str]:
    """The checkpoint of the step before ``info``'s, and why, if this rank's own state for ``info``'s step is not
    known and that one is there; else ``(None, "")``.

    A survivor that had not yet seen its all-reduce of minibatch i-1 complete
    (a busy host) saves i-1 while its peers save i (``jitckpt.worker.stash``).
    If random numbers were drawn before minibatch i's data (a loop that draws
    its inputs at its top, an evaluation), that rank's state after them is
    not known (``minibatch_gap.unreached_draws``) and a resume at i is
    refused; at i-1 every rank's own state is in its checkpoint (the survivor
    copied its host's stashes), so the job resumes there, exact, with one more
    minibatch redone.  (Not with a framework adapter: its own start of a
    minibatch is where its state is restored, a case of its own.)"""
    if rt.framework is not None:
        return None, ""
    try:
        if find_own_state(rt, info, stash.RNG) is None:
            return None, ""  # (a rank new to the job, --allow-world-size-change: no state of its own anywhere)
        own_gap = find_own_state(rt, info, stash.GAP)
        own = minibatch_gap.GapRecord.decode(own_gap) if own_gap is not None else None
        if not minibatch_gap.unreached_draws(own, minibatch_gap.records_of_step(info.path.parent)):
            return None, ""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CheckpointWarning)  # (no step before: the resume at i says why it stops)
            older = select(rt.store, rt.coords, allow_world_size_change=allow, step=info.step - 1)
    except (OSError, CheckpointError, minibatch_gap.GapRecordError):
        return None, ""  # (the resume at i reads them again, and says what is wrong)
    if older is None:
        return None, ""
    return older, (f"rank {rt.rank} did not reach minibatch {info.step}'s data in the run that failed, and random "
                   f"numbers were drawn before it (the loop's own draws, an evaluation): its state there is not "
                   f"known; it resumes from minibatch {older.step}, where every rank's is (a survivor that had not "
                   f"yet seen that minibatch's all-reduce complete saved it), one more minibatch redone")


def resume(rt: "JitRuntime", info: CheckpointInfo) -> None:
    """Adopt a checkpoint's step, and have this rank's own RNG state put back when the redone minibatch starts."""
    rt.checkpoint_for = None  # the script loads it: settled, never selected again
    private_rng.observe_seeds()  # before the script loads its generators (a replica's, perhaps)
    rt.step = info.step
    rt.resumed_from = info.step
    payload = find_own_state(rt, info, stash.RNG)
    if payload is not None:
        try:
            rng_state.decode(payload)  # refuse a foreign state now, loudly, before anything is loaded
        except rng_state.RngStateError as exc:
            raise CheckpointError(
                f"{info.path}: the RNG state stored for rank {rt.rank} is unusable ({exc}); nothing was loaded "
                f"from it. Its checksum matched, so it was written that way or replaced together with the "
                f"metadata: check who can write to {rt.checkpoint_root}"
            ) from None
    else:
        _no_rng_state(rt, info)
    if payload is not None:
        rt.stash_rng(rt.step, payload)  # what minibatch rt.step starts with, should this attempt fail too
        rt.defer_rng_restore(payload)
    else:
        rt.stash_rng(rt.step)
    # what was drawn between the minibatch before and this one's data (a new epoch's iterator, an evaluation)
    own_gap = find_own_state(rt, info, stash.GAP)
    try:
        own_record = minibatch_gap.GapRecord.decode(own_gap) if own_gap is not None else None
    except minibatch_gap.GapRecordError as exc:
        raise CheckpointError(f"{info.path}: the record of minibatch {info.step}'s start stored for rank {rt.rank} "
                              f"is unusable ({exc}); nothing was loaded from it") from None
    if payload is not None:
        why = rt.gap.arm_resume(own_record, minibatch_gap.records_of_step(info.path.parent), payload,
                                lambda reason: inexact_resume(rt, reason),
                                savers=minibatch_gap.saver_records(info.path.parent))
        if why is not None:
            inexact_resume(rt, why)
    # (no window for the redone minibatch: the stash holds its start already, and a capture at a fetch
    # while the script skips to its position could miss a generator the script makes after it)
    loader_state = find_own_state(rt, info, stash.LOADER)
    if loader_state is not None:
        try:
            safe_codec.decode(loader_state)  # data only; refuse a damaged or foreign one before anything is loaded
        except safe_codec.SafeCodecError as exc:
            raise CheckpointError(
                f"{info.path}: the data-loader state stored for rank {rt.rank} is unusable ({exc}); nothing was "
                f"loaded from it. Check who can write to {rt.checkpoint_root}"
            ) from None
        rt.own_state[stash.LOADER] = loader_state  # jitckpt.adapters.torchdata_loader hands it to the loaders
    # the batches this rank took in the redone minibatch: it must take them again (jitckpt.worker.data_position)
    # and must not start from the minibatch before it (a step counter one behind the checkpoint's)
    earlier = None
    if rt.shm_dir is not None:
        earlier = stash.read_stash(stash.stash_path(rt.shm_dir, stash.FETCH, rt.rank)).get(info.step - 1)
    data_position.arm_check(rt, find_own_state(rt, info, stash.FETCH), str(info.path),
                            lambda reason: inexact_resume(rt, reason), earlier)
    memory = rt.memory_tier is not None and rt.memory_tier.holds(info.path)
    eventlog.record("resumed", rank=rt.rank, attempt=rt.attempt, step=info.step, path=str(info.path),
                    rng_restored=payload is not None, loader_state=loader_state is not None, memory_tier=memory,
                    held_back=rt.held_back)
    log(f"resuming from minibatch {info.step}: {info.path}"
        f"{' (a snapshot in host memory)' if memory else ''}")


def _no_rng_state(rt: "JitRuntime", info: CheckpointInfo) -> None:
    """This rank's own RNG state for the resumed minibatch is nowhere: stop the job (DESIGN decision 15), or say so.

    It should exist wherever this job stashes (``rt.stash``): every rank
    records the state each minibatch starts with, and the checkpoint's savers
    copy those of every rank on their host.  So it was lost with the rank's
    host, or never recorded: the redone minibatch would draw other dropout
    masks and augmentation than the fault-free run.  Two cases only warn:
    a worker that stashes nothing (no host stash directory: not started by
    jit-run), and a checkpoint of another world size (the user allowed the
    change, and ranks beyond the old world size never had a state).
    """
    saved_world = info.meta.get("world_size")
    held = sorted(stash.read_stash(rng_state.stash_path(rt.shm_dir, rt.rank))) if rt.shm_dir is not None else []
    why = (f"its host's stash has moved on to minibatch {', '.join(map(str, held))}: this rank had gone past "
           f"minibatch {info.step} before a replica saved that one (a second failure during the recovery?)"
           if held and min(held) > info.step else "its host was lost?")
    what = (f"no RNG state for rank {rt.rank} at minibatch {info.step} in its host's stash or in any replica's "
            f"checkpoint ({why})")
    if rt.stash is None or (saved_world is not None and int(saved_world) != rt.world_size):
        log(f"{what}; the redone minibatch will draw different random numbers")
        return
    inexact_resume(rt, f"{what}: the redone minibatch would draw different random numbers (dropout masks, "
                       f"augmentation, noise) than the fault-free run")


def inexact_allowed() -> bool:
    """True if the user let resumes known not to be bit-exact go on (jit-run --allow-inexact-resume)."""
    return os.environ.get(config.ENV_ALLOW_INEXACT_RESUME) == "1"


def inexact_resume(rt: "JitRuntime", reason: str) -> None:
    """This rank's resume cannot repeat the fault-free run, for ``reason``: stop the job, or go on if allowed.

    Stopping ends this worker with ``RESUME_REFUSED_EXIT_CODE``, on which
    jit-run's agent stops the job instead of restarting it (every restart
    would meet the same); the checkpoints are kept.  With
    ``--allow-inexact-resume`` it returns, and the report's outcome says
    "not bit-exact".
    """
    step = rt.resumed_from
    if inexact_allowed():
        log(f"warning: {reason}; going on because of --allow-inexact-resume: this run is not bit-exact")
        eventlog.record("resume_inexact", rank=rt.rank, attempt=rt.attempt, step=step, reason=reason)
        return
    log(f"stopping the job: {reason}. Resuming would not repeat the fault-free run, so this rank refuses to "
        f"(the checkpoints in {rt.checkpoint_root} are kept). To go on anyway, with results that differ from a "
        f"fault-free run, rerun with jit-run --allow-inexact-resume ({config.ENV_ALLOW_INEXACT_RESUME}=1)")
    eventlog.record("resume_refused", rank=rt.rank, attempt=rt.attempt, step=step, reason=reason)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(config.RESUME_REFUSED_EXIT_CODE)  # not an exception: the script must not catch it and go on


def fresh_start(rt: "JitRuntime") -> None:
    """No checkpoint: training starts at minibatch 0."""
    rt.checkpoint_for = None  # settled, never selected again
    rt.stash_rng(rt.step)
    eventlog.record("fresh_start", rank=rt.rank, attempt=rt.attempt)


def find_own_state(rt: "JitRuntime", info: CheckpointInfo, kind: str) -> bytes | None:
    """This rank's own state of ``kind`` (``jitckpt.worker.stash``) for the step of ``info``, or None.

    Looked for, in order: this rank's own host stash (it survives a restart on
    the same host and is the rank's own writing, even where the checkpoint's
    copy is missing: a replica on another host saved it); this checkpoint;
    the other rank checkpoints of the same step (a replica on the rank's host
    copied the stash of every local rank).  Never a replica's own state.
    """
    if rt.shm_dir is not None:
        payload = stash.read_stash(stash.stash_path(rt.shm_dir, kind, rt.rank)).get(info.step)
        if payload is not None:
            return payload
    name = stash.checkpoint_file_name(kind, rt.rank)
    if name in info.meta.get("files", {}):
        return (info.path / name).read_bytes()
    for other in sorted(info.path.parent.iterdir()):
        if other == info.path or other.name.startswith("."):
            continue
        try:
            meta_ok = rt.store.verify(other, check_content=False)
        except CheckpointError:
            continue
        if name in meta_ok.meta.get("files", {}):
            return (other / name).read_bytes()
    return None
