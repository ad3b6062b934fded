"""PyTorch Lightning ``Trainer``: its own checkpoint, saved just in time, and its own resume.

Attached when ``lightning.pytorch.trainer.trainer`` (or
``pytorch_lightning.trainer.trainer``) is imported: ``Trainer.fit`` is wrapped.
At the start of ``fit()`` the adapter

- registers a JIT save that writes ``lightning.ckpt`` into the directory
  jitckpt gives: the checkpoint connector's ``dump_checkpoint()`` (model,
  optimizers, schedulers, callbacks, precision, hyper-parameters) written by
  the strategy's ``checkpoint_io``.  ``Trainer.save_checkpoint`` is not used:
  it writes on rank 0 only and ends with ``strategy.barrier``;
- keeps the loop state as of the last minibatch boundary (``on_train_batch_end``
  of a batch that stepped the optimizer, exactly what ``ModelCheckpoint``
  would store there) and saves that instead of the mid-minibatch one: the
  model and optimizer in a JIT checkpoint are those of a minibatch's start;
- on a restart passes ``ckpt_path=<JIT checkpoint>/lightning.ckpt``.
  Lightning restores the model, optimizer, schedulers and loop counters, but
  replays a plain ``DataLoader`` from the start of the interrupted epoch (it
  fast-forwards only loaders with ``state_dict``/``load_state_dict``): the
  adapter makes the loader's next pass skip the batches the epoch already
  trained on, at the batch sampler (indices only, no data loaded);
- stashes the RNG state at the first ``on_train_batch_start`` of each
  minibatch and puts this rank's own state back there after a resume
  (Lightning saves no RNG state);
- marks the optimizer phase right: Lightning runs the last micro-batch's
  forward and backward inside ``optimizer.step(closure)``
  (``jitckpt.adapters.base.track_closure_steps``).

Lightning's ``global_step`` counts optimizer steps, like jitckpt's minibatch.
Strategies other than DDP and a single device (FSDP, DeepSpeed, model
parallel) are not covered: their checkpoints gather across ranks.
"""

from __future__ import annotations

import copy
import functools
import importlib
import itertools
import os
from types import ModuleType
from typing import TYPE_CHECKING, Any, Iterator

from jitckpt.adapters import base
from jitckpt.worker.console import log

if TYPE_CHECKING:
    from jitckpt.worker.runtime import JitRuntime

FRAMEWORK = "PyTorch Lightning"
CHECKPOINT_NAME = "lightning.ckpt"


def attach(module: ModuleType) -> None:
    """Wrap ``Trainer.fit`` of the just-imported Lightning trainer module."""
    package = module.__name__.rsplit(".trainer.trainer", 1)[0]  # lightning.pytorch or pytorch_lightning
    base.wrap_entry_point(module.Trainer, "fit", "ckpt_path",
                          lambda trainer, rt, requested: _prepare(trainer, rt, package, requested))


def _not_covered(trainer: Any, package: str) -> str | None:
    strategies = importlib.import_module(f"{package}.strategies")
    strategy = trainer.strategy
    if isinstance(strategy, strategies.DeepSpeedStrategy) or not isinstance(
            strategy, (strategies.DDPStrategy, strategies.SingleDeviceStrategy)):
        return type(strategy).__name__
    return None


def _prepare(trainer: Any, rt: "JitRuntime", package: str, requested: Any) -> Any:
    """Register the save, add the callback, and return what ``ckpt_path`` should be."""
    what = _not_covered(trainer, package)
    if what is not None:
        log(f"{FRAMEWORK} with {what} is not covered by jitckpt's adapter (its checkpoint gathers across ranks); "
            f"no JIT save is registered")
        return requested
    loops = _LoopsAtMinibatchStart(rt)
    if not base.claim(rt, functools.partial(_jit_save, trainer, rt, loops), FRAMEWORK):
        return requested
    base.track_closure_steps(rt)
    path = base.resume_point(rt)
    callback_class = _callback_class(package)
    trainer.callbacks[:] = [c for c in trainer.callbacks if not isinstance(c, callback_class)]  # (a second fit())
    # first in line: user callbacks then see (and may draw from) the same state in every attempt
    trainer.callbacks.insert(0, callback_class(rt, base.MinibatchRng(rt), loops))
    if path is None:
        return requested
    if requested is not None:
        log(f"{FRAMEWORK}: ckpt_path={requested!r} replaced by the newer JIT checkpoint")
    _skip_trained_batches_on_resume(trainer.fit_loop)
    return str(path / CHECKPOINT_NAME)


