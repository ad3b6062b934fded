"""Finding libraries like the dynamic loader, without loading anything.

``LibrarySearch`` follows glibc's ``ld.so(8)`` rules for one ``DT_NEEDED``
name (``DT_RPATH``, ``LD_LIBRARY_PATH``, ``DT_RUNPATH``, ``/etc/ld.so.cache``
read by ``read_ld_so_cache``, the default directories), and
``resolve_closure`` walks a program's dependencies breadth first, reading
each library found with ``jitckpt.doctor.elf``.
"""

from __future__ import annotations

import os
import re
import struct
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from jitckpt.doctor.elf import ElfObject, elf_identity, machine_name, read_elf
from jitckpt.doctor.errors import DoctorError

LD_SO_CACHE = Path("/etc/ld.so.cache")
_MULTIARCH = {"EM_X86_64": "x86_64-linux-gnu", "EM_AARCH64": "aarch64-linux-gnu", "EM_PPC64": "powerpc64le-linux-gnu"}
_CUDA_TARGET = {"EM_X86_64": "x86_64-linux", "EM_AARCH64": "sbsa-linux"}


def read_ld_so_cache(path: Path = LD_SO_CACHE) -> dict[str, list[str]]:
    """Library name -> paths, from the loader's cache file (glibc's ``glibc-ld.so.cache1.1`` format).

    The old ``ld.so-1.7.0`` prefix is skipped.  Returns an empty mapping if the
    file is missing or in a format this function does not know.
    """
    try:
        data = path.read_bytes()
    except OSError:
        return {}
    magic = b"glibc-ld.so.cache1.1"
    start = data.find(magic)
    if start < 0 or len(data) < start + 48:
        return {}
    for end in ("<", ">"):
        nlibs, len_strings = struct.unpack_from(end + "II", data, start + 20)
        if start + 48 + nlibs * 24 <= len(data) and len_strings <= len(data):
            break
    else:
        return {}
    entries: dict[str, list[str]] = {}

    def string_at(offset: int) -> str:
        offset += start
        stop = data.find(b"\0", offset)
        return data[offset:stop].decode("utf-8", "replace")

    for i in range(nlibs):
        _flags, key, value, _os, _hwcap = struct.unpack_from(end + "iIIIQ", data, start + 48 + i * 24)
        entries.setdefault(string_at(key), []).append(string_at(value))
    return entries


@dataclass
class Resolved:
    """Where one DT_NEEDED entry led: the path and the rule that found it, or None."""

    needed: str
    needed_by: str
    path: Optional[str]
    found_via: str


