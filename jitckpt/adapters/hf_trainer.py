"""Hugging Face ``transformers.Trainer``: its own checkpoint, saved just in time, and its own resume.

Attached when ``transformers.trainer`` is imported: ``Trainer.train`` is wrapped.
At the start of ``train()`` the adapter

- registers a JIT save that writes, into the directory jitckpt gives, what
  ``Trainer._save_checkpoint`` writes and ``resume_from_checkpoint`` reads:
  the model (``_save``: weights and config, training arguments), optimizer,
  scheduler and scaler (``_save_optimizer_and_scheduler``, ``_save_scaler``),
  ``rng_state_<rank>.pth`` for every rank on this host, and
  ``trainer_state.json``.  Every rank writes its own copy (HF writes on rank 0
  only: ``args.should_save`` reads True on the save thread), and the collective
  parts of ``_save_checkpoint`` are left out: the barrier before the best-model
  check, ``store_flos`` (a broadcast; the state's ``total_flos`` lacks the FLOPs
  since the last log), checkpoint rotation and the Hub push;
- on a restart passes ``resume_from_checkpoint=<JIT checkpoint>``, so the
  Trainer loads it and skips the data already trained on itself;
- stashes the RNG state where HF's resume restores it: at the end of
  ``on_epoch_begin`` for a step that starts an epoch (HF restores before the
  epoch's data loader draws its seeds), at the start of ``on_step_begin``
  for any other (after the step's batches were fetched), and again when an
  evaluation loop between two steps returns; on a restart HF's
  ``_load_rng_state`` puts back this rank's own state from jitckpt;
- on a restart at an epoch's start (or the last step) whose evaluation the
  failure interrupted (the ranks that saved had not finished it), runs that
  evaluation again at the first ``on_epoch_begin`` (or before the Trainer
  finishes), from each rank's state when it began, with the best metric and
  the checkpoint due after it: the resumed Trainer would not evaluate, and
  nobody's state after it is known (``jitckpt.worker.minibatch_gap``); makes
  again a checkpoint save the failure interrupted; restores stateful
  callbacks (early stopping's patience) from the JIT checkpoint.

HF's ``global_step`` counts optimizer steps, like jitckpt's minibatch, so
``trainer_state.json`` holds the step the checkpoint is of (i, or i+1 after a
failure inside a peer's optimizer step).  DeepSpeed, FSDP, XLA, SageMaker
model parallelism and models sharded at load time are not covered: their
saves gather across ranks.
"""

from __future__ import annotations

import functools
import inspect
import os
import random
from contextlib import ExitStack, contextmanager
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable, Iterator

from jitckpt.adapters import base
from jitckpt.worker import rng_state
from jitckpt.worker.console import log
from jitckpt.worker.save import in_jit_save

if TYPE_CHECKING:
    from jitckpt.worker.runtime import JitRuntime

FRAMEWORK = "Hugging Face Trainer"


def attach(module: ModuleType) -> None:
    """Wrap ``Trainer.train`` of the just-imported ``transformers.trainer``."""
    base.wrap_entry_point(module.Trainer, "train", "resume_from_checkpoint", _prepare)


def _not_covered(trainer: Any) -> str | None:
    from transformers.utils import is_sagemaker_mp_enabled, is_torch_xla_available

    flags = {"is_deepspeed_enabled": "DeepSpeed", "is_fsdp_enabled": "FSDP", "is_fsdp_xla_enabled": "FSDP on XLA",
             "is_distributed_loading_by_transformers": "a model sharded at load time"}
    for flag, what in flags.items():
        if getattr(trainer, flag, False):
            return what
    if is_torch_xla_available():
        return "XLA"
    if is_sagemaker_mp_enabled():
        return "SageMaker model parallelism"
    return None


