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
  state at that point; right before each optimizer step the state after the
  minibatch's last batch is stashed for i+1 (a rank that dies inside its step
  is saved at i+1 by its replicas);
- during a JIT save ``loader.state_dict()`` returns the stashed start of the
  saved minibatch, and the JIT save copies every local rank's stash into the
  checkpoint;
- on resume ``loader.load_state_dict(state)`` is given this rank's own state
  instead of whatever file the script read (a replica's, for a replacement
  rank); where the rank's own state was lost with its host, it says so;
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
from jitckpt.worker import rng_state, stash
from jitckpt.worker.console import log
from jitckpt.worker.save import in_jit_save

if TYPE_CHECKING:
    from jitckpt.worker.runtime import JitRuntime

# The key under which a worker's RNG state rides in torchdata's per-worker dataset state.
WORKER_RNG_KEY = "_jitckpt_worker_rng"
# A loader's stashed state when the minibatch starts on a new epoch's iterator, not yet created.
EPOCH_END = {"_jitckpt_epoch_end": True}


def _exhausted(iterator: Any) -> bool:
    try:
        return iterator._num_yielded >= len(iterator)
    except TypeError:  # an IterableDataset without __len__: it may go on
        return False


class LoaderPositions:
    """This process's stateful loaders and, per minibatch, the state each one starts it with."""

    def __init__(self, rt: "JitRuntime") -> None:
        self.rt = rt
        self._numbers = itertools.count()
        self._states: dict[int, dict[int, Any]] = {}  # step -> {loader number: state}
        self._started: dict[int, int] = {}  # loader number -> the step whose start it has recorded
        self._active: dict[int, weakref.ref] = {}  # loaders that yielded since the last optimizer step
        self._own: dict[int, Any] | None = None
        self._warned: set[str] = set()

    def number(self) -> int:
        return next(self._numbers)

    # ----- recording ---------------------------------------------------------------

    def first_next(self, loader: Any, iterator: Any) -> tuple[Any, bytes] | None:
        """Before a ``next()``: (loader state, RNG state) if this is the loader's first fetch in this minibatch."""
        number = loader._jitckpt_number
        if self._started.get(number) == self.rt.step:
            return None
        if self.rt.pending_rng is not None:
            self.rt.minibatch_starts()  # the redone minibatch starts here: its fetch may draw random numbers
        # The RNG state too: what this minibatch draws from, after the script's own draws (iter() of a new epoch).
        return iterator.state_dict(), rng_state.capture()

    def fetched(self, loader: Any, before: tuple[Any, bytes] | None) -> None:
        """After a ``next()`` that yielded a batch: record the minibatch's start (first fetch only)."""
        number = loader._jitckpt_number
        self._active[number] = weakref.ref(loader)
        if before is None:
            return
        step = self.rt.step
        self._started[number] = step
        state, rng = before
        if self.rt.stash is not None:
            self.rt.stash.put(step, rng)
        self._put(step, number, state)

    def before_optimizer_step(self) -> None:
        """Right before an optimizer step: each active loader's state is where minibatch step+1 starts."""
        for number, ref in list(self._active.items()):
            loader = ref()
            if loader is None or loader._iterator is None:
                continue
            iterator = loader._iterator
            # An exhausted iterator: the next minibatch starts on a new one, whose seeds the rank draws
            # from its generator when the script calls iter() again; record that, not the old position.
            state = EPOCH_END if _exhausted(iterator) else iterator.state_dict()
            self._put(self.rt.step + 1, number, state)
        self._active.clear()

    def _put(self, step: int, number: int, state: Any) -> None:
        for old in [s for s in self._states if s < step - 1]:
            del self._states[old]
        states = self._states.setdefault(step, {})
        states[number] = state
        try:
            payload = safe_codec.encode(states)
        except safe_codec.SafeCodecError as exc:
            self._warn_once(f"encode-{number}", f"warning: data loader #{number}'s state cannot be stashed ({exc}); "
                                                f"a replacement rank will resume with its replica's data position")
            return
        try:
            self.rt.stash_rank_state(stash.LOADER, step, payload)
        except stash.StashFull as exc:
            self._warn_once(f"full-{number}", f"warning: data loaders' state not stashed: {exc}")

    def state_at(self, loader: Any, step: int) -> Any | None:
        return self._states.get(step, {}).get(loader._jitckpt_number)

    # ----- resuming ----------------------------------------------------------------

    def own_state(self, loader: Any) -> tuple[bool, Any]:
        """(found, state): this rank's own stashed state of ``loader`` for the resumed minibatch (once per loader)."""
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
            return True, self._own.pop(number)
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
        self._jitckpt_number = _get_positions(rt).number() if rt is not None else None

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
            if saved is not None and saved != EPOCH_END:
                return saved  # where the saved minibatch starts, not where the loader is now
        return original_state_dict(self)

    @functools.wraps(original_load)
    def load_state_dict(self: Any, state_dict: Any) -> Any:
        rt = worker.current()
        if rt is not None and rt.resumed_from is not None and getattr(self, "_jitckpt_number", None) is not None:
            found, own = _get_positions(rt).own_state(self)
            if found and own == EPOCH_END:
                log(f"data loader #{self._jitckpt_number}: minibatch {rt.resumed_from} starts a new epoch; "
                    f"rank {rt.rank}'s loader draws its seeds again from the rank's own generator")
                self._jitckpt_new_epoch = True
                return original_load(self, {})
            if found:
                log(f"data loader #{self._jitckpt_number}: resuming with rank {rt.rank}'s own position, seeds and "
                    f"worker RNG for minibatch {rt.resumed_from}")
                state_dict = own
            elif rt.checkpoint is not None and int(rt.checkpoint.meta.get("rank", rt.rank)) != rt.rank:
                log(f"warning: data loader #{self._jitckpt_number}: rank {rt.rank}'s own data position and seeds "
                    f"for minibatch {rt.resumed_from} were lost (its host's stash did not survive); it loads "
                    f"rank {rt.checkpoint.meta.get('rank')}'s, so this rank's batches and augmentation will differ "
                    f"from a fault-free run")
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