class LibrarySearch:
    """The dynamic loader's search for a DT_NEEDED name, without loading anything.

    Order, as in glibc's ``ld.so(8)``: a name with a slash is a path;
    otherwise DT_RPATH of the requesting object and of the objects that
    loaded it (only when the requester has no DT_RUNPATH), LD_LIBRARY_PATH,
    DT_RUNPATH of the requester, ``/etc/ld.so.cache``, the default
    directories.  Candidates of another ELF class or machine are skipped, as
    the loader does.  As a last resort (not a loader rule, and marked so) the
    CUDA toolkit's library directories are searched.
    """

    def __init__(self, ld_library_path: Optional[str] = None, cache: Optional[dict[str, list[str]]] = None):
        raw = os.environ.get("LD_LIBRARY_PATH", "") if ld_library_path is None else ld_library_path
        self.ld_library_path = [p or "." for p in re.split(r"[:;]", raw)] if raw else []
        self._cache = cache

    @property
    def cache(self) -> dict[str, list[str]]:
        """The parsed ld.so.cache, read on first use."""
        if self._cache is None:
            self._cache = read_ld_so_cache()
        return self._cache

    @staticmethod
    def expand(entry: str, obj: ElfObject, origin: str) -> str:
        """An RPATH/RUNPATH entry with $ORIGIN, $LIB and $PLATFORM substituted."""
        lib = "lib/" + _MULTIARCH[obj.machine] if obj.machine in _MULTIARCH else ("lib64" if obj.elf_class == 64 else "lib")
        platform = {"EM_X86_64": "x86_64", "EM_AARCH64": "aarch64"}.get(obj.machine, "")
        for token, value in (("ORIGIN", origin), ("LIB", lib), ("PLATFORM", platform)):
            entry = entry.replace("${" + token + "}", value).replace("$" + token, value)
        return entry or "."

    def find(self, needed: str, chain: Sequence[tuple[ElfObject, str]], target: ElfObject) -> tuple[Optional[str], str]:
        """(path, how it was found) for ``needed``; ``chain`` is the requester, then its loaders, each with its $ORIGIN."""
        ident = (1 if target.elf_class == 32 else 2, target.little_endian)
        requester, origin = chain[0]

        def compatible(candidate: str) -> bool:
            found = elf_identity(candidate)
            return found is not None and found[:2] == ident and machine_name(found[2]) in (target.machine, None)

        if "/" in needed:
            return (needed, "path given in DT_NEEDED") if os.path.isfile(needed) else (None, "path given in DT_NEEDED")
        searches: list[tuple[str, list[str]]] = []
        if not requester.runpath:
            for obj, obj_origin in chain:
                if obj.rpath and not obj.runpath:
                    searches.append((f"DT_RPATH of {obj.name}", [self.expand(e, obj, obj_origin) for e in obj.rpath]))
        searches.append(("LD_LIBRARY_PATH", self.ld_library_path))
        if requester.runpath:
            searches.append((f"DT_RUNPATH of {requester.name}", [self.expand(e, requester, origin) for e in requester.runpath]))
        for how, directories in searches:
            for directory in directories:
                candidate = os.path.join(directory, needed)
                if os.path.isfile(candidate) and compatible(candidate):
                    return candidate, how
        multiarch = _MULTIARCH.get(target.machine)
        defaults = ([f"/lib/{multiarch}", f"/usr/lib/{multiarch}"] if multiarch else []) + (
            ["/lib64", "/usr/lib64"] if target.elf_class == 64 else []) + ["/lib", "/usr/lib"]
        for candidate in self.cache.get(needed, []):
            # DF_1_NODEFLIB: glibc still uses ld.so.cache, except its entries in the system directories
            if requester.nodeflib and os.path.dirname(candidate) in defaults:
                continue
            if os.path.isfile(candidate) and compatible(candidate):
                return candidate, "ld.so.cache"
        if requester.nodeflib:
            return None, "not found (DF_1_NODEFLIB: ld.so.cache outside the system directories only)"
        for directory in defaults:
            candidate = os.path.join(directory, needed)
            if os.path.isfile(candidate) and compatible(candidate):
                return candidate, "default directory"
        cuda_dirs = ["/usr/local/cuda/lib64"]
        if target.machine in _CUDA_TARGET:
            cuda_dirs.append(f"/usr/local/cuda/targets/{_CUDA_TARGET[target.machine]}/lib")
        for directory in cuda_dirs:
            candidate = os.path.join(directory, needed)
            if os.path.isfile(candidate) and compatible(candidate):
                return candidate, "CUDA toolkit directory (the loader itself searches it only if ld.so.conf lists it)"
        return None, "not found"

def resolve_closure(root: ElfObject, search: LibrarySearch, root_is_program: bool
                    ) -> tuple[list[tuple[ElfObject, str, Optional[str]]], list[Resolved]]:
    """The objects the loader would map for ``root``, breadth first, and the DT_NEEDED entries it could not find."""
    origin_of: dict[int, str] = {}
    root_origin = os.path.dirname(os.path.realpath(root.path) if root_is_program else os.path.abspath(root.path))
    loaded: list[tuple[ElfObject, str, Optional[str]]] = [(root, "the file given", None)]
    origin_of[id(root)] = root_origin
    loader_of: dict[int, Optional[ElfObject]] = {id(root): None}
    by_name: dict[str, Optional[ElfObject]] = {}  # None: searched for and not found
    by_inode: dict[tuple[int, int], ElfObject] = {}
    if root.soname:
        by_name[root.soname] = root
    try:
        st = os.stat(root.path)
        by_inode[(st.st_dev, st.st_ino)] = root
    except OSError:
        pass
    missing: list[Resolved] = []
    queue: deque[ElfObject] = deque([root])
    while queue:
        obj = queue.popleft()
        for needed in obj.needed:
            if needed in by_name:
                continue
            chain: list[tuple[ElfObject, str]] = []
            walker: Optional[ElfObject] = obj
            while walker is not None:
                chain.append((walker, origin_of[id(walker)]))
                walker = loader_of[id(walker)]
            path, how = search.find(needed, chain, root)
            if path is None:
                missing.append(Resolved(needed, obj.name, None, how))
                by_name[needed] = None
                continue
            st = os.stat(path)
            known = by_inode.get((st.st_dev, st.st_ino))
            if known is not None:
                by_name[needed] = known
                continue
            try:
                dep = read_elf(path)
            except DoctorError as exc:
                missing.append(Resolved(needed, obj.name, None, f"unreadable: {exc}"))
                by_name[needed] = None
                continue
            by_inode[(st.st_dev, st.st_ino)] = dep
            by_name[needed] = dep
            if dep.soname:
                by_name.setdefault(dep.soname, dep)
            origin_of[id(dep)] = os.path.dirname(os.path.abspath(path))
            loader_of[id(dep)] = obj
            loaded.append((dep, how, obj.name))
            queue.append(dep)
    return loaded, missing
