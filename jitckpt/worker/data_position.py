"""Which batches a minibatch took: a resume that would train on other batches than the fault-free run stops.

With a plain ``torch.utils.data.DataLoader`` the script owns its data
position (docs/user-guide.md, "Data loading"): a script that restarts the
epoch's iterator on resume without skipping to the saved position trains
the redone minibatch, and every one after it, on other batches, and would
end with other parameters while the job reports success.  jitckpt cannot
know the script's position, but it can see which batches it takes:

- every batch a DataLoader iterator yields (``_BaseDataLoaderIter.__next__``:
  plain loaders, torchdata's ``StatefulDataLoader``, the frameworks' loaders)
  gets a digest: what it holds, with dtypes and shapes, and up to 4 KiB from
  each end of every CPU tensor or array in it (from its first and last
  sample if it is not contiguous), so a batch of other samples, or of
  samples augmented with other random numbers, has another one.  It is
  noted under its loader's key (the dataset's class and length: a loader
  made anew, per epoch or to skip batches, keeps it) for the minibatch in
  progress, until the minibatch's first collective after a batch (or its
  optimizer step).  The notes go into this rank's host stash
  (``stash.FETCH``), and a JIT save copies them into the checkpoint like the
  RNG state;
- on resume, this rank's own notes for the redone minibatch are read back
  (never a replica's); from the resume to the redone minibatch's first
  collective after its first module forward (or its optimizer step), the
  batches taken are compared with them: before this rank contributes
  anything that comes from the data.  (A barrier or broadcast between
  skipping and the real batch does not end the comparison.)
- for every loader key that yielded a batch in both runs, the redone
  minibatch must have taken again at least one of the batches the failed run
  took for it.  A script that skips to its position by iterating takes the
  skipped batches and then the right one, and one that uses sampler
  arithmetic takes the right one; a loader that yielded nothing since the
  resume (an evaluation loader the redone minibatch does not run) is not
  compared.  A script that restarts the epoch, or whose restarted workers
  augment with other random numbers, takes none of them: the resume is not
  the fault-free run's (``resume.inexact_resume``: the job stops with the
  reason, unless the user allowed inexact resumes).

Not checked: a minibatch that took no batch, notes lost with the rank's host,
iterators that are not torch's.  A batch that cannot be read (a nested
tensor, a device tensor) counts by its types and shapes only.  The notes are
a fixed binary format that decodes to numbers only (a checkpoint is
untrusted input).  Cost: a digest and a stash write per batch, 45-73 us for a
batch of two tensors on the 2-core test machine (``benchmarks/batch_digest.py``);
more for batches with many Python items.
"""

from __future__ import annotations

import struct
import threading
import sys
from typing import TYPE_CHECKING, Any, Callable

import xxhash

from jitckpt.store import CheckpointError
from jitckpt.worker import stash

if TYPE_CHECKING:
    from jitckpt.worker.runtime import JitRuntime

MAGIC = b"JITBATCH1\0"
_ENTRY = struct.Struct("<I8s")  # loader key (NO_KEY: none), digest of the batch
NO_KEY = 0xFFFFFFFF
MAX_ENTRIES = 256  # per minibatch; later batches of the same minibatch are not noted (the check uses those it has)


class DataPositionError(ValueError):
    """Stored notes of taken batches not in jitckpt's format (corrupt, truncated or foreign)."""


def loader_key(loader: Any) -> int:
    """A loader's key: its dataset's class and length (NO_KEY if it has no dataset)."""
    dataset = getattr(loader, "dataset", None)
    if dataset is None:
        return NO_KEY
    try:
        length = len(dataset)
    except Exception:  # (an iterable dataset, or one whose length fails)
        length = -1
    kind = type(dataset)
    return xxhash.xxh32(f"{kind.__module__}.{kind.__qualname__}:{length}".encode()).intdigest() % NO_KEY


def key_of(iterator: Any) -> int:
    """The key of the loader an iterator belongs to (set when the iterator was made)."""
    key = getattr(iterator, "_jitckpt_loader_key", None)
    return NO_KEY if key is None else int(key)


_ENDS = 4 << 10  # bytes read from each end of a tensor or array
_MAX_ITEMS = 4096  # items of a list, tuple or dict that go into a digest


def digest(batch: Any) -> bytes:
    """8 bytes that tell one batch from another (what it holds, and the ends of its tensors' bytes)."""
    h = xxhash.xxh3_64()
    try:
        _feed(h, batch, 0)
    except Exception as exc:  # (never a failure of the script's own loop: the batch counts by what was read)
        h.update(f"(unreadable: {type(exc).__name__})".encode())
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
        items = x.items()
        if all(type(key) is str for key in x):  # (a dict built from a set has another order in each process)
            items = sorted(items)
        for n, (key, value) in enumerate(items):
            if n == _MAX_ITEMS:
                break
            _feed(h, key, depth + 1)
            _feed(h, value, depth + 1)
        h.update(b")")
    elif _is_tensor(x):
        if x.is_nested:
            h.update(f"nested tensor:{x.dtype}:{x.dim()};".encode())
            return
        h.update(f"tensor:{x.dtype}:{x.shape}:{x.is_cpu};".encode())
        if x.is_cpu and x.layout == _strided():
            if x.requires_grad:
                x = x.detach()
            if x.is_contiguous():
                _tensor_ends(h, x)
            elif x.dim() > 0 and x.shape[0] > 0:  # (no copy of the whole batch: its first and last sample)
                _tensor_ends(h, x[:1].contiguous())
                _tensor_ends(h, x[-1:].contiguous())
    elif type(x).__module__ == "numpy" and hasattr(x, "dtype") and hasattr(x, "shape"):
        h.update(f"ndarray:{x.dtype}:{tuple(x.shape)};".encode())
        if not x.dtype.hasobject:
            import numpy

            try:
                _ends(h, memoryview(numpy.ascontiguousarray(x).reshape(-1).view(numpy.uint8)))
            except (TypeError, ValueError):
                pass
    else:
        h.update(f"<{kind.__module__}.{kind.__qualname__}>".encode())


