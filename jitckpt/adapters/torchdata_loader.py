"""torchdata's ``StatefulDataLoader`` under jit-run: every rank resumes with its own data position, seeds and worker RNG.

A script that follows torchdata's documentation saves ``loader.state_dict()``
in its save function and calls ``loader.load_state_dict(...)`` on resume.  Under
a JIT save that alone goes wrong in three ways (issue 11, item 11):

1. the save runs in the middle of minibatch i, after the loader has yielded
   batch i, so the saved position is one batch ahead of the model;
2. the loader's state carries the rank's base seed (drawn from the rank's
   own, per-rank seeded generator); a replacement rank loads a replica's file
   and so the replica's seed;
3. the workers restart their generators from that seed, so any worker-side
   augmentation differs after a mid-epoch resume.

What this adapter does, with no change to the script:

- each loader is numbered by creation order (the same script builds its
  loaders in the same order on every attempt);
- at the first ``next()`` of each minibatch, before the batch is fetched, the
  loader's state (the position where minibatch i starts) goes into this
  rank's host stash (``jitckpt.worker.stash``), together with the rank's RNG
  state at that point; at the minibatch's collectives (DDP's all-reduce in
  backward, or the script's own all-reduce of its gradients), after a batch
  fetched once they have begun (a batch taken between backward() and
  ``optimizer.step()``), and again right before each optimizer step if a
  batch was fetched since, the state after the minibatch's last batch is
  stashed for i+1, with the RNG state after it: a rank that dies inside its
  optimizer step is saved at i+1 by its replicas, and it may die there
  before any of torch's step hooks run (a wrapper the script put around
  ``optimizer.step``);
- each stash entry holds every loader of the rank: one that fetched nothing
  since the last entry keeps its state; one that never fetched is recorded
  with the state of the iterator it already has (whose seeds were drawn when
  the script called ``iter()``), or, without one, as not started (it then
  starts afresh on resume, as it did);
- during a JIT save ``loader.state_dict()`` returns the stashed start of the
  saved minibatch, and the JIT save copies every local rank's stash into the
  checkpoint;
- on resume ``loader.load_state_dict(state)`` is given this rank's own state
  instead of whatever file the script read (a replica's, for a replacement
  rank); where a replacement rank's own state cannot be found (lost with its
  host), the job stops with the reason (DESIGN decision 15,
  ``jitckpt.worker.resume.inexact_resume``) rather than take a replica's;
- the worker processes add their RNG states (torch, ``random``, NumPy) to
  the per-worker state torchdata already snapshots with each batch, and put
  them back when they are restarted from such a state;
- the first ``next()`` of the redone minibatch is where the rank's RNG state
  is put back (not the first module forward): batches fetched in the main
  process (``num_workers=0``) draw their augmentation from it.
"""

from __future__ import annotations

import functools
import itertools
import weakref
from types import ModuleType
from typing import TYPE_CHECKING, Any

from jitckpt import worker
from jitckpt.store import safe_codec
from jitckpt.worker import resume, rng_state, stash
from jitckpt.worker.console import log
from jitckpt.worker.save import in_jit_save

if TYPE_CHECKING:
    from jitckpt.worker.runtime import JitRuntime

# The key under which a worker's RNG state rides in torchdata's per-worker dataset state.
WORKER_RNG_KEY = "_jitckpt_worker_rng"
# A loader's stashed state when the minibatch starts on a new epoch's iterator, not yet created.
EPOCH_END = {"_jitckpt_epoch_end": True}
# A loader's stashed state when it has not yielded a batch yet: on resume it starts afresh, as it did.
NOT_STARTED = {"_jitckpt_not_started": True}


def _is_marker(state: Any, marker: dict[str, bool]) -> bool:
    """True if ``state`` is ``marker`` (compared without comparing a real state's tensors)."""
    return isinstance(state, dict) and len(state) == 1 and state.get(next(iter(marker))) is True


def _exhausted(iterator: Any) -> bool:
    try:
        return iterator._num_yielded >= len(iterator)
    except TypeError:  # an IterableDataset without __len__: it may go on
        return False


