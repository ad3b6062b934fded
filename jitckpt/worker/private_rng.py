"""The script's own random-number generators: captured with the global ones, put back when the redone minibatch starts.

A script often draws from generators of its own rather than the global ones:
``g = torch.Generator().manual_seed(seed + rank)`` for input noise or
masking, ``random.Random(seed)`` or ``numpy.random.default_rng(seed)`` for
augmentation.  Their state is part of "where minibatch i starts" as much as
the global generators', and the script cannot save it correctly itself: its
``save()`` runs when the failure is detected, in the middle of minibatch i,
after that minibatch has drawn from them, while the parameters it saves are
those minibatch i starts with.  A resume that loaded such a state (or none,
starting the generator from its seed again) redid minibatch i with other
random numbers and ended with other parameters, reported as a success.

So jit-run tracks the generators a process creates, from its arming on:

- ``torch.Generator(...)`` made from Python (torch 2.13's generator type has a
  Python metaclass, whose ``__call__`` is wrapped; generators torch makes in
  C++, such as the default ones, are captured by ``rng_state`` itself);
- ``random.Random(...)`` and its subclasses (not ``SystemRandom``: it has no
  state), through ``random.Random.__init__``;
- ``numpy.random.default_rng(...)`` (through the module's attribute; a
  ``Generator`` or ``RandomState`` constructed directly is not seen).

Generators made by the standard library (``tempfile``'s name generator) or
by installed packages (torch's ``RandomSampler`` makes one per epoch from the
global generator, which ``rng_state`` restores) are left out.  Each generator is named by where it was created (file name, line
and function of the first frame outside jitckpt and the generator's own
library) and its rank among the live generators made there, in creation
order; a deterministic script makes the same generators at the same places
when it runs again, so the name finds the same generator in the resumed
process.  Each state also carries a fingerprint of the generator's seed
(torch's ``initial_seed()``, the value given to ``random.Random.seed``,
NumPy's seed sequence), and a state is put back only into a generator with
the same seed: a script that makes a new generator per epoch, seeded from
the epoch, and fails at an epoch's first minibatch has in its capture the
previous epoch's generator, which must not overwrite the new one.  Their states ride in ``rng_state``'s payload as one record (kind
5), captured whenever the global states are and put back with them when the
redone minibatch starts, over whatever state the script loaded.  A captured
generator that the resumed process has not made by then (made lazily,
inside the minibatch) cannot be put back: one warning names it.

Encoding (numbers and names only; a payload is untrusted input)::

    record  := count:u16 entry*
    entry   := kind:u8 name_len:u16 name[name_len] rank:u16 seed:u64 state_len:u32 state[state_len]
    kind 1  torch.Generator: its device type in the name, the state torch's get_state() gives
    kind 2  random.Random: version:i32 words[625]:u32 has_gauss:u8 gauss:f64 (as rng_state's)
    kind 3  numpy.random.Generator: its bit generator's ``state``, safe_codec-encoded
"""

from __future__ import annotations

import hashlib
import os
import random
import struct
import sys
import sysconfig
import threading
import weakref
from typing import Any, Callable, Iterator

TORCH, PYTHON, NUMPY = 1, 2, 3
MAX_TRACKED = 32  # live generators captured per process (a torch one is ~5 KB of the 256 KiB stash slot)
_COUNT = struct.Struct("<H")
_ENTRY_HEAD = struct.Struct("<BH")
_ENTRY_MID = struct.Struct("<HQI")
_PY_TAIL = struct.Struct("<Bd")
_PY_SIZE = 4 + 625 * 4 + _PY_TAIL.size

_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # jitckpt/
_STDLIB = tuple({os.path.abspath(sysconfig.get_paths()[k]) + os.sep for k in ("stdlib", "platstdlib")})


class PrivateRngError(ValueError):
    """A private-generator record that is not in this format."""