def _prepare(trainer: Any, rt: "JitRuntime", requested: Any) -> Any:
    """Register the save, add the callbacks, and return what ``resume_from_checkpoint`` should be."""
    what = _not_covered(trainer)
    if what is not None:
        log(f"{FRAMEWORK} with {what} is not covered by jitckpt's adapter (its save gathers across ranks); "
            f"no JIT save is registered")
        return requested
    if not base.claim(rt, functools.partial(_jit_save, trainer, rt), FRAMEWORK):
        return requested
    rt.framework_reruns_evaluation = _track_evaluations(trainer, rt)
    rt.framework_last_minibatch = trainer.args.max_steps if trainer.args.max_steps > 0 else None
    path = base.resume_point(rt)
    rng = base.MinibatchRng(rt)
    step_begin, epoch_begin = _callback_classes()
    callbacks = trainer.callback_handler.callbacks
    callbacks[:] = [c for c in callbacks if not isinstance(c, (step_begin, epoch_begin))]  # (a second train())
    # HF restores the RNG state after on_epoch_begin (a step that starts an epoch) or
    # before on_step_begin (any other step): stash it at the same points.
    first = step_begin(rng)
    callbacks.insert(0, first)
    callbacks.append(epoch_begin(rng))
    if path is None:
        return requested
    first.rerun = functools.partial(_rerun_interrupted_gap, trainer, rt, rng)
    first.trainer = trainer
    _rerun_before_finalizing(trainer, first)

    def load_rng_state(checkpoint: str) -> None:
        """The state HF restores is this rank's own, from whichever replica carried it."""
        del trainer._load_rng_state  # once
        rng.restore()

    trainer._load_rng_state = load_rng_state
    if requested not in (None, False):
        log(f"{FRAMEWORK}: resume_from_checkpoint={requested!r} replaced by the newer JIT checkpoint")
    return str(path)


def _track_evaluations(trainer: Any, rt: "JitRuntime") -> bool:
    """Note in the gap records where the Trainer's evaluation between two steps begins and ends and where its own
    checkpoint save returns (``jitckpt.worker.minibatch_gap``); False if this Trainer lacks the methods wrapped
    (another transformers version: an interrupted evaluation is then not run again)."""
    cls = type(trainer)
    names = ("_evaluate", "evaluation_loop", "_save_checkpoint", "_determine_best_metric")
    if any(getattr(cls, name, None) is None for name in names):
        return False
    if getattr(trainer.__dict__.get("_evaluate"), "_jitckpt", False):
        return True  # (a second train())
    loops_left = [0]

    def _evaluate(*args: Any, **kwargs: Any) -> Any:
        rt.gap.framework_evaluation_begins()
        datasets = trainer.eval_dataset
        loops_left[0] = len(datasets) if isinstance(datasets, dict) else 1  # (one evaluation loop per dataset)
        metrics = cls._evaluate(trainer, *args, **kwargs)
        rt.gap.framework_evaluated()  # (if the loops were not seen: another evaluation loop)
        return metrics

    def evaluation_loop(*args: Any, **kwargs: Any) -> Any:
        output = cls.evaluation_loop(trainer, *args, **kwargs)
        loops_left[0] -= 1
        if loops_left[0] == 0:
            rt.gap.framework_evaluated()  # (the last one: what follows draws nothing, unless a callback does)
        return output

    def _save_checkpoint(*args: Any, **kwargs: Any) -> Any:
        cls._save_checkpoint(trainer, *args, **kwargs)
        rt.gap.framework_saved()

    for name, wrapper in (("_evaluate", _evaluate), ("evaluation_loop", evaluation_loop),
                          ("_save_checkpoint", _save_checkpoint)):
        wrapper._jitckpt = True  # type: ignore[attr-defined]
        setattr(trainer, name, wrapper)
    return True


def _rerun_before_finalizing(trainer: Any, first: Any) -> None:
    """A resume at the last minibatch starts no epoch: the interrupted evaluation is run again before the Trainer
    finishes (and loads its best model)."""
    finalize = type(trainer)._finalize_training if hasattr(type(trainer), "_finalize_training") else None
    if finalize is None:
        return

    def _finalize_training(*args: Any, **kwargs: Any) -> Any:
        del trainer._finalize_training  # once
        rerun, first.rerun = first.rerun, None
        if rerun is not None:
            rerun()
        return finalize(trainer, *args, **kwargs)

    trainer._finalize_training = _finalize_training


def _evaluates_before(trainer: Any, step: int) -> bool:
    """True if the Trainer evaluates between optimizer steps ``step - 1`` and ``step`` (``DefaultFlowCallback``'s
    rule: at an epoch's end with ``eval_strategy="epoch"``, at every ``eval_steps`` with ``"steps"``, and at the
    last step)."""
    args, state = trainer.args, trainer.state
    if trainer.eval_dataset is None:
        return False
    strategy = getattr(args.eval_strategy, "value", args.eval_strategy)
    if strategy == "epoch":
        return args.eval_delay <= state.epoch
    if strategy == "steps":
        every = state.eval_steps or args.eval_steps
        return bool(every) and (step % every == 0 or step >= state.max_steps) and args.eval_delay <= step
    return False


def _saves_before(trainer: Any, step: int) -> bool:
    """True if the Trainer saves its own checkpoint between optimizer steps ``step - 1`` and ``step`` (``"best"``:
    if the evaluation there found a new best metric, as the trainer state restored says)."""
    args, state = trainer.args, trainer.state
    strategy = getattr(args.save_strategy, "value", args.save_strategy)
    if strategy == "epoch":
        return True  # (at an epoch's end: the only place this is asked)
    if strategy == "steps":
        return bool(state.save_steps) and (step % state.save_steps == 0 or step >= state.max_steps)
    if strategy == "best":
        return state.best_global_step == step
    return False