class _LoopsAtMinibatchStart:
    """The fit loop's state as of the start of minibatch ``step`` (one ``state_dict()`` per optimizer step)."""

    def __init__(self, rt: "JitRuntime") -> None:
        self.rt = rt
        self.step: int | None = None
        self.state: dict | None = None

    def keep(self, state: dict) -> None:
        self.step, self.state = self.rt.step, state


@functools.cache
def _callback_class(package: str) -> type:
    callback_base = importlib.import_module(package).Callback

    class JitckptCallback(callback_base):  # type: ignore[misc, valid-type]
        """Minibatch boundaries for jitckpt: the RNG state at each start, the loop state at each end."""

        def __init__(self, rt: "JitRuntime", rng: base.MinibatchRng, loops: _LoopsAtMinibatchStart) -> None:
            self.rt, self.rng, self.loops = rt, rng, loops
            self._started: int | None = None

        def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict) -> None:
            self.loops.keep(copy.deepcopy(checkpoint["loops"]["fit_loop"]))  # the resumed minibatch's start

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            if self.loops.step is None:  # a fresh start: minibatch 0
                self.loops.keep(trainer.fit_loop.state_dict())

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if self._started != self.rt.step:  # the first micro-batch of a minibatch
                self._started = self.rt.step
                self.rng.restore()
                self.rng.stash()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if self.loops.step != self.rt.step:  # this batch stepped the optimizer: the next minibatch starts here
                self.loops.keep(trainer.fit_loop.state_dict())

    return JitckptCallback


def _jit_save(trainer: Any, rt: "JitRuntime", loops: _LoopsAtMinibatchStart, path: str) -> None:
    """The JIT save: Lightning's checkpoint of this rank, with the loop state of the saved minibatch's start."""
    if loops.step != rt.step:
        raise RuntimeError(f"{FRAMEWORK}'s loop state was kept at minibatch {loops.step}, not at the saved minibatch "
                           f"{rt.step}; a checkpoint mixing the two would resume at the wrong batch")
    checkpoint = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
    checkpoint["loops"]["fit_loop"] = loops.state
    trainer.strategy.checkpoint_io.save_checkpoint(checkpoint, os.path.join(path, CHECKPOINT_NAME))


def _skip_trained_batches_on_resume(fit_loop: Any) -> None:
    """Once the resumed loop state is loaded, make the interrupted epoch's loaders skip what it trained on."""
    load_states = fit_loop._load_combined_loader_states  # called by setup_data() right before the first iter()

    def load_states_then_skip() -> None:
        del fit_loop._load_combined_loader_states  # once
        load_states()
        trained = fit_loop.epoch_loop.batch_progress.current.ready  # batches of this epoch the checkpoint had fetched
        combined = fit_loop._combined_loader
        for loader, limit in zip(combined.flattened, combined.limits):
            if trained <= 0 or trained >= limit:
                continue  # the epoch had not started, or it had ended: nothing to skip
            if hasattr(loader, "state_dict") and hasattr(loader, "load_state_dict"):
                continue  # a resumable loader: Lightning restored its position itself
            batch_sampler = getattr(loader, "batch_sampler", None)
            if batch_sampler is None:
                log(f"{FRAMEWORK}: cannot skip the {trained} batches epoch already trained on in a loader without "
                    f"a batch sampler ({type(loader).__name__}); it starts the epoch over")
                continue
            # (DataLoader refuses to have its batch sampler set after construction)
            object.__setattr__(loader, "batch_sampler", _SkipFirstBatches(batch_sampler, trained))
            log(f"{FRAMEWORK}: the resumed epoch skips the {trained} batches it already trained on "
                f"(so Lightning's warning about a loader that is not resumable does not apply)")

    fit_loop._load_combined_loader_states = load_states_then_skip


class _SkipFirstBatches:
    """A batch sampler whose next pass starts after its first ``count`` batches (indices drawn, no data loaded)."""

    def __init__(self, batch_sampler: Any, count: int) -> None:
        self.batch_sampler = batch_sampler
        self.count = count

    def __iter__(self) -> Iterator[Any]:
        batches = iter(self.batch_sampler)
        count, self.count = self.count, 0
        for _ in itertools.islice(batches, count):
            pass
        yield from batches

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __getattr__(self, name: str) -> Any:  # sampler, batch_size, drop_last, ... as the wrapped one has them
        if name.startswith("__") or name == "batch_sampler":
            raise AttributeError(name)
        return getattr(self.batch_sampler, name)