class _Tracked:
    """One tracked generator: a weak reference (or, for NumPy's, a strong one dropped once nothing else holds it)."""

    __slots__ = ("kind", "name", "ref", "strong", "last", "encoded", "seed")

    def __init__(self, kind: int, name: str, obj: Any, on_death: Callable[[Any], None]) -> None:
        self.kind, self.name = kind, name
        self.last: Any = None  # the state last encoded (random.Random's and NumPy's: encoding them costs ~20-40 us)
        self.encoded = b""
        self.seed: int | None = None  # its seed's fingerprint, taken once (see seed_of)
        try:
            self.ref, self.strong = weakref.ref(obj, on_death), None
        except TypeError:  # NumPy's Generator takes no weak references
            self.ref, self.strong = None, obj

    def get(self) -> Any:
        if self.ref is not None:
            return self.ref()
        # live while someone besides this entry (and getrefcount's argument) holds it
        if self.strong is not None and sys.getrefcount(self.strong) <= 2:
            self.strong = None
        return self.strong


class _Registry:
    """Every tracked generator of this process, in creation order."""

    def __init__(self) -> None:
        self.entries: list[_Tracked] = []
        self.lock = threading.Lock()
        self.warned: set[str] = set()
        self.absent: list[tuple[str, int]] = []  # (name, rank) the last restore() found no generator for
        self.dead = 0  # entries whose generator died since the last prune (weak references' callbacks)
        self.next_prune = 4 * MAX_TRACKED  # (NumPy's entries have no callback: pruned when the list doubles)
        self.numpy: dict[int, _Tracked] = {}  # id -> entry of the NumPy generators held (default_rng(g) is g)

    def _died(self, _ref: Any) -> None:
        self.dead += 1

    def add(self, kind: int, obj: Any) -> None:
        """Track ``obj``; never raises (a generator the script makes must never fail because of jit-run)."""
        try:
            name = _creation_site()
            if name is None:
                return
            if kind == TORCH:
                name = f"{name} [{obj.device.type}]"
            with self.lock:
                held = self.numpy.get(id(obj)) if kind == NUMPY else None
                if held is not None and held.strong is obj:
                    return
                entry = _Tracked(kind, name, obj, self._died)
                self.entries.append(entry)
                if kind == NUMPY:
                    self.numpy[id(obj)] = entry
                if self.dead > len(self.entries) // 2 or len(self.entries) > self.next_prune:
                    self._prune()
        except Exception as exc:
            _warn_once("track", f"cannot track a generator the script made ({type(exc).__name__}: {exc})")

    def _prune(self) -> None:
        """Drop the entries of dead generators (under the lock): amortised, as many dead ones as live ones."""
        self.entries = [entry for entry in self.entries if entry.get() is not None]
        self.numpy = {id(entry.strong): entry for entry in self.entries if entry.kind == NUMPY}
        self.dead, self.next_prune = 0, max(4 * MAX_TRACKED, 2 * len(self.entries))

    def observe_seeds(self) -> None:
        """Take the seed fingerprint of every live generator that has none yet."""
        for entry, _, obj in self.live_entries():
            seed_of(entry, obj)

    def live_entries(self) -> Iterator[tuple[_Tracked, int, Any]]:
        """(entry, rank among the live ones of its name, generator), in creation order."""
        with self.lock:
            entries = list(self.entries)
        ranks: dict[tuple[int, str], int] = {}
        for entry in entries:
            obj = entry.get()
            if obj is None:
                continue
            key = (entry.kind, entry.name)
            ranks[key] = ranks.get(key, -1) + 1
            yield entry, ranks[key], obj


_registry = _Registry()
_installed = False


def _after_fork_in_child() -> None:
    # (a DataLoader worker forked while another thread held the lock would never get it)
    _registry.lock = threading.Lock()


def _creation_site() -> str | None:
    """``file:line:function`` of the code that made the generator, or None if the standard library did."""
    frame: Any = sys._getframe(1)
    while frame is not None:
        filename = os.path.normpath(frame.f_code.co_filename)  # (not abspath: no getcwd, which fails if it was removed)
        if not filename.startswith(_OWN_DIR) and not _is_generator_library(filename):
            if filename.startswith(_STDLIB) or f"{os.sep}site-packages{os.sep}" in filename \
                    or f"{os.sep}dist-packages{os.sep}" in filename:
                return None  # (the standard library's, an installed package's)
            name = f"{os.path.basename(filename)}:{frame.f_lineno}:{frame.f_code.co_name}"
            # (a name that always encodes, whatever bytes the file name had, and fits the record)
            return name.encode("utf-8", "backslashreplace")[:_MAX_NAME].decode("utf-8", "ignore")
        frame = frame.f_back
    return None