def _rerun_interrupted_gap(trainer: Any, rt: "JitRuntime", rng: base.MinibatchRng) -> None:
    """At the first epoch start after a resume (or at the end of training, if none follows): if the failure
    interrupted the evaluation that precedes the redone minibatch (the ranks that saved had not finished it),
    run it again, with what follows it (the best metric, the Trainer's own checkpoint), from each rank's state
    when it began, as the fault-free run did: its random draws (its data loader's seed) then precede the
    minibatch's.  If they had finished it but not the checkpoint save after it, make that save."""
    step = rt.resumed_from
    what = rt.gap.settle_rerun(_evaluates_before(trainer, step), _saves_before(trainer, step))
    if what == "evaluate":
        rng.drop()  # (the state after the evaluation is the one the redone minibatch starts with)
        log(f"{FRAMEWORK}: running again the evaluation that followed minibatch {step - 1} (the failure interrupted "
            f"it; the redone minibatch's random numbers come after its)")
        metrics = trainer._evaluate(None, None)
        new_best = trainer._determine_best_metric(metrics=metrics, trial=None)
        strategy = getattr(trainer.args.save_strategy, "value", trainer.args.save_strategy)
        # (a checkpoint the ranks that saved had made came before the evaluation: a step's, at an epoch's end)
        save = not rt.gap.saved_in_gap() and (new_best if strategy == "best" else _saves_before(trainer, step))
    elif what == "save":
        log(f"{FRAMEWORK}: making again the checkpoint of global step {step} that the failure interrupted")
        save = True
    else:
        return
    if save:
        trainer._save_checkpoint(trainer.model_wrapped, None)
        trainer.control = trainer.callback_handler.on_save(trainer.args, trainer.state, trainer.control)
    if trainer.control.should_training_stop and step < trainer.state.max_steps:
        # (early stopping: the fault-free run ended after this evaluation; the epoch just begun trains nothing)
        if not hasattr(type(trainer), "_run_epoch"):  # (another transformers version)
            from jitckpt.worker import resume

            resume.inexact_resume(rt, f"the evaluation run again before minibatch {step} stopped the training (early "
                                      f"stopping): the fault-free run ended there, but {FRAMEWORK} trains the epoch "
                                      f"it has started")
            return
        log(f"{FRAMEWORK}: the evaluation run again stopped the training (early stopping), as in the fault-free run")

        def stopped_epoch(*args: Any, **kwargs: Any) -> None:
            del trainer._run_epoch  # once

        trainer._run_epoch = stopped_epoch


def _restore_callback_states(trainer: Any, state: Any) -> None:
    """Put back the state of the stateful callbacks (early stopping's patience) from the JIT checkpoint's trainer
    state, which HF restores only with ``restore_callback_states_from_checkpoint``: the fault-free run kept it.
    The Trainer's control flags are left alone (the checkpoint's are those of a minibatch in progress)."""
    from transformers.trainer_callback import ExportableState, TrainerControl

    stored = state.stateful_callbacks or {}
    for name, data in stored.items():
        matching = [c for c in trainer.callback_handler.callbacks
                    if type(c).__name__ == name and isinstance(c, ExportableState) and not isinstance(c, TrainerControl)]
        for callback, saved in zip(matching, data if isinstance(data, list) else [data]):
            for attribute, value in (saved.get("attributes") or {}).items():
                setattr(callback, attribute, value)


