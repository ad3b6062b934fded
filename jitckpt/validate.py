"""The one number validator: every numeric option and environment variable goes through it.

Command-line options (``jit-run``, ``jit-run plan``), environment variables
(``JITCKPT_HANG_TIMEOUT``, ...) and model parameters (``jitckpt.plan``) are
all checked here, so ``inf``, ``nan``, ``-1`` or ``abc`` get the same clear
message everywhere.  ``argparse_type`` adapts a check for ``type=``.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable, TypeVar

T = TypeVar("T")


def check_number(
    value: object,
    what: str,
    *,
    integer: bool = False,
    above: float | None = None,
    at_least: float | None = None,
    below: float | None = None,
    at_most: float | None = None,
) -> float:
    """``value`` (a number or its text) as a finite float (or int with ``integer``), within bounds.

    ``above``/``at_least`` and ``below``/``at_most`` are the open/closed lower
    and upper bounds.  Raises ValueError naming ``what`` and the accepted range.
    """
    expected = _expected(integer, above, at_least, below, at_most)
    if isinstance(value, bool):
        raise ValueError(f"{what} must be {expected}, got {value!r}")
    number: float
    try:
        if integer:
            number = int(value.strip()) if isinstance(value, str) else value  # type: ignore[assignment]
            if not isinstance(number, int) and not (hasattr(number, "__index__")):
                raise ValueError
            number = int(number)
        else:
            number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be {expected}, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{what} must be {expected}, got {value!r}")
    if (above is not None and not number > above) or (at_least is not None and not number >= at_least) or (
        below is not None and not number < below
    ) or (at_most is not None and not number <= at_most):
        raise ValueError(f"{what} must be {expected}, got {value!r}")
    return number


def _expected(integer: bool, above: float | None, at_least: float | None, below: float | None,
              at_most: float | None = None) -> str:
    kind = "a whole number" if integer else "a finite number"
    bounds = []
    if above is not None:
        bounds.append(f"> {above:g}")
    if at_least is not None:
        bounds.append(f">= {at_least:g}")
    if below is not None:
        bounds.append(f"< {below:g}")
    if at_most is not None:
        bounds.append(f"<= {at_most:g}")
    return kind + (" " + " and ".join(bounds) if bounds else "")


def positive_number(value: object, what: str = "value") -> float:
    """A finite number > 0 (seconds, rates, sizes)."""
    return check_number(value, what, above=0)


def fraction(value: object, what: str = "value") -> float:
    """A finite number in [0, 1)."""
    return check_number(value, what, at_least=0, below=1)


def share(value: object, what: str = "value") -> float:
    """A finite number in [0, 1] (a share of a whole, all of it allowed)."""
    return check_number(value, what, at_least=0, at_most=1)


def positive_int(value: object, what: str = "value") -> int:
    """A whole number > 0."""
    return int(check_number(value, what, integer=True, at_least=1))


def non_negative_int(value: object, what: str = "value") -> int:
    """A whole number >= 0."""
    return int(check_number(value, what, integer=True, at_least=0))


def argparse_type(check: Callable[[object, str], T]) -> Callable[[str], T]:
    """``check`` as an argparse ``type=``: its ValueError becomes an ArgumentTypeError
    (argparse names the option itself: "argument --x: must be ...")."""

    def parse(text: str) -> T:
        try:
            return check(text, "")
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).strip()) from None

    parse.__name__ = check.__name__
    return parse