def _is_generator_library(filename: str) -> bool:
    return filename == _RANDOM_FILE or f"{os.sep}numpy{os.sep}random{os.sep}" in filename \
        or filename.endswith(f"{os.sep}torch{os.sep}_opaque_base.py")


_RANDOM_FILE = os.path.abspath(random.__file__)
_MAX_NAME = 1024


# ----- tracking ------------------------------------------------------------------------


def install() -> list[str]:
    """Start tracking the generators made from now on; returns the kinds that cannot be tracked (and why)."""
    global _installed
    if _installed:
        return []
    _installed = True
    os.register_at_fork(after_in_child=_after_fork_in_child)
    missing = []
    if not _track_torch():
        missing.append("torch.Generator (this torch's generator type has no Python metaclass)")
    _track_python_random()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        _track_numpy(numpy)
    else:
        from jitckpt.worker import importhook

        importhook.install({"numpy": _track_numpy})
    return missing


def _track_torch() -> bool:
    import torch

    generator_type = torch._C.Generator
    meta = type(generator_type)
    if meta is type or getattr(meta, "_jitckpt_tracks_generators", False):
        return meta is not type
    original = meta.__dict__.get("__call__")

    def __call__(cls: type, *args: Any, **kwargs: Any) -> Any:
        obj = original(cls, *args, **kwargs) if original is not None else type.__call__(cls, *args, **kwargs)
        if generator_type in cls.__mro__:  # (the metaclass may have other classes: opaque objects)
            _registry.add(TORCH, obj)
        return obj

    meta.__call__ = __call__
    meta._jitckpt_tracks_generators = True
    return True