class LoaderPositions:
    """This process's stateful loaders and, per minibatch, the state each one starts it with.

    ``_states[i][n]`` is where loader ``n`` stands when minibatch ``i`` starts.
    It is recorded at ``n``'s first fetch in ``i``; for ``i+1`` at the end of
    ``i`` (collectives, a fetch after them, optimizer pre-step) if ``n``
    fetched in ``i``; carried over from ``i`` if ``n`` fetched nothing since
    the last optimizer step; if ``n`` never fetched nor was loaded, the state
    of the iterator it has (made, its seeds drawn, nothing yielded yet), or
    ``NOT_STARTED`` if it has none; on resume, what ``n`` was loaded with.
    Every write of an entry goes to this rank's host stash whole.
    """

    def __init__(self, rt: "JitRuntime") -> None:
        self.rt = rt
        self._numbers = itertools.count()
        self._loaders: dict[int, weakref.ref] = {}  # loader number -> the loader
        self._states: dict[int, dict[int, Any]] = {}  # step -> {loader number: state}
        self._started: dict[int, int] = {}  # loader number -> the step whose start it has recorded
        self._active: dict[int, weakref.ref] = {}  # loaders that yielded since the last optimizer step
        self._known: set[int] = set()  # loaders that yielded a batch or were loaded with a state
        self._fetches = 0  # batches yielded by this process's loaders: the positions change with it
        self._next_stashed: tuple[int, int] | None = None  # (step, fetches) when step+1's positions were stashed
        # The step in which step+1's positions were stashed after a fetch of that step (a collective that
        # follows the minibatch's batches): a later fetch in it stashes step+1 again.
        self._next_final_in: int | None = None
        self._rng_recorded_for: int | None = None  # the step whose RNG state a first fetch recorded
        # loader number -> (its iterator, that iterator's state): a loader that has not yielded, recorded once
        self._unyielded: dict[int, tuple[weakref.ref, Any]] = {}
        self._own: dict[int, Any] | None = None
        self._encoded: tuple[list[tuple[int, Any]], bytes] | None = None  # the last entry encoded, and its bytes
        self._warned: set[str] = set()

    def number(self, loader: Any) -> int:
        number = next(self._numbers)
        self._loaders[number] = weakref.ref(loader)
        return number

    # ----- recording ---------------------------------------------------------------

    def first_next(self, loader: Any, iterator: Any) -> tuple[Any, bytes | None] | None:
        """Before a ``next()``: (loader state, RNG state) if this is the loader's first fetch in this minibatch.

        The RNG state only at the minibatch's first fetch of any loader (None at another loader's first).
        """
        number = loader._jitckpt_number
        step = self.rt.step
        if self._started.get(number) == step:
            return None
        if self.rt.pending_rng is not None:
            self.rt.minibatch_starts()  # the redone minibatch starts here: its fetch may draw random numbers
        # The RNG state too: what this minibatch draws from, after the script's own draws (iter() of a new epoch).
        return iterator.state_dict(), rng_state.capture() if self._rng_recorded_for != step else None

    def fetched(self, loader: Any, before: tuple[Any, bytes | None] | None) -> None:
        """After a ``next()`` that yielded a batch: record the minibatch's start (first fetch only).

        A batch fetched after a collective that followed this minibatch's
        batches (between backward() and ``optimizer.step()``, say) moves where
        minibatch step+1 starts, and may have drawn random numbers here (a
        batch augmented in this process): both are stashed for step+1 again,
        for a rank that dies before torch's step hooks run.
        """
        number = loader._jitckpt_number
        self._active[number] = weakref.ref(loader)
        self._known.add(number)
        self._unyielded.pop(number, None)
        self._fetches += 1
        step = self.rt.step
        if before is not None:
            self._started[number] = step
            state, rng = before
            if rng is not None and self._rng_recorded_for != step:
                # The minibatch's first batch: the RNG state it starts with.  Not at another loader's first
                # batch later in it (after a forward pass has drawn its dropout masks, say).
                self._rng_recorded_for = step
                self.rt.stash_rng(step, rng)
            self._entry(step)[number] = state
            self._write(step)
        if self._next_final_in == step:
            self.rt.stash_next_minibatch()

    def next_positions_final(self) -> None:
        """At a gradient collective, and right before an optimizer step: stash where minibatch step+1 starts.

        The minibatch's forward passes, and so its fetches, are over at its
        gradient collectives; a batch fetched after them (before the optimizer
        step) is caught by the pre-step's call.  Stashed at the collective, the
        positions survive a rank that dies inside ``optimizer.step()`` before
        torch's step hooks run, whose replicas save step+1.
        """
        key = (self.rt.step, self._fetches)
        if key == self._next_stashed:
            return  # nothing fetched since: the stashed positions stand
        self._next_stashed = key
        if self._active:
            self._next_final_in = self.rt.step
        step = self.rt.step + 1
        states = self._entry(step)
        for number, ref in list(self._active.items()):
            loader = ref()
            if loader is None or loader._iterator is None:
                continue
            iterator = loader._iterator
            # An exhausted iterator: the next minibatch starts on a new one, whose seeds the rank draws
            # from its generator when the script calls iter() again; record that, not the old position.
            states[number] = EPOCH_END if _exhausted(iterator) else iterator.state_dict()
        self._write(step)

    def next_minibatch(self) -> None:
        """The runtime's next-minibatch hook (collectives): never lets a failure here break the backward pass."""
        try:
            self.next_positions_final()
        except Exception as exc:  # a loader whose state cannot be read: say so once, train on
            self._warn_once("collective", f"warning: data loaders' positions not stashed at a collective "
                                          f"({type(exc).__name__}: {exc}); the optimizer pre-step stashes them")

    def before_optimizer_step(self) -> None:
        """Right before an optimizer step: each active loader's state is where minibatch step+1 starts."""
        self.next_positions_final()
        self._active.clear()

    def loaded(self, loader: Any, state: Any) -> None:
        """On resume: ``loader`` starts the resumed minibatch with ``state``.

        Recorded, not stashed yet: the stash entry this attempt read stays
        whole until the minibatch's first fetch writes a complete one (the
        script may load its other loaders after this one).
        """
        number = loader._jitckpt_number
        self._known.add(number)
        self._entry(self.rt.step)[number] = state

    def _entry(self, step: int) -> dict[int, Any]:
        """The states minibatch ``step`` starts with (created, with older entries dropped, on first use)."""
        for old in [s for s in self._states if s < step - 1]:
            del self._states[old]
        return self._states.setdefault(step, {})

    def _write(self, step: int) -> None:
        """Complete the entry of ``step`` with the loaders it lacks, and stash it."""
        states = self._states[step]
        previous = self._states.get(step - 1, {})
        for number, ref in list(self._loaders.items()):
            loader = ref()
            carried = previous.get(number)
            if loader is None:
                del self._loaders[number]
            elif number in states or number in self._active:
                continue  # recorded, or moved since the last optimizer step: recorded by its own fetches
            elif carried is not None and not _is_marker(carried, NOT_STARTED):
                states[number] = carried  # fetched nothing since: it starts step where it started step-1
            elif carried is not None or number not in self._known:
                # Not started yet: the script may have made its iterator since (drawing its seeds).
                states[number] = self._unyielded_state(number, loader)
        try:
            payload = self._encode(states)
        except safe_codec.SafeCodecError as exc:
            self._warn_once("encode", f"warning: the data loaders' state cannot be stashed ({exc}); a replacement "
                                      f"rank will find no state of its own and stop the job")
            return
        try:
            self.rt.stash_rank_state(stash.LOADER, step, payload)
        except stash.StashFull as exc:
            self._warn_once("full", f"warning: data loaders' state not stashed: {exc}")

    def _unyielded_state(self, number: int, loader: Any) -> Any:
        """The state of a loader that has not yielded a batch: its iterator's, or ``NOT_STARTED`` if it has none.

        An iterator drew its seeds (the base seed of its workers, a shuffling
        sampler's) from the rank's generator when the script called
        ``iter()``, perhaps minibatches ago: its state carries them, so that
        the rank's replacement and its replicas resume with them instead of
        drawing new ones.  Nothing changes in it until it yields, so it is
        read once per iterator.
        """
        iterator = loader._iterator
        if iterator is None:
            return NOT_STARTED
        known = self._unyielded.get(number)
        if known is not None and known[0]() is iterator:
            return known[1]
        state = iterator.state_dict()
        self._unyielded[number] = (weakref.ref(iterator), state)
        return state

    def _encode(self, states: dict[int, Any]) -> bytes:
        """``states`` encoded; the last encoding again if it holds the very same state objects (nothing moved)."""
        items = sorted(states.items())
        cached = self._encoded
        if cached is not None and len(cached[0]) == len(items) and all(
                a[0] == b[0] and a[1] is b[1] for a, b in zip(cached[0], items)):
            return cached[1]
        payload = safe_codec.encode(states)
        self._encoded = (items, payload)
        return payload

    def state_at(self, loader: Any, step: int) -> Any | None:
        return self._states.get(step, {}).get(loader._jitckpt_number)

    # ----- resuming ----------------------------------------------------------------

    def own_state(self, loader: Any) -> tuple[bool, Any]:
        """(found, state): this rank's own stashed state of ``loader`` for the resumed minibatch."""
        if self._own is None:
            payload = self.rt.own_state.pop(stash.LOADER, None)
            self._own = {}
            if payload is not None:
                try:
                    decoded = safe_codec.decode(payload)
                except safe_codec.SafeCodecError as exc:
                    self._warn_once("decode", f"warning: this rank's stashed data-loader state is unusable ({exc})")
                else:
                    if isinstance(decoded, dict):
                        self._own = decoded
        number = loader._jitckpt_number
        if number in self._own:
            return True, self._own[number]
        return False, None

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log(message)


