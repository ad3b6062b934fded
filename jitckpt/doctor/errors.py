"""The doctor's one error: an input (program, library or coverage list) it cannot read."""

from __future__ import annotations


class DoctorError(Exception):
    """The input cannot be analysed (missing, unreadable, not ELF, a damaged coverage list); one line for the user."""