def _track_python_random() -> None:
    original = random.Random.__init__
    if getattr(original, "_jitckpt_wrapped", False):
        return

    original_seed = random.Random.seed

    def __init__(self: random.Random, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if not isinstance(self, random.SystemRandom):
            _registry.add(PYTHON, self)

    def seed(self: random.Random, a: Any = None, *args: Any, **kwargs: Any) -> None:
        original_seed(self, a, *args, **kwargs)
        try:
            self._jitckpt_seed = fingerprint(a)  # type: ignore[attr-defined]
        except Exception:  # (a subclass with __slots__, a seed whose repr fails)
            pass

    for wrapper, wrapped in ((__init__, original), (seed, original_seed)):
        wrapper._jitckpt_wrapped = True  # type: ignore[attr-defined]
        wrapper.__wrapped__ = wrapped  # type: ignore[attr-defined]
        wrapper.__doc__ = wrapped.__doc__
    random.Random.__init__ = __init__  # type: ignore[method-assign]
    random.Random.seed = seed  # type: ignore[method-assign]


def _track_numpy(numpy: Any) -> None:
    module = numpy.random
    original: Callable[..., Any] = module.default_rng
    if getattr(original, "_jitckpt_wrapped", False):
        return

    def default_rng(*args: Any, **kwargs: Any) -> Any:
        generator = original(*args, **kwargs)
        _registry.add(NUMPY, generator)
        return generator

    default_rng._jitckpt_wrapped = True  # type: ignore[attr-defined]
    default_rng.__wrapped__ = original  # type: ignore[attr-defined]
    default_rng.__doc__ = original.__doc__
    module.default_rng = default_rng


# ----- capture and restore ---------------------------------------------------------------


def tracking() -> bool:
    """Whether any generator of the script's own has been tracked (alive or not yet pruned)."""
    return bool(_registry.entries)


def capture() -> bytes | None:
    """The tracked generators' states as one record's data, or None if there are none; never raises."""
    try:
        return _capture()
    except Exception as exc:  # (called from the training loop and DDP's hook threads)
        _warn_once("capture", f"cannot capture the generators the script made ({type(exc).__name__}: {exc}); "
                              f"a resume will not put them back")
        return None


def _capture() -> bytes | None:
    entries = []
    for entry, rank, obj in _registry.live_entries():
        kind, name = entry.kind, entry.name
        seed = seed_of(entry, obj)
        if len(entries) == MAX_TRACKED:
            _warn_once("too-many", f"more than {MAX_TRACKED} generators of the script's own are alive; "
                                   f"only the first {MAX_TRACKED} are captured")
            break
        try:
            state = _state_of(entry, obj)
        except Exception as exc:  # never break the training loop over one generator
            _warn_once(name, f"cannot capture the state of the generator made at {name} ({type(exc).__name__}: {exc})")
            continue
        encoded_name = name.encode()  # (safe: _creation_site made it encodable and short)
        entries.append(_ENTRY_HEAD.pack(kind, len(encoded_name)) + encoded_name
                       + _ENTRY_MID.pack(rank, seed, len(state)) + state)
    if not entries:
        return None
    return _COUNT.pack(len(entries)) + b"".join(entries)


def fingerprint(seed: Any) -> int:
    """64 bits that tell seeds apart (of their ``repr``: ints, strings, bytes, tuples of them)."""
    return int.from_bytes(hashlib.blake2b(repr(seed).encode(), digest_size=8).digest(), "little")


def seed_of(entry: _Tracked, obj: Any) -> int:
    """The fingerprint of the seed of the generator ``entry`` tracks, taken the first time it is asked for.

    Taken once, because ``torch.Generator.set_state`` also sets the seed that
    ``initial_seed()`` reports: a resumed rank whose script loads a replica's
    generator states (its own checkpoint was lost with it) must still be
    recognised by the seed it made its generator with.  It is asked for at
    every capture and when the worker resumes (``observe_seeds``, before the
    script has loaded anything), so a generator made before that keeps the
    seed it was made with, and one made later the seed it had when first
    captured or restored.
    """
    if entry.seed is None:
        entry.seed = _current_seed(entry.kind, obj)
    return entry.seed


def observe_seeds() -> None:
    """Fix the seed fingerprints of the live generators now (the worker resumes; the script loads next)."""
    _registry.observe_seeds()


def _current_seed(kind: int, obj: Any) -> int:
    try:
        if kind == TORCH:
            return int(obj.initial_seed()) & 0xFFFFFFFFFFFFFFFF
        if kind == PYTHON:
            return int(getattr(obj, "_jitckpt_seed", 0))
        seeds = obj.bit_generator.seed_seq
        return fingerprint((seeds.entropy, tuple(seeds.spawn_key)))
    except Exception:  # (another NumPy's layout)
        return 0


def _state_of(entry: _Tracked, obj: Any) -> bytes:
    if entry.kind == TORCH:
        return obj.get_state().numpy().tobytes()
    current = obj.getstate() if entry.kind == PYTHON else obj.bit_generator.state
    try:
        unchanged = entry.last is not None and bool(current == entry.last)
    except ValueError:  # (a state holding arrays: MT19937's, Philox's)
        unchanged = False
    if unchanged:
        return entry.encoded
    if entry.kind == PYTHON:
        version, words, gauss = current
        encoded = (struct.pack("<i", version) + struct.pack("<625I", *words)
                   + _PY_TAIL.pack(gauss is not None, 0.0 if gauss is None else gauss))
    else:
        from jitckpt.store import safe_codec

        encoded = safe_codec.encode(_plain(current))
    entry.last, entry.encoded = current, encoded
    return encoded


def _plain(value: Any) -> Any:
    """NumPy's state dict with its arrays as ``{"ndarray": (dtype, shape, bytes)}``."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if type(value).__name__ == "ndarray":
        return {"ndarray": (str(value.dtype), list(value.shape), value.tobytes())}
    return value


def _unplain(value: Any) -> Any:
    import numpy

    if isinstance(value, dict):
        if set(value) == {"ndarray"}:
            if not isinstance(value["ndarray"], tuple) or len(value["ndarray"]) != 3:
                raise PrivateRngError("malformed array in a NumPy generator state")
            dtype, shape, data = value["ndarray"]
            if not isinstance(dtype, str) or dtype not in ("uint32", "uint64", "int64") or not isinstance(data, bytes):
                raise PrivateRngError(f"unexpected array in a NumPy generator state ({dtype!r})")
            return numpy.frombuffer(data, dtype=dtype).reshape(shape).copy()
        return {k: _unplain(v) for k, v in value.items()}
    return value


def decode(data: bytes) -> list[tuple[int, str, int, int, bytes]]:
    """The entries of a record: (kind, name, rank, seed, state); raises PrivateRngError on anything else."""
    try:
        (count,) = _COUNT.unpack_from(data, 0)
        offset, entries = _COUNT.size, []
        for _ in range(count):
            kind, name_len = _ENTRY_HEAD.unpack_from(data, offset)
            offset += _ENTRY_HEAD.size
            name = data[offset:offset + name_len].decode()
            offset += name_len
            rank, seed, state_len = _ENTRY_MID.unpack_from(data, offset)
            offset += _ENTRY_MID.size
            state = data[offset:offset + state_len]
            offset += state_len
            if len(name) == 0 or len(state) != state_len or kind not in (TORCH, PYTHON, NUMPY) \
                    or (kind == PYTHON and state_len != _PY_SIZE) \
                    or (kind == TORCH and name.endswith(" [cpu]") and state_len != _cpu_state_size()):
                raise PrivateRngError(f"malformed entry (kind {kind}, {state_len} bytes)")
            if kind == NUMPY:
                _numpy_state(state)  # parsed now, so that a bad one is refused before anything changes
            entries.append((kind, name, rank, seed, state))
    except (struct.error, UnicodeDecodeError) as exc:
        raise PrivateRngError(f"truncated or malformed record ({exc})") from None
    if offset != len(data):
        raise PrivateRngError("trailing bytes after the last entry")
    return entries


def restore(data: bytes) -> None:
    """Put the states of ``data`` (a capture()) back into the live generators of the same names."""
    live = {(entry.kind, entry.name, rank): (entry, obj) for entry, rank, obj in _registry.live_entries()}
    _registry.absent = []
    for kind, name, rank, seed, state in decode(data):
        entry, obj = live.get((kind, name, rank), (None, None))
        if entry is not None and seed_of(entry, obj) != seed:
            continue  # made anew with another seed (a generator per epoch): what the script made is right
        if obj is None:
            _registry.absent.append((name, rank))
            continue
        try:
            _set_state(kind, obj, state)
        except Exception as exc:  # a foreign or damaged state: refuse loudly, as for the global ones
            raise PrivateRngError(f"state of the generator made at {name} rejected: {exc}") from None


def warn_absent() -> None:
    """Warn about the generators the last restore() could not put back (called where the redone minibatch starts:
    a restore at a fetch while the script skips to its position may come before the script made them)."""
    for name, rank in _registry.absent:
        _warn_once(f"absent:{name}:{rank}",
                   f"the failed run's generator made at {name} (the {_ordinal(rank + 1)} made there) does not "
                   f"exist when the redone minibatch starts, so its state cannot be put back: if the script "
                   f"draws from it, the redone minibatch's random numbers differ")
    _registry.absent = []


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')} alive"


def _set_state(kind: int, obj: Any, state: bytes) -> None:
    if kind == TORCH:
        import torch

        obj.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))
    elif kind == PYTHON:
        version = struct.unpack_from("<i", state)[0]
        words = struct.unpack_from("<625I", state, 4)
        has_gauss, gauss = _PY_TAIL.unpack_from(state, 4 + 625 * 4)
        obj.setstate((version, words, gauss if has_gauss else None))
    else:
        obj.bit_generator.state = _numpy_state(state)


def _numpy_state(state: bytes) -> Any:
    """A NumPy bit generator's state from its encoding (data only); PrivateRngError if it is not one."""
    from jitckpt.store import safe_codec

    try:
        value = _unplain(safe_codec.decode(state))
    except PrivateRngError:
        raise
    except (safe_codec.SafeCodecError, RecursionError, ValueError, TypeError) as exc:
        raise PrivateRngError(f"not a NumPy generator state ({type(exc).__name__})") from None
    if not isinstance(value, dict) or not isinstance(value.get("bit_generator"), str):
        raise PrivateRngError("not a NumPy generator state (no bit_generator name)")
    return value


_CPU_STATE_SIZE: list[int] = []


def _cpu_state_size() -> int:
    """The length of a CPU torch.Generator's state in this torch."""
    if not _CPU_STATE_SIZE:
        import torch

        _CPU_STATE_SIZE.append(torch.Generator().get_state().numel())
    return _CPU_STATE_SIZE[0]


def _warn_once(key: str, message: str) -> None:
    if key in _registry.warned:
        return
    _registry.warned.add(key)
    from jitckpt.worker.console import log

    log(f"warning: {message}")
