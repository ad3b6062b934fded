"""Framework adapters: just-in-time checkpointing for Hugging Face Trainer and PyTorch Lightning jobs, no code change.

jit-run's worker bootstrap (``jitckpt/worker/_bootstrap/sitecustomize.py``)
calls ``install()`` in every worker it starts, right after ``jitckpt.worker.arm()``.
It only puts a post-import hook (``jitckpt.worker.importhook``) on ``sys.meta_path``; when the
script imports a framework's trainer module, that framework's adapter wraps
the trainer's entry point (``transformers.Trainer.train``,
``lightning.pytorch.Trainer.fit`` and ``pytorch_lightning.Trainer.fit``).  From
there it registers the framework's own checkpoint save as the JIT save and,
on a restart, makes the framework resume from the JIT checkpoint:

- ``hf_trainer``: Hugging Face ``Trainer``;
- ``lightning_trainer``: PyTorch Lightning ``Trainer`` (both package names);
- ``torchdata_loader``: torchdata's ``StatefulDataLoader`` (each rank resumes
  with its own data position, seeds and worker RNG);
- ``base``: what both do with the worker's runtime;

A script that calls ``jitckpt.register_save_checkpoint`` keeps its own save
and resume.  The adapters sit above ``jitckpt.worker`` and the worker never
imports them.
"""

from __future__ import annotations

from types import ModuleType

from jitckpt.worker import importhook


def _attach_hf_trainer(module: ModuleType) -> None:
    from jitckpt.adapters import hf_trainer

    hf_trainer.attach(module)


def _attach_lightning_trainer(module: ModuleType) -> None:
    from jitckpt.adapters import lightning_trainer

    lightning_trainer.attach(module)


def _attach_torchdata_loader(module: ModuleType) -> None:
    from jitckpt.adapters import torchdata_loader

    torchdata_loader.attach(module)


# the module whose import attaches an adapter
ADAPTED_MODULES = {
    "transformers.trainer": _attach_hf_trainer,
    "lightning.pytorch.trainer.trainer": _attach_lightning_trainer,
    "pytorch_lightning.trainer.trainer": _attach_lightning_trainer,
    "torchdata.stateful_dataloader.stateful_dataloader": _attach_torchdata_loader,
}
_installed = False


def install() -> None:
    """Attach each adapter when its framework's trainer module is imported (idempotent)."""
    global _installed
    if not _installed:
        _installed = True
        importhook.install(ADAPTED_MODULES)
