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
  optimizer step).  The sample indices its sampler gave for the batch are
  noted too, under a key of their own (``index_key``): they tell a position
  in the data apart even where the samples are augmented with the redone
  run's random numbers.  The notes go into this rank's host stash
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

- the inputs of each minibatch's first *training* forward (a module in
  training mode, with or without gradients; one in eval mode is passed over:
  an evaluation, even one that forgot ``no_grad``) are noted the same way, under the module's class: a script that builds its
  batches itself is checked too;
- a minibatch's notes carry the previous minibatch's.  A failure in a
  collective issued after the optimizer step (a logging all-reduce) saves
  the start of minibatch i+1, for which the failed run noted nothing: the
  redone minibatch must then not start from what minibatch i took (its first
  training forward's inputs, or its loader's last batch before the first
  forward, or the sample indices of that batch: its augmentation is drawn
  anew).  A script that resumed from its own step counter, one behind the
  checkpoint, would apply minibatch i twice; it is stopped with the advice to
  save ``jitckpt.current_step()``.  Checked only where minibatch i's data
  differs from i-1's (a loop over one fixed batch cannot be told apart).
  The indices serve this check only: the redone minibatch's batches are
  compared with its own notes by what they hold.

Not checked: a minibatch that took no batch, notes lost with the rank's host,
iterators that are not torch's.  A batch that cannot be read (a nested
tensor, a device tensor) counts by its types and shapes only.  The notes are
a fixed binary format that decodes to numbers only (a checkpoint is
untrusted input).  Cost: a digest and a stash write per batch, 45-73 us for a
batch of two tensors on the 2-core test machine (``benchmarks/batch_digest.py``);
more for batches with many Python items.
"""

from __future__ import annotations

import array
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
MAGIC2 = b"JITBATCH2\0"  # ... then the count of the minibatch's own entries; the previous minibatch's follow them
_ENTRY = struct.Struct("<I8s")  # loader key (NO_KEY: none), digest of the batch
_COUNT = struct.Struct("<H")
NO_KEY = 0xFFFFFFFF
MAX_ENTRIES = 256  # per minibatch; later batches of the same minibatch are not noted (the check uses those it has)


class DataPositionError(ValueError):
    """Stored notes of taken batches not in jitckpt's format (corrupt, truncated or foreign)."""


def trains(module: Any) -> bool:
    """Whether a module's forward may be the redone minibatch's, where its RNG state is put back
    (``JitRuntime.defer_rng_restore``): a module in training mode (under ``no_grad`` too: a GAN's generator
    drawing its noise is the minibatch's), or one in eval mode with gradients on (a model trained in eval mode, a
    frozen teacher).  An evaluation (eval mode, ``no_grad``) is not, wherever the script runs it: before its
    loop, as scripts that evaluate where they start do.  (The inputs noted are a training-mode module's only.)"""
    import torch

    return bool(module.training) or torch.is_grad_enabled()


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


def index_key(key: int) -> int:
    """The key the sample indices of loader ``key``'s batches are noted under (no loader's or module's key)."""
    return xxhash.xxh32(f"indices:{key}".encode()).intdigest() % NO_KEY


def index_digest(index: Any) -> bytes | None:
    """The digest of the sample indices a sampler gave for one batch (None: none, an iterable dataset's).

    Taken when the iterator draws them (a batch sampler may refill its list in place for the next batch); a
    list of ints, the common case, is hashed as packed 64-bit numbers in one go."""
    if index is None or (type(index) is list and index and index[0] is None):
        return None
    if type(index) is list:
        try:
            return xxhash.xxh3_64(array.array("q", index[:_MAX_ITEMS]).tobytes() + len(index).to_bytes(8, "little")).digest()
        except (TypeError, OverflowError):
            pass
    return digest(index)


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


_FORWARD_KEYS: dict[type, int] = {}


def forward_key(module: Any) -> int:
    """The key a module's forward inputs are noted under: its class (a key no loader's dataset has)."""
    kind = type(module)
    key = _FORWARD_KEYS.get(kind)
    if key is None:
        key = _FORWARD_KEYS[kind] = xxhash.xxh32(f"forward:{kind.__module__}.{kind.__qualname__}".encode()).intdigest() % NO_KEY
    return key