_positions: LoaderPositions | None = None


def _get_positions(rt: "JitRuntime") -> LoaderPositions:
    global _positions
    if _positions is None or _positions.rt is not rt:
        _positions = LoaderPositions(rt)
        from torch.optim.optimizer import register_optimizer_step_pre_hook

        positions = _positions
        rt.next_minibatch_hooks.append(positions.next_minibatch)
        handle = register_optimizer_step_pre_hook(lambda opt, args, kwargs: positions.before_optimizer_step())
        # First of the global pre-step hooks: the state must be stashed before anything in the step can fail.
        hooks = handle.hooks_dict_ref()
        if hooks is not None and hasattr(hooks, "move_to_end"):
            hooks.move_to_end(handle.id, last=False)
    return _positions


def attach(module: ModuleType) -> None:
    """Wrap ``StatefulDataLoader`` and its iterators (``module``: torchdata.stateful_dataloader.stateful_dataloader)."""
    from torchdata.stateful_dataloader import worker as worker_module

    loader_cls = module.StatefulDataLoader
    if getattr(loader_cls, "_jitckpt_wrapped", False):
        return
    _attach_main_process(loader_cls, module._StatefulBaseDataLoaderIter)
    _attach_workers(worker_module)
    loader_cls._jitckpt_wrapped = True


