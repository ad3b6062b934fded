"""The store's errors: what every tier, the selection and the shard identity raise or warn.

Kept apart from the interface (``base``) so that the values the interface is
made of (``shard.ParallelCoordinates``) can raise them without importing it.
"""

from __future__ import annotations


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message names cause and fix."""


class CheckpointWarning(UserWarning):
    """A checkpoint was skipped (torn, corrupt, foreign) and an older one used."""
