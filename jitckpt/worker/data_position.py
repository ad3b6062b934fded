"""Which batches a minibatch took: a resume that would train on other batches than the fault-free run stops.

With a plain ``torch.utils.data.DataLoader`` the script owns its data
position (docs/user-guide.md, "Data loading"): a script that restarts the
epoch's iterator on resume without skipping to the saved position trains
the redone minibatch, and every one after it, on other batches, and would
end with other parameters while the job reports success.  jitckpt cannot
know the script's position, but it can see which batches it takes:

- every batch a DataLoader iterator yields (``_BaseDataLoaderIter.__next__``)
  gets a digest: the types, shapes and dtypes of what it holds, and up to
  4 KiB from each end of every CPU tensor or array in it (so a batch of other
  samples, or of samples augmented with other random numbers, has another
  one).  The digest is noted with the number of the loader (by creation
  order: the same script builds its loaders in the same order) for the
  minibatch in progress, until the minibatch's first collective.  The notes
  go into this rank's host stash (``stash.FETCH``), and a JIT save copies
  them into the checkpoint like the RNG state;
- on resume, this rank's own notes for the redone minibatch are read back
  (never a replica's); from the resume to the redone minibatch's first
  collective (or optimizer step, if there is none), the batches taken are
  noted again;
- at that point, before this rank contributes anything to the minibatch, for
  every loader that yielded a batch in both runs, each batch the fault-free
  run took must have been taken again.  A script that skips to its position
  by iterating takes the skipped batches too, and one that uses sampler
  arithmetic takes the same batch, so both pass; a loader that yielded
  nothing since the resume (an evaluation loader the redone minibatch does
  not run) is not compared.  Otherwise the resume is not the fault-free
  run's (``resume.inexact_resume``: the job stops with the reason, unless the
  user allowed inexact resumes).

torchdata's ``StatefulDataLoader`` goes through the same ``__next__``: its
adapter restores the position, and the check confirms it.  A minibatch that
took no batch before its first collective, a loader made anew after the
resume (numbered differently), iterators that are not torch's, and notes
lost with the rank's host are not checked.  The notes are a fixed
binary format that decodes to numbers only (a checkpoint is untrusted input).
Cost: a digest and a stash write per batch, 45-73 us for a batch of two
tensors on the 2-core test machine (``benchmarks/batch_digest.py``); more for
batches with many Python items.
"""

from __future__ import annotations

import itertools
import struct
import sys
from typing import TYPE_CHECKING, Any, Callable

import xxhash

from jitckpt.store import CheckpointError
from jitckpt.worker import stash

if TYPE_CHECKING:
    from jitckpt.worker.runtime import JitRuntime

MAGIC = b"JITBATCH1\0"
_ENTRY = struct.Struct("<I8s")  # loader number (NO_NUMBER: unknown), digest of the batch
NO_NUMBER = 0xFFFFFFFF
MAX_ENTRIES = 256  # per minibatch; later batches of the same minibatch are not noted (the check uses those it has)

_numbers = itertools.count()


class DataPositionError(ValueError):
    """Stored notes of taken batches not in jitckpt's format (corrupt, truncated or foreign)."""


def number_loader(loader: Any) -> None:
    """Give a DataLoader being created its number (creation order in this process)."""
    try:
        loader._jitckpt_position_number = next(_numbers)
    except AttributeError:  # (a loader class with __slots__: its batches are noted as of no known loader)
        pass


def loader_number(iterator: Any) -> int:
    """The number of the loader an iterator belongs to (NO_NUMBER if not known)."""
    number = getattr(iterator, "_jitckpt_position_number", None)
    return NO_NUMBER if number is None else int(number)


_ENDS = 4 << 10  # bytes read from each end of a tensor or array
_MAX_ITEMS = 4096  # items of a list, tuple or dict that go into a digest


