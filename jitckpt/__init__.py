"""jitckpt: just-in-time checkpointing for distributed PyTorch training.

When a rank fails, the healthy data-parallel replicas save their (identical)
state at once and the job restarts having lost at most one minibatch.
See README.md; the two calls a training script needs are re-exported here.
"""

from jitckpt import api as _api
from jitckpt.api import current_step, jit_get_checkpoint_path, register_save_checkpoint
from jitckpt.checkpoint_store import CheckpointError

__all__ = ["register_save_checkpoint", "jit_get_checkpoint_path", "current_step", "CheckpointError"]
__version__ = "0.1.0"

# Inside a jit-run worker, arm the watchdog and hooks as soon as jitckpt is imported.
_api.runtime()