def encode(entries: list[tuple[int, bytes]], previous: list[tuple[int, bytes]] | None = None) -> bytes:
    """A minibatch's notes; with ``previous``, the notes of the minibatch before it, complete, follow them."""
    if previous is None:
        return MAGIC + b"".join(_ENTRY.pack(key, d) for key, d in entries)
    return (MAGIC2 + _COUNT.pack(len(entries)) + b"".join(_ENTRY.pack(key, d) for key, d in entries)
            + b"".join(_ENTRY.pack(key, d) for key, d in previous))


def decode(payload: bytes) -> list[tuple[int, bytes]]:
    """The (minibatch's own) entries of ``encode``; DataPositionError for anything else."""
    return decode_notes(payload)[0]


def decode_notes(payload: bytes) -> tuple[list[tuple[int, bytes]], list[tuple[int, bytes]] | None]:
    """(the minibatch's entries, the previous minibatch's or None if not recorded); DataPositionError if not notes."""
    count: int | None = None
    if payload.startswith(MAGIC2) and len(payload) >= len(MAGIC2) + _COUNT.size:
        (count,) = _COUNT.unpack_from(payload, len(MAGIC2))
        body = payload[len(MAGIC2) + _COUNT.size:]
    elif payload.startswith(MAGIC):
        body = payload[len(MAGIC):]
    else:
        raise DataPositionError("not jitckpt's notes of taken batches (wrong header)")
    if len(body) % _ENTRY.size:
        raise DataPositionError("not jitckpt's notes of taken batches (wrong length)")
    n = len(body) // _ENTRY.size
    if n > (MAX_ENTRIES if count is None else 2 * MAX_ENTRIES) or (count is not None and count > min(n, MAX_ENTRIES)):
        raise DataPositionError(f"more than {MAX_ENTRIES} batches noted for one minibatch")
    entries = [_ENTRY.unpack_from(body, at) for at in range(0, len(body), _ENTRY.size)]
    if count is None:
        return entries, None
    return entries[:count], entries[count:]


