"""Reading one ELF file with pyelftools: what the doctor needs to know about it.

``read_elf`` returns an ``ElfObject``: the dynamic section (``DT_NEEDED``,
``DT_SONAME``, ``DT_RPATH``/``DT_RUNPATH``, ``DF_1_NODEFLIB``), the CUDA and
NCCL symbols it imports (with their GNU symbol versions) and exports, the
CUDA/NCCL names its static symbol table defines, and the marks of device
code and of a static copy of the runtime.  Nothing is loaded or run.
"""

from __future__ import annotations

import array
import mmap
import os
import re
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional

from elftools.elf.dynamic import DynamicSection, DynamicSegment
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection

from jitckpt.doctor.errors import DoctorError
from jitckpt.doctor.symbols import NCCL, RUNTIME, categorize

# Cheap first test on the raw name bytes before any decoding.
_RELEVANT_PREFIXES: tuple[bytes, ...] = (b"cu", b"__cuda", b"nccl", b"pnccl", b"nvrtc", b"nvJitLink", b"PyInit_")
# Sections nvcc puts into every object that carries device code.
_FATBIN_SECTIONS = frozenset({".nv_fatbin", ".nvFatBinSegment", "__nv_relfatbin"})
# A symbol-name prefix of every internal function of libcudart_static.a.
_STATIC_RUNTIME_MARK = b"libcudart_static_"


@dataclass
class Import:
    """An undefined CUDA/NCCL symbol of one object, with the version it asks for."""

    name: str
    version: Optional[str]
    version_file: Optional[str]  # the library the version belongs to (verneed), if versioned
    weak: bool
    category: str

    @property
    def display(self) -> str:
        """``name@version``, as ``nm -D`` prints it."""
        return f"{self.name}@{self.version}" if self.version else self.name


@dataclass
class ElfObject:
    """What doctor needs to know about one ELF file (only CUDA/NCCL symbols are kept)."""

    path: str
    elf_class: int
    little_endian: bool
    machine: str
    elf_type: str
    interpreter: Optional[str]
    has_dynamic: bool
    soname: Optional[str]
    needed: list[str]
    rpath: list[str]
    runpath: list[str]
    nodeflib: bool
    imports: list[Import]
    #: defined and exported CUDA/NCCL names -> [(version, hidden), ...]
    exports: dict[str, list[tuple[Optional[str], bool]]]
    #: version nodes this object defines (verdef), without the base entry
    version_definitions: list[str]
    #: CUDA/NCCL names defined in the static symbol table but not exported
    local_definitions: set[str]
    has_static_runtime_mark: bool
    has_fatbin: bool
    has_symtab: bool
    python_extension: bool
    private_imports: list[str]  # jitckpt_simdev_* imports (the emulated NCCL's tie to its runtime)

    @property
    def name(self) -> str:
        """The name the loader knows it by: its soname, else its file name."""
        return self.soname or os.path.basename(self.path)

    def file_name_starts(self, prefixes: Iterable[str]) -> bool:
        """True if the soname or the file name starts with one of ``prefixes``."""
        names = {os.path.basename(self.path), self.soname or ""}
        return any(n.startswith(tuple(prefixes)) for n in names if n)