def _attach_main_process(loader_cls: type, iterator_cls: type) -> None:
    original_init = loader_cls.__init__
    original_iter = loader_cls.__iter__
    original_state_dict = loader_cls.state_dict
    original_load = loader_cls.load_state_dict
    original_next = iterator_cls.__next__

    @functools.wraps(original_init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        rt = worker.current()
        self._jitckpt_number = _get_positions(rt).number(self) if rt is not None else None

    @functools.wraps(original_iter)
    def __iter__(self: Any) -> Any:
        rt = worker.current()
        if getattr(self, "_jitckpt_new_epoch", False):
            self._jitckpt_new_epoch = False
            if rt is not None and rt.pending_rng is not None:
                rt.minibatch_starts()  # the new iterator's seeds come from the state the redone minibatch starts with
        iterator = original_iter(self)
        iterator._jitckpt_loader = weakref.ref(self)
        return iterator

    @functools.wraps(original_next)
    def __next__(self: Any) -> Any:
        rt = worker.current()
        ref = getattr(self, "_jitckpt_loader", None)
        loader = ref() if ref is not None else None
        if rt is None or loader is None or getattr(loader, "_jitckpt_number", None) is None:
            return original_next(self)
        positions = _get_positions(rt)
        before = positions.first_next(loader, self)
        batch = original_next(self)  # StopIteration: the minibatch's start is the next iterator's
        positions.fetched(loader, before)
        return batch

    @functools.wraps(original_state_dict)
    def state_dict(self: Any) -> Any:
        rt = worker.current()
        if rt is not None and in_jit_save() and getattr(self, "_jitckpt_number", None) is not None:
            saved = _get_positions(rt).state_at(self, rt.step)
            if _is_marker(saved, NOT_STARTED):
                return {}  # not started (load_state_dict({}) leaves a loader fresh); no iterator made in the save
            if saved is not None and not _is_marker(saved, EPOCH_END):
                return saved  # where the saved minibatch starts, not where the loader is now
        return original_state_dict(self)

    @functools.wraps(original_load)
    def load_state_dict(self: Any, state_dict: Any) -> Any:
        rt = worker.current()
        if rt is None or rt.resumed_from is None or getattr(self, "_jitckpt_number", None) is None:
            return original_load(self, state_dict)
        positions = _get_positions(rt)
        number, step = self._jitckpt_number, rt.resumed_from
        found, own = positions.own_state(self)
        if found and _is_marker(own, EPOCH_END):
            log(f"data loader #{number}: minibatch {step} starts a new epoch; rank {rt.rank}'s loader draws its "
                f"seeds again from the rank's own generator")
            self._jitckpt_new_epoch = True
            positions.loaded(self, EPOCH_END)
            return original_load(self, {})
        if found and _is_marker(own, NOT_STARTED):
            log(f"data loader #{number}: rank {rt.rank}'s loader had not started by minibatch {step} (no iterator "
                f"yet); it starts afresh, as it did")
            positions.loaded(self, NOT_STARTED)
            return original_load(self, {})
        if found:
            log(f"data loader #{number}: resuming with rank {rt.rank}'s own position, seeds and worker RNG for "
                f"minibatch {step}")
            state_dict = own
        else:
            owner = rt.checkpoint.meta.get("rank", rt.rank) if rt.checkpoint is not None else rt.rank
            if int(owner) != rt.rank:
                # Never a replica's: its position, seeds and worker RNG are another rank's (DESIGN decision 10).
                resume.inexact_resume(rt, (
                    f"rank {rt.rank}'s own data-loader state (data loader #{number}) for minibatch {step} is in no "
                    f"checkpoint and no stash (its host was lost, or it was never stashed); the checkpoint this rank "
                    f"loads is rank {owner}'s, whose data position, seeds and worker RNG are not this rank's"))
        positions.loaded(self, state_dict)
        return original_load(self, state_dict)

    loader_cls.__init__ = __init__
    loader_cls.__iter__ = __iter__
    loader_cls.state_dict = state_dict
    loader_cls.load_state_dict = load_state_dict
    iterator_cls.__next__ = __next__


def _attach_workers(worker_module: ModuleType) -> None:
    """Worker processes: their RNG state rides in the dataset state torchdata snapshots with each batch.

    ``_worker_loop`` looks both functions up in its module at call time, in
    the worker process (forked after this patch, or a spawned child whose
    jit-run bootstrap attached it again on import).
    """
    original_make = worker_module._make_state_dict
    original_deserialize = worker_module.try_to_deserialize
    dataset_state_key = worker_module._DATASET_STATE

    @functools.wraps(original_make)
    def make_state_dict(*args: Any, **kwargs: Any) -> Any:
        import torch

        state = original_make(*args, **kwargs)
        dataset_state = state.get(dataset_state_key)
        if dataset_state is None or isinstance(dataset_state, dict):
            rng = torch.frombuffer(bytearray(rng_state.capture()), dtype=torch.uint8)
            state[dataset_state_key] = {**(dataset_state or {}), WORKER_RNG_KEY: rng}
        return state

    @functools.wraps(original_deserialize)
    def try_to_deserialize(obj: Any, state_dict: Any) -> Any:
        if isinstance(state_dict, dict) and WORKER_RNG_KEY in state_dict:
            import torch.utils.data

            state_dict = dict(state_dict)
            rng = state_dict.pop(WORKER_RNG_KEY)
            if torch.utils.data.get_worker_info() is not None and isinstance(rng, torch.Tensor):
                # after the worker's seeding and worker_init_fn: continue where the last yielded batch left it
                rng_state.restore(bytes(rng.numpy()))
            if not state_dict:
                return original_deserialize(obj, {}) if _is_stateful(obj, worker_module) else obj
        return original_deserialize(obj, state_dict)

    worker_module._make_state_dict = make_state_dict
    worker_module.try_to_deserialize = try_to_deserialize


def _is_stateful(obj: Any, worker_module: ModuleType) -> bool:
    return isinstance(obj, worker_module.Stateful)