def _tensor_ends(h: Any, x: Any) -> None:
    try:
        try:
            data = memoryview(x.numpy()).cast("B")
        except TypeError:  # (a dtype NumPy lacks: bfloat16, float8)
            data = memoryview(x.reshape(-1).view(_uint8()).numpy())
        _ends(h, data)
    except (RuntimeError, TypeError, ValueError):
        pass  # (bytes that cannot be read: its dtype and shape only)


def _is_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _strided() -> Any:
    return sys.modules["torch"].strided


def _uint8() -> Any:
    return sys.modules["torch"].uint8


def encode(entries: list[tuple[int, bytes]]) -> bytes:
    return MAGIC + b"".join(_ENTRY.pack(key, d) for key, d in entries)


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
        self._lock = threading.Lock()  # (collectives may be issued from autograd's threads)
        self._step: int | None = None          # the minibatch whose notes _entries are
        self._entries: list[tuple[int, bytes]] = []
        self._closed_for: int | None = None    # the minibatch whose notes are complete
        # After a resume: the failed run's notes for the redone minibatch (key -> digests), the keys that yielded
        # since the resume and those that yielded one of the expected batches again, and whether a module's
        # forward has run since (a one-shot global hook).
        self.expected: dict[int, set[bytes]] | None = None
        self._yielded: set[int] = set()
        self._again: set[int] = set()
        self._forward_seen = False
        self._forward_hook: Any = None
        self._refuse: Callable[[str], None] = lambda reason: None

    def arm(self, entries: list[tuple[int, bytes]], refuse: Callable[[str], None]) -> None:
        """Check the redone minibatch against ``entries``; a mismatch calls ``refuse`` with the reason."""
        from torch.nn.modules.module import register_module_forward_pre_hook

        expected: dict[int, set[bytes]] = {}
        for key, d in entries:
            expected.setdefault(key, set()).add(d)
        with self._lock:
            self.expected, self._refuse = expected, refuse
            self._yielded, self._again, self._closed_for, self._forward_seen = set(), set(), None, False
        if self._forward_hook is None:
            self._forward_hook = register_module_forward_pre_hook(lambda module, args: self._forward_starts())

    def _forward_starts(self) -> None:
        self._forward_seen = True
        if self._forward_hook is not None:
            self._forward_hook.remove()
            self._forward_hook = None

    def yielded(self, iterator: Any, batch: Any) -> None:
        """A DataLoader iterator yielded ``batch``."""
        step = self.rt.step
        if self._closed_for == step:
            return
        key = key_of(iterator)
        with self._lock:
            if self.expected is not None:
                self._yielded.add(key)
                if key in self.expected and key not in self._again and digest(batch) in self.expected[key]:
                    self._again.add(key)
                return
            if self._step != step:
                self._step, self._entries = step, []
            if len(self._entries) >= MAX_ENTRIES:
                return
            self._entries.append((key, digest(batch)))
            payload = encode(self._entries)
        self.rt.stash_rank_state(stash.FETCH, step, payload)

    def minibatch_committed(self, collective: bool) -> None:
        """A collective (``collective``) or the optimizer step is about to be issued.

        In the failed run, the minibatch's notes end at its first collective
        after a batch (a logging all-reduce or a barrier before the batch
        leaves them open).  In the redone minibatch, the comparison ends at
        its first collective after a module's forward began (not at a
        barrier between skipping and the real batch, nor at DDP's broadcast
        as it wraps the model); at the optimizer step in any case.
        """
        step = self.rt.step
        if self._closed_for == step:
            return
        with self._lock:
            if self._closed_for == step:
                return
            redone = self.expected is not None and step == self.rt.resumed_from
            if collective and (not self._forward_seen if redone else self._step != step or not self._entries):
                return
            self._closed_for = step
            if not redone:
                return
            expected, self.expected = self.expected, None
            failed = sorted(key for key in expected if key in self._yielded and key not in self._again)
        if failed:
            self._refuse(
                f"rank {self.rt.rank}'s data loader took none of the {len(expected[failed[0]])} batch(es) that "
                f"minibatch {self.rt.resumed_from} took from it in the run that failed (it yielded other batches "
                f"since the resume): the redone minibatch would train on other data (another position in the "
                f"data, or samples augmented with other random numbers). With a plain DataLoader the script "
                f"skips to its saved position itself, and augments as a function of the sample "
                f"(docs/user-guide.md, \"Data loading\"); or use torchdata's StatefulDataLoader")


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