class TakenBatches:
    """This rank's notes of what each minibatch took, and the check of a redone minibatch (after a resume)."""

    def __init__(self, rt: "JitRuntime") -> None:
        self.rt = rt
        self._lock = threading.Lock()  # (collectives may be issued from autograd's threads)
        self._step: int | None = None          # the minibatch whose notes _entries are
        self._entries: list[tuple[int, bytes]] = []
        self._previous: list[tuple[int, bytes]] = []  # the notes of minibatch _step - 1 ([] if none were taken)
        self._closed_for: int | None = None    # the minibatch whose notes are complete
        self._forward_noted_for: int | None = None  # the minibatch whose first training forward is noted
        self._hook: Any = None  # a global forward pre-hook, while one is wanted
        # After a resume: the failed run's notes for the redone minibatch (key -> digests), the keys that yielded
        # since the resume and those that yielded one of the expected batches again, and whether a module's
        # forward has run since.  ``_suspect``: what the minibatch before the redone one took, per key the redone
        # one took nothing from in the failed run; ``_last_batch``: per loader key, the last batch taken before
        # the first forward; ``_repeated``: forward keys whose inputs were the previous minibatch's.
        self.expected: dict[int, set[bytes]] | None = None
        self._suspect: dict[int, set[bytes]] = {}
        self._yielded: set[int] = set()
        self._again: set[int] = set()
        self._last_batch: dict[int, bytes] = {}
        self._repeated: set[int] = set()
        self._names: dict[int, str] = {}
        self._index_keys: set[int] = set()  # the keys in _suspect that are sample indices' (index_key)
        self._forward_seen = False
        self._refuse: Callable[[str], None] = lambda reason: None

    # ----- the global forward pre-hook -------------------------------------------------

    def _want_hook(self) -> None:
        if self._hook is None:
            from torch.nn.modules.module import register_module_forward_pre_hook

            self._hook = register_module_forward_pre_hook(self._on_forward)

    def _drop_hook(self) -> None:
        if self._hook is not None:
            self._hook.remove()
            self._hook = None

    def minibatch_started(self) -> None:
        """A minibatch begins (or the worker's first): its first training forward's inputs are noted."""
        if self.expected is None:
            self._want_hook()

    def _on_forward(self, module: Any, args: Any) -> None:
        training = module.training  # (under no_grad too: a GAN's generator drawing its noise is the minibatch's)
        gap = getattr(self.rt, "gap", None)
        if training and gap is not None:
            gap.data_reached()  # (a minibatch whose data came from no DataLoader: its first training forward)
        if self.expected is not None:  # the redone minibatch, until its comparison ends
            if not training:
                return  # (an evaluation before the loop, and its metric's all-reduce, do not end the comparison)
            self._forward_seen = True
            key = forward_key(module)
            if key in self.expected or key in self._suspect:
                d = digest(args)
                with self._lock:
                    if self.expected is None:
                        return
                    if key in self.expected:
                        self._yielded.add(key)
                        self._names.setdefault(key, type(module).__qualname__)
                        if d in self.expected[key]:
                            self._again.add(key)
                    if d in self._suspect.get(key, ()):
                        self._repeated.add(key)
                        self._names[key] = type(module).__qualname__
            return
        if not training or not getattr(self.rt, "located", True):
            return  # (an evaluation, or a forward before the checkpoint lookup: a training one is waited for)
        self._drop_hook()
        step = self.rt.step
        if self._closed_for != step and self._forward_noted_for != step:
            self._forward_noted_for = step
            self._note(step, (forward_key(module), digest(args)))

    # ----- the failed run's side ---------------------------------------------------------

    def _note(self, step: int, *entries: tuple[int, bytes]) -> None:
        with self._lock:
            if self._step != step:
                self._previous = self._entries if self._step == step - 1 else []
                self._step, self._entries = step, []
            if len(self._entries) + len(entries) > MAX_ENTRIES:
                return
            self._entries.extend(entries)
            payload = encode(self._entries, self._previous)
        self.rt.stash_rank_state(stash.FETCH, step, payload)

    def yielded(self, iterator: Any, batch: Any, index: bytes | None = None) -> None:
        """A DataLoader iterator yielded ``batch``, made of the samples whose indices' ``index_digest`` is
        ``index`` (None: not known)."""
        step = self.rt.step
        if self._closed_for == step:
            return
        key = key_of(iterator)
        if self.expected is not None:
            with self._lock:
                if self.expected is None:
                    return
                self._yielded.add(key)
                if key in self.expected or key in self._suspect:
                    d = digest(batch)
                    if key in self.expected and key not in self._again and d in self.expected[key]:
                        self._again.add(key)
                    if key in self._suspect and not self._forward_seen:
                        self._last_batch[key] = d
                if index is not None and index_key(key) in self._suspect and not self._forward_seen:
                    self._last_batch[index_key(key)] = index
            return
        self._note(step, (key, digest(batch)), *([(index_key(key), index)] if index is not None else []))

    # ----- after a resume ----------------------------------------------------------------

    def arm(self, entries: list[tuple[int, bytes]], refuse: Callable[[str], None],
            suspect: dict[int, set[bytes]] | None = None) -> None:
        """Check the redone minibatch against ``entries``; a mismatch calls ``refuse`` with the reason.

        ``suspect``: per key, what the minibatch before the redone one took; the redone one must not start from
        it (its first training forward's inputs, its loader's last batch before its first forward).
        """
        indices = {index_key(key) for key, _ in entries}
        expected: dict[int, set[bytes]] = {}
        for key, d in entries:
            if key not in indices:  # (the batches are compared by what they hold)
                expected.setdefault(key, set()).add(d)
        with self._lock:
            self.expected, self._refuse, self._suspect = expected, refuse, dict(suspect or {})
            self._index_keys = {index_key(key) for key in self._suspect}
            self._yielded, self._again, self._closed_for, self._forward_seen = set(), set(), None, False
            self._last_batch, self._repeated = {}, set()
        self._want_hook()

    def minibatch_committed(self, collective: bool) -> None:
        """A collective (``collective``) or the optimizer step is about to be issued.

        In the failed run, the minibatch's notes end at its first collective
        after a batch or a training forward (a logging all-reduce or a barrier
        before them leaves them open).  In the redone minibatch, the comparison ends at
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
            repeated = sorted(self._repeated | {key for key, d in self._last_batch.items()
                                                if d in self._suspect.get(key, ())})
            self._forward_noted_for = step  # (the failed run's notes of this minibatch stay in the stash)
        self._drop_hook()
        failed.sort(key=lambda key: key in self._names)  # (a loader's batches first: what the script can act on)
        if failed and failed[0] in self._names:
            self._refuse(
                f"rank {self.rt.rank}'s redone minibatch {self.rt.resumed_from} gave {self._names[failed[0]]}'s "
                f"forward other inputs than the run that failed did: it would train on other data (drawn with "
                f"other random numbers, or taken from another position). Random inputs drawn before the forward "
                f"are drawn again only if nothing else draws between jit_get_checkpoint_path() and them "
                f"(docs/user-guide.md, \"Data loading\")")
        elif failed:
            self._refuse(
                f"rank {self.rt.rank}'s data loader took none of the {len(expected[failed[0]])} batch(es) that "
                f"minibatch {self.rt.resumed_from} took from it in the run that failed (it yielded other batches "
                f"since the resume): the redone minibatch would train on other data (another position in the "
                f"data, or samples augmented with other random numbers). With a plain DataLoader the script "
                f"skips to its saved position itself, and augments as a function of the sample "
                f"(docs/user-guide.md, \"Data loading\"); or use torchdata's StatefulDataLoader")
        elif repeated:
            what = (f"the inputs of {self._names[repeated[0]]}'s forward" if repeated[0] in self._names
                    else "the sample indices of its data loader's batch" if repeated[0] in self._index_keys
                    else "its data loader's batch")
            resumed = self.rt.resumed_from
            self._refuse(
                f"rank {self.rt.rank} started the redone minibatch {resumed} with the data of minibatch "
                f"{resumed - 1} ({what} were those of minibatch {resumed - 1} in the run that failed): the "
                f"checkpoint holds the state after minibatch {resumed - 1}'s optimizer step (the failure struck at a "
                f"collective issued after it, such as an all-reduce of the loss for logging or of an evaluation "
                f"metric), but the script resumed from its own step counter, one behind, and would apply minibatch "
                f"{resumed - 1} twice. Have save() store jitckpt.current_step() as the minibatch to continue from "
                f"(docs/user-guide.md, \"The step a checkpoint resumes at\")")


def suspects(previous: list[tuple[int, bytes]], before: list[tuple[int, bytes]] | None,
             own: list[tuple[int, bytes]]) -> dict[int, set[bytes]]:
    """Per key the redone minibatch's own notes lack: what the minibatch before it took, if it tells it apart.

    ``previous`` are the notes of the minibatch before the redone one, ``before`` those of the one before that
    (None: unknown).  A key is suspect only where the two took different data: a loop over one fixed batch
    (a benchmark) cannot tell a repeated minibatch from the next one, so it is not checked.
    """
    own_keys = {key for key, _ in own}
    found: dict[int, set[bytes]] = {}
    for key, d in previous:
        if key not in own_keys:
            found.setdefault(key, set()).add(d)
    earlier: dict[int, set[bytes]] = {}
    for key, d in before or ():
        earlier.setdefault(key, set()).add(d)
    return {key: ds for key, ds in found.items() if earlier.get(key) and not ds & earlier[key]}


def arm_check(rt: "JitRuntime", payload: bytes | None, where: str, refuse: Callable[[str], None],
              earlier: bytes | None = None) -> None:
    """After a resume: compare the redone minibatch's batches with ``payload`` (this rank's own notes), if any.

    ``earlier``: this rank's own notes of the minibatch before (from its host stash), if it has them: the
    redone minibatch must not start from its data (a script resuming from a step counter one behind the
    checkpoint).  A mismatch calls ``refuse`` with the reason (``resume.inexact_resume``: it stops the job,
    or returns if the user allowed inexact resumes).
    """
    own: list[tuple[int, bytes]] = []
    previous: list[tuple[int, bytes]] | None = None
    before: list[tuple[int, bytes]] | None = None
    try:
        if payload is not None:
            own, previous = decode_notes(payload)
        if earlier is not None:
            earlier_own, before = decode_notes(earlier)
            if previous is None or not previous:
                previous = earlier_own
    except DataPositionError as exc:
        raise CheckpointError(f"{where}: the notes of taken batches stored for rank {rt.rank} are unusable "
                              f"({exc}); nothing was loaded from them") from None
    suspect = suspects(previous or [], before, own)
    if own or suspect:
        rt.taken_batches.arm(own, refuse, suspect)