def elf_identity(path: str) -> Optional[tuple[int, bool, int]]:
    """(class, little_endian, e_machine) of an ELF file, or None if it is not one."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        return None
    little = head[5] == 1
    (machine,) = struct.unpack_from("<H" if little else ">H", head, 18)
    return head[4], little, machine


def read_elf(path: Path | str) -> ElfObject:
    """Read the dynamic section, the CUDA/NCCL symbols and their versions of one ELF file.

    The structure (sections, dynamic tags, version tables) comes from
    pyelftools; the symbol tables themselves are decoded in bulk with
    ``struct``, because libraries such as ``libtorch_cpu.so`` hold tens of
    thousands of symbols.  Raises DoctorError for anything that is not a
    readable ELF file.
    """
    path = str(path)
    if not os.path.exists(path):
        where = "" if "/" in path else " (nor a command on PATH)"
        raise DoctorError(f"{path}: no such file{where}")
    if os.path.isdir(path):
        raise DoctorError(f"{path}: is a directory, not a program or shared library")
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise DoctorError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    with f:
        head = f.read(4)
        if head != b"\x7fELF":
            hint = " (a script? run doctor on the program it starts, or on the libraries it loads)" if head[:2] == b"#!" else ""
            raise DoctorError(f"{path}: not an ELF program or shared library{hint}")
        f.seek(0)
        try:
            return _read_elf(path, ELFFile(f))
        except DoctorError:
            raise
        except Exception as exc:  # pyelftools reports damage in many ways (ELFError, struct.error, ...)
            raise DoctorError(f"{path}: damaged or unsupported ELF file ({exc or type(exc).__name__})") from None


def _read_elf(path: str, elf: ELFFile) -> ElfObject:
    """The body of read_elf, on an opened ELFFile."""
    elf_type = elf.header.e_type
    if elf_type not in ("ET_EXEC", "ET_DYN"):
        kind = {"ET_REL": "an object file (.o)", "ET_CORE": "a core dump"}.get(elf_type, f"of ELF type {elf_type}")
        hint = "; link it first" if elf_type == "ET_REL" else ""
        raise DoctorError(f"{path}: is {kind}, not a program or shared library{hint}")
    little = elf.little_endian
    end = "<" if little else ">"
    interpreter: Optional[str] = None
    for segment in elf.iter_segments():
        if segment.header.p_type == "PT_INTERP":
            interpreter = segment.get_interp_name()

    dynamic: Optional[DynamicSection | DynamicSegment] = None
    for section in elf.iter_sections():
        if isinstance(section, DynamicSection):
            dynamic = section
            break
    if dynamic is None:
        for segment in elf.iter_segments():
            if isinstance(segment, DynamicSegment):
                dynamic = segment
                break
    soname: Optional[str] = None
    needed: list[str] = []
    rpath: list[str] = []
    runpath: list[str] = []
    nodeflib = False
    if dynamic is not None:
        for tag in dynamic.iter_tags():
            kind = tag.entry.d_tag
            if kind == "DT_NEEDED":
                needed.append(tag.needed)
            elif kind == "DT_SONAME":
                soname = tag.soname
            elif kind == "DT_RPATH":
                rpath.extend(p for p in tag.rpath.split(":"))
            elif kind == "DT_RUNPATH":
                runpath.extend(p for p in tag.runpath.split(":"))
            elif kind == "DT_FLAGS_1":
                nodeflib = bool(tag.entry.d_val & 0x800)  # DF_1_NODEFLIB

    # Version tables: index -> (version name, library it belongs to).
    versym: Optional[array.array] = None
    need_versions: dict[int, tuple[str, str]] = {}
    def_versions: dict[int, str] = {}
    version_definitions: list[str] = []
    dynsym = symtab = None
    has_fatbin = False
    for section in elf.iter_sections():
        stype = section.header.sh_type
        if section.name in _FATBIN_SECTIONS:
            has_fatbin = True
        if stype == "SHT_DYNSYM":
            dynsym = section
        elif stype == "SHT_SYMTAB":
            symtab = section
        elif stype == "SHT_GNU_versym":
            versym = array.array("H")
            versym.frombytes(section.data())
            if (sys.byteorder == "little") != little:
                versym.byteswap()
        elif isinstance(section, GNUVerNeedSection):
            for verneed, auxiliaries in section.iter_versions():
                for aux in auxiliaries:
                    need_versions[aux.entry.vna_other & 0x7FFF] = (aux.name, verneed.name)
        elif isinstance(section, GNUVerDefSection):
            for verdef, auxiliaries in section.iter_versions():
                first = next(iter(auxiliaries), None)
                if first is not None:
                    def_versions[verdef.entry.vd_ndx] = first.name
                    if not verdef.entry.vd_flags & 0x1:  # VER_FLG_BASE
                        version_definitions.append(first.name)

    imports: list[Import] = []
    exports: dict[str, list[tuple[Optional[str], bool]]] = {}
    private_imports: list[str] = []
    python_extension = False
    if dynsym is not None:
        strtab = elf.get_section(dynsym.header.sh_link).data()
        for index, name, info, other, shndx in _raw_symbols(dynsym.data(), strtab, elf.elfclass, end,
                                                            _RELEVANT_PREFIXES + (b"jitckpt_simdev_",)):
            bind = info >> 4
            if bind not in (1, 2, 10):  # GLOBAL, WEAK, GNU_UNIQUE
                continue
            ver = versym[index] if versym is not None and index < len(versym) else 1
            hidden = bool(ver & 0x8000)
            ver &= 0x7FFF
            if shndx == 0:  # SHN_UNDEF: an import
                if name.startswith("jitckpt_simdev_"):
                    private_imports.append(name)
                    continue
                category = categorize(name)
                if category is None:
                    continue
                version, version_file = need_versions.get(ver, (None, None)) if ver >= 2 else (None, None)
                imports.append(Import(name, version, version_file, bind == 2, category))
            elif other & 0x3 in (0, 3):  # default or protected visibility: exported
                if name.startswith("PyInit_"):
                    python_extension = True
                    continue
                if categorize(name) is None:
                    continue
                version = def_versions.get(ver) if ver >= 2 else None
                exports.setdefault(name, []).append((version, hidden))

    local_definitions: set[str] = set()
    has_mark = False
    if symtab is not None:
        strtab = elf.get_section(symtab.header.sh_link).data()
        has_mark = _STATIC_RUNTIME_MARK in strtab
        for _index, name, info, _other, shndx in _raw_symbols(symtab.data(), strtab, elf.elfclass, end,
                                                              (b"__cuda", b"cuda", b"nccl")):
            if shndx != 0 and info & 0xF in (0, 1, 2) and categorize(name) in (RUNTIME, NCCL):
                if name not in exports:
                    local_definitions.add(name)

    return ElfObject(
        path=path, elf_class=elf.elfclass, little_endian=little, machine=elf.header.e_machine,
        elf_type=elf_type, interpreter=interpreter, has_dynamic=dynamic is not None, soname=soname,
        needed=needed, rpath=rpath, runpath=runpath, nodeflib=nodeflib, imports=imports, exports=exports,
        version_definitions=version_definitions, local_definitions=local_definitions,
        has_static_runtime_mark=has_mark, has_fatbin=has_fatbin, has_symtab=symtab is not None,
        python_extension=python_extension or bool(re.search(r"\.(cpython-[^.]+|abi3)\.so$", path)),
        private_imports=private_imports,
    )


def _raw_symbols(data: bytes, strtab: bytes, elf_class: int, end: str,
                 prefixes: tuple[bytes, ...]) -> Iterator[tuple[int, str, int, int, int]]:
    """(index, name, st_info, st_other, st_shndx) of the symbols whose names start with ``prefixes``."""
    if elf_class == 64:
        fmt, size, fields = end + "IBBHQQ", 24, (0, 1, 2, 3)
    else:
        fmt, size, fields = end + "IIIBBH", 16, (0, 3, 4, 5)
    count = len(data) // size
    iname, iinfo, iother, ishndx = fields
    for index, entry in enumerate(struct.iter_unpack(fmt, memoryview(data)[: count * size])):
        offset = entry[iname]
        if not offset or not strtab.startswith(prefixes, offset):
            continue
        stop = strtab.find(b"\0", offset)
        name = strtab[offset: stop if stop >= 0 else len(strtab)].decode("utf-8", "replace")
        yield index, name, entry[iinfo], entry[iother], entry[ishndx]


def file_contains(path: str, needle: bytes) -> bool:
    """True if the file's bytes contain ``needle`` (memory-mapped, cheap even for huge files)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(needle) >= 0
    except (OSError, ValueError):
        return False

_MACHINE_NUMBERS = {3: "EM_386", 62: "EM_X86_64", 183: "EM_AARCH64", 21: "EM_PPC64", 40: "EM_ARM", 243: "EM_RISCV"}


def machine_name(number: int) -> Optional[str]:
    """The pyelftools name (``EM_X86_64``, ...) of an ``e_machine`` number, or None if unknown."""
    return _MACHINE_NUMBERS.get(number)