def digest(batch: Any) -> bytes:
    """8 bytes that tell one batch from another (what it holds, and the ends of its tensors' bytes)."""
    h = xxhash.xxh3_64()
    _feed(h, batch, 0)
    return h.digest()


def _ends(h: Any, data: memoryview) -> None:
    """Put the first and last _ENDS bytes of a flat byte view (all of it if shorter) into ``h``."""
    n = len(data)
    h.update(b"%d:" % n)
    if n <= 2 * _ENDS:
        h.update(data)
    else:
        h.update(data[:_ENDS])
        h.update(data[n - _ENDS:])


def _feed(h: Any, x: Any, depth: int) -> None:
    """Put what identifies ``x`` into ``h``; objects of other types contribute only their type's name."""
    if depth > 8:
        h.update(b"(deep)")
        return
    kind = type(x)
    if x is None or kind in (bool, int, float, complex, str):
        h.update(f"{kind.__name__}:{x!r};".encode())
    elif kind in (bytes, bytearray):
        h.update(b"bytes:")
        _ends(h, memoryview(x))
    elif isinstance(x, (list, tuple)):
        h.update(f"{kind.__name__}[{len(x)}](".encode())
        for item in x[:_MAX_ITEMS]:
            _feed(h, item, depth + 1)
        h.update(b")")
    elif isinstance(x, dict):
        h.update(f"dict[{len(x)}](".encode())
        for n, (key, value) in enumerate(x.items()):
            if n == _MAX_ITEMS:
                break
            _feed(h, key, depth + 1)
            _feed(h, value, depth + 1)
        h.update(b")")
    elif _is_tensor(x):
        h.update(f"tensor:{x.dtype}:{x.shape}:{x.is_cpu};".encode())
        if x.is_cpu and x.layout == _strided():
            try:
                if x.requires_grad:
                    x = x.detach()
                if not x.is_contiguous():
                    x = x.reshape(-1)  # (a copy: rare for what a DataLoader collates)
                try:
                    data = memoryview(x.numpy()).cast("B")
                except TypeError:  # (a dtype NumPy lacks: bfloat16, float8)
                    data = memoryview(x.reshape(-1).view(_uint8()).numpy())
                _ends(h, data)
            except (RuntimeError, TypeError, ValueError):
                pass  # (a tensor whose bytes cannot be read: its dtype and shape only)
    elif type(x).__module__ == "numpy" and hasattr(x, "dtype") and hasattr(x, "shape"):
        h.update(f"ndarray:{x.dtype}:{tuple(x.shape)};".encode())
        if x.dtype != object:
            import numpy

            _ends(h, memoryview(numpy.ascontiguousarray(x).reshape(-1).view(numpy.uint8)))
    else:
        h.update(f"<{kind.__module__}.{kind.__qualname__}>".encode())


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _strided() -> Any:
    return sys.modules["torch"].strided


def _uint8() -> Any:
    return sys.modules["torch"].uint8


def encode(entries: list[tuple[int, bytes]]) -> bytes:
    return MAGIC + b"".join(_ENTRY.pack(number, d) for number, d in entries)


def decode(payload: bytes) -> list[tuple[int, bytes]]:
    """The entries of ``encode``; DataPositionError for anything else."""
    if not payload.startswith(MAGIC) or (len(payload) - len(MAGIC)) % _ENTRY.size:
        raise DataPositionError("not jitckpt's notes of taken batches (wrong header or length)")
    body = payload[len(MAGIC):]
    if len(body) // _ENTRY.size > MAX_ENTRIES:
        raise DataPositionError(f"more than {MAX_ENTRIES} batches noted for one minibatch")
    return [_ENTRY.unpack_from(body, at) for at in range(0, len(body), _ENTRY.size)]


