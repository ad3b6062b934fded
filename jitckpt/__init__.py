"""jitckpt: just-in-time checkpointing for distributed PyTorch training.

When a rank fails, the healthy data-parallel replicas save their (identical)
state at once and the job restarts having lost at most one minibatch.  The
two calls a training script needs are re-exported here; importing jitckpt has
no side effects (jit-run arms its workers through ``jitckpt.worker.arm``).

Where each part lives (imports point down this list):

- ``jitckpt.api``: the public calls;
- ``jitckpt.launch``: ``jit-run`` itself, torchrun's agent with jit-run's patches, the report;
- ``jitckpt.worker``: everything that runs inside a training process (phase, parking,
  watchdog, save, resume, RNG, module buffers, DDP layout);
- ``jitckpt.doctor``, ``jitckpt.plan``: the offline tools;
- ``jitckpt.store``: checkpoint stores and which checkpoint a rank resumes from;
- ``jitckpt.native``: where the native libraries are, and the interposer's Python binding;
- ``jitckpt.config``, ``jitckpt.validate``, ``jitckpt.eventlog``, ``jitckpt.jit_event``,
  ``jitckpt.faults``: names, checks and records shared by all of them.
"""

from jitckpt.api import current_step, jit_get_checkpoint_path, register_save_checkpoint
from jitckpt.store.errors import CheckpointError

__all__ = ["register_save_checkpoint", "jit_get_checkpoint_path", "current_step", "CheckpointError"]
__version__ = "0.1.0"