def _starts_epoch(step: int, loader: Any, accumulation: int) -> bool:
    """True if optimizer step ``step`` is the first of an epoch, by the rule HF's resume uses."""
    try:
        batches = len(loader)
    except TypeError:  # no length (IterableDataset): HF skips no data and restores mid-epoch
        return False
    per_epoch = max(batches // accumulation + int(batches % accumulation > 0), 1)
    return step % per_epoch == 0


@functools.cache
def _callback_classes() -> tuple[type, type]:
    from transformers import TrainerCallback

    class JitckptStepBegin(TrainerCallback):
        """First in line: the RNG state a step that does not start an epoch starts with; after a resume, at the
        first epoch start, the evaluation the failure interrupted, run again."""

        def __init__(self, rng: base.MinibatchRng) -> None:
            self.rng = rng
            self.rerun: Callable[[], None] | None = None
            self.trainer: Any = None  # (a resumed attempt's)

        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            rerun, self.rerun = self.rerun, None
            if rerun is not None:
                rerun()

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.rerun is not None and not args.restore_callback_states_from_checkpoint:
                _restore_callback_states(self.trainer, state)

        def on_step_begin(self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kwargs: Any) -> None:
            if not _starts_epoch(state.global_step, train_dataloader, args.gradient_accumulation_steps):
                self.rng.stash()

    class JitckptEpochBegin(TrainerCallback):
        """Last in line: the RNG state an epoch, and so its first step, starts with."""

        def __init__(self, rng: base.MinibatchRng) -> None:
            self.rng = rng

        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.rng.stash()

    return JitckptStepBegin, JitckptEpochBegin


_MISSING = object()


@contextmanager
def _replaced(cls: type, name: str, replacement: Any) -> Iterator[None]:
    """``cls.<name>`` is ``replacement`` while the context lasts."""
    own = cls.__dict__.get(name, _MISSING)
    setattr(cls, name, replacement)
    try:
        yield
    finally:
        if own is _MISSING:
            delattr(cls, name)
        else:
            setattr(cls, name, own)


@contextmanager
def _every_rank_writes(trainer: Any) -> Iterator[None]:
    """On the JIT save thread every rank writes: each rank's checkpoint is a whole replica.

    HF writes on rank 0 only: ``args.should_save``, and ``save_pretrained``
    checks the process-group rank again (``should_save_on_this_rank``).
    """
    args_cls = type(trainer.args)
    should_save = inspect.getattr_static(args_cls, "should_save")
    with ExitStack() as stack:
        stack.enter_context(_replaced(args_cls, "should_save", property(
            lambda args: True if in_jit_save() else should_save.__get__(args, args_cls))))
        model_cls = type(trainer.accelerator.unwrap_model(trainer.model))
        on_this_rank = inspect.getattr_static(model_cls, "should_save_on_this_rank", None)
        if on_this_rank is not None:  # (transformers 5)
            stack.enter_context(_replaced(model_cls, "should_save_on_this_rank",
                lambda model, is_main_process: is_main_process if in_jit_save() else on_this_rank(model, is_main_process)))
        yield


def _jit_save(trainer: Any, rt: "JitRuntime", path: str) -> None:
    """The JIT save: the Trainer's checkpoint files for this rank, without collectives."""
    from transformers.trainer import TRAINER_STATE_NAME
    from transformers.trainer_callback import ExportableState

    if trainer.optimizer is None:
        raise RuntimeError(f"{FRAMEWORK} has no optimizer yet (the failure came before its training started): "
                           f"there is nothing to save beyond the checkpoint it resumed from")
    with _every_rank_writes(trainer):
        trainer._save(path)
        trainer._save_optimizer_and_scheduler(path)
        trainer._save_scaler(path)
    _write_rng_states(rt, path, trainer.args.world_size)
    state = trainer.state
    if state.global_step != rt.step:
        log(f"{FRAMEWORK}: global_step is {state.global_step} but jitckpt counted {rt.step} optimizer steps "
            f"(steps the gradient scaler skipped?); the Trainer resumes at its own global_step")
    for callback in trainer.callback_handler.callbacks + [trainer.control]:  # as _save_checkpoint does
        if isinstance(callback, ExportableState):
            name = type(callback).__name__
            if isinstance(state.stateful_callbacks.get(name), list):
                state.stateful_callbacks[name].append(callback.state())
            else:
                state.stateful_callbacks[name] = callback.state()
    state.save_to_json(os.path.join(path, TRAINER_STATE_NAME))


def _write_rng_states(rt: "JitRuntime", path: str, world_size: int) -> None:
    """``rng_state_<rank>.pth`` (HF's format) for every rank on this host, from the states stashed for the saved step."""
    import numpy as np
    import torch

    if rt.shm_dir is None:
        return
    first_local = rt.rank - rt.local_rank
    own = rng_state.capture()
    try:
        for rank in range(first_local, first_local + rt.local_world_size):
            payload = rng_state.read_stash(rng_state.stash_path(rt.shm_dir, rank)).get(rt.step)
            if payload is None:
                continue
            rng_state.restore(payload, own_generators=False)  # (this thread saves, then the process ends: borrowing is safe)
            states = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
            if torch.cuda.is_initialized():  # (as Trainer._save_rng_state stores it)
                states["cuda"] = torch.cuda.random.get_rng_state_all() if world_size > 1 else torch.cuda.random.get_rng_state()
            name = f"rng_state_{rank}.pth" if world_size > 1 else "rng_state.pth"
            torch.save(states, os.path.join(path, name))
    finally:
        rng_state.restore(own, own_generators=False)