class TakenBatches:
    """This rank's notes of the batches each minibatch took, and the check of a redone minibatch (after a resume)."""

    def __init__(self, rt: "JitRuntime") -> None:
        self.rt = rt
        self._step: int | None = None          # the minibatch whose notes _entries are
        self._entries: list[tuple[int, bytes]] = []
        self._closed_for: int | None = None    # the minibatch whose first collective has been issued
        # After a resume: the fault-free run's notes for the redone minibatch, and what this run took since.
        self.expected: list[tuple[int, bytes]] | None = None
        self._redone: list[tuple[int, bytes]] = []
        self._refuse: Callable[[str], None] = lambda reason: None

    def arm(self, expected: list[tuple[int, bytes]], refuse: Callable[[str], None]) -> None:
        """Check the redone minibatch against ``expected``; a mismatch calls ``refuse`` with the reason."""
        self.expected, self._refuse, self._redone = expected, refuse, []

    def yielded(self, iterator: Any, batch: Any) -> None:
        """A DataLoader iterator yielded ``batch``."""
        step = self.rt.step
        if self._closed_for == step:
            return
        entry = (loader_number(iterator), digest(batch))
        if self.expected is not None:
            if len(self._redone) < 64 * MAX_ENTRIES:  # (a script that skips far: enough to find the batches)
                self._redone.append(entry)
            return
        if self._step != step:
            self._step, self._entries = step, []
        if len(self._entries) < MAX_ENTRIES:
            self._entries.append(entry)
            self.rt.stash_rank_state(stash.FETCH, step, encode(self._entries))

    def minibatch_committed(self, collective: bool) -> None:
        """A collective (``collective``) or the optimizer step is about to be issued: the minibatch's batches are
        noted.  In the redone minibatch, a collective before any batch was taken since the resume (DDP's
        broadcast as it wraps the model, a barrier after loading) does not end the comparison: nothing this rank
        contributes to it comes from the data."""
        step = self.rt.step
        if self._closed_for == step:
            return
        if collective and self.expected is not None and step == self.rt.resumed_from and not self._redone:
            return
        self._closed_for = step
        if self.expected is not None and step == self.rt.resumed_from:
            expected, self.expected = self.expected, None
            self._check(expected, self._redone)
            self._redone = []

    def _check(self, expected: list[tuple[int, bytes]], redone: list[tuple[int, bytes]]) -> None:
        for number in sorted({n for n, _ in expected}):
            again = {d for n, d in redone if n == number}
            if not again:
                continue  # (nothing taken from it since the resume: nothing to compare)
            missing = [d for n, d in expected if n == number and d not in again]
            if missing:
                which = "a data loader of no known number" if number == NO_NUMBER else f"data loader #{number}"
                self._refuse(
                    f"rank {self.rt.rank}'s {which} did not yield again {len(missing)} of the "
                    f"{sum(1 for n, _ in expected if n == number)} batch(es) minibatch {self.rt.resumed_from} "
                    f"took in the run that failed (it yielded {len(again)} other batch(es) since the resume): "
                    f"the redone minibatch would train on other data (another position in the data, or samples "
                    f"augmented with other random numbers). With a plain DataLoader the script skips to its "
                    f"saved position itself, and augments as a function of the sample (docs/user-guide.md, "
                    f"\"Data loading\"); or use torchdata's StatefulDataLoader")
                return


def arm_check(rt: "JitRuntime", payload: bytes | None, where: str, refuse: Callable[[str], None]) -> None:
    """After a resume: compare the redone minibatch's batches with ``payload`` (this rank's own notes), if any.

    A mismatch calls ``refuse`` with the reason (``resume.inexact_resume``: it stops the job, or returns if the
    user allowed inexact resumes).
    """
    if payload is None:
        return
    try:
        entries = decode(payload)
    except DataPositionError as exc:
        raise CheckpointError(f"{where}: the notes of taken batches stored for rank {rt.rank} are unusable "
                              f"({exc}); nothing was loaded from them") from None
    if entries:
        rt.taken_batches.arm(entries, refuse)
