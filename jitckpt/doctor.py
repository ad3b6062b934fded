"""`jit-run doctor`: can jitckpt interpose on this program, before you run it?

jitckpt's interposition library sits at the CUDA *runtime* API (DESIGN
decision 5): loaded with ``LD_PRELOAD``, it takes the place of the public
``cuda*`` functions of ``libcudart.so.13``, of the hidden entry points nvcc
emits (``__cudaRegisterFatBinary``, ``__cudaLaunchKernel``, ...) and of the
NCCL API.  That works only for calls that really go through the dynamic
linker to those libraries.  This module reads a program or shared library
with pyelftools, follows its ``DT_NEEDED`` entries the way the dynamic loader
would, and lists every CUDA runtime, driver, NCCL, cuBLAS and cuDNN symbol the
whole closure imports, with its symbol version (``cudaMalloc@libcudart.so.13``).
Each import is then checked against the set of functions jitckpt covers, and
the report ends with a verdict for both modes:

* *passthrough* (user-level mode): the in-process wrapper over the real
  libraries.  It needs the runtime to be reached through ``libcudart.so.13``;
  functions it does not wrap simply go straight to the real library.
* *transparent* (``jit-run --transparent``): every call is forwarded to the
  device proxy, so every CUDA runtime and NCCL function the program uses must
  be covered, and no GPU work may bypass the runtime.

Three limits of runtime-level interposition are always stated, because they
are facts of the design rather than gaps to be filled:

(a) driver-API calls (``cu*`` from ``libcuda.so.1``) are not interposed;
(b) libraries that carry their own static copy of the runtime (cuBLAS, cuDNN,
    anything linked with ``cudart_static``) do their GPU work out of sight;
(c) a program statically linked against the runtime (nvcc's default,
    ``-cudart static``) cannot be interposed at all: rebuild it with
    ``-cudart shared``.

The covered set is the CPU device emulator's export list (``emulator/``):
the built libraries' dynamic symbols filtered by the version scripts
``emulator/cudart.map`` and ``emulator/nccl.map`` when they are next to the
package, else the list embedded below.

Exit status: 0 when the analysis ran (whatever the verdict), 2 for bad usage
or an input that is missing, unreadable or not an ELF program or library.
"""

from __future__ import annotations

import argparse
import array
import fnmatch
import json
import mmap
import os
import re
import shutil
import struct
import sys
import textwrap
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence, TextIO

from elftools.elf.dynamic import DynamicSection, DynamicSegment
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection

PROG = "jit-run doctor"

# --------------------------------------------------------------------------
# What jitckpt covers
# --------------------------------------------------------------------------

#: The version node of every CUDA 13 runtime symbol (real library and emulator).
RUNTIME_VERSION_NODE = "libcudart.so.13"
#: The hidden entry points nvcc 13 emits into programs (DESIGN decision 5).
HIDDEN_ENTRY_POINTS: tuple[str, ...] = (
    "__cudaRegisterFatBinary",
    "__cudaRegisterFatBinaryEnd",
    "__cudaRegisterFunction",
    "__cudaRegisterVar",
    "__cudaRegisterManagedVar",
    "__cudaUnregisterFatBinary",
    "__cudaPushCallConfiguration",
    "__cudaPopCallConfiguration",
    "__cudaGetKernel",
    "__cudaLaunchKernel",
    "__cudaLaunchKernel_ptsz",
    "__cudaInitModule",
)

# The emulator's exports when this list was written; used only when neither the
# built emulator nor its version scripts can be read (e.g. an installed wheel).
_EMBEDDED_RUNTIME = """
    __cudaGetKernel __cudaInitModule __cudaLaunchKernel __cudaLaunchKernel_ptsz
    __cudaPopCallConfiguration __cudaPushCallConfiguration __cudaRegisterFatBinary
    __cudaRegisterFatBinaryEnd __cudaRegisterFunction __cudaRegisterManagedVar __cudaRegisterVar
    __cudaUnregisterFatBinary cudaDeviceCanAccessPeer cudaDeviceDisablePeerAccess
    cudaDeviceEnablePeerAccess cudaDeviceGetAttribute cudaDeviceGetByPCIBusId
    cudaDeviceGetCacheConfig cudaDeviceGetLimit cudaDeviceGetPCIBusId
    cudaDeviceGetStreamPriorityRange cudaDeviceReset cudaDeviceSetCacheConfig cudaDeviceSetLimit
    cudaDeviceSynchronize cudaDriverGetVersion cudaEventCreate cudaEventCreateWithFlags
    cudaEventDestroy cudaEventElapsedTime cudaEventQuery cudaEventRecord cudaEventRecordWithFlags
    cudaEventRecordWithFlags_ptsz cudaEventRecord_ptsz cudaEventSynchronize cudaFree cudaFreeAsync
    cudaFreeAsync_ptsz cudaFreeHost cudaFuncGetAttributes cudaFuncGetName cudaFuncGetParamInfo
    cudaFuncSetAttribute cudaFuncSetCacheConfig cudaGetDevice cudaGetDeviceCount cudaGetDeviceFlags
    cudaGetDeviceProperties cudaGetErrorName cudaGetErrorString cudaGetFuncBySymbol cudaGetKernel
    cudaGetLastError cudaGetSymbolAddress cudaGetSymbolSize cudaHostAlloc cudaHostGetDevicePointer
    cudaHostGetFlags cudaHostRegister cudaHostUnregister cudaInitDevice cudaLaunchHostFunc
    cudaLaunchHostFunc_ptsz cudaLaunchKernel cudaLaunchKernelExC cudaLaunchKernelExC_ptsz
    cudaLaunchKernel_ptsz cudaLibraryEnumerateKernels cudaLibraryGetKernel
    cudaLibraryGetKernelCount cudaLibraryLoadData cudaLibraryLoadFromFile cudaLibraryUnload
    cudaMalloc cudaMallocAsync cudaMallocAsync_ptsz cudaMallocHost cudaMallocManaged
    cudaMallocPitch cudaMemGetInfo cudaMemcpy cudaMemcpy2D cudaMemcpy2DAsync cudaMemcpy2DAsync_ptsz
    cudaMemcpy2D_ptds cudaMemcpyAsync cudaMemcpyAsync_ptsz cudaMemcpyFromSymbol
    cudaMemcpyFromSymbolAsync cudaMemcpyFromSymbolAsync_ptsz cudaMemcpyFromSymbol_ptds
    cudaMemcpyPeer cudaMemcpyPeerAsync cudaMemcpyToSymbol cudaMemcpyToSymbolAsync
    cudaMemcpyToSymbolAsync_ptsz cudaMemcpyToSymbol_ptds cudaMemcpy_ptds cudaMemset cudaMemset2D
    cudaMemset2DAsync cudaMemset2DAsync_ptsz cudaMemset2D_ptds cudaMemsetAsync cudaMemsetAsync_ptsz
    cudaMemset_ptds cudaPeekAtLastError cudaPointerGetAttributes cudaProfilerStart cudaProfilerStop
    cudaRuntimeGetVersion cudaSetDevice cudaSetDeviceFlags cudaStreamAddCallback
    cudaStreamAddCallback_ptsz cudaStreamCreate cudaStreamCreateWithFlags
    cudaStreamCreateWithPriority cudaStreamDestroy cudaStreamGetDevice cudaStreamGetDevice_ptsz
    cudaStreamGetFlags cudaStreamGetFlags_ptsz cudaStreamGetId cudaStreamGetId_ptsz
    cudaStreamGetPriority cudaStreamGetPriority_ptsz cudaStreamIsCapturing
    cudaStreamIsCapturing_ptsz cudaStreamQuery cudaStreamQuery_ptsz cudaStreamSynchronize
    cudaStreamSynchronize_ptsz cudaStreamWaitEvent cudaStreamWaitEvent_ptsz
"""
_EMBEDDED_NCCL_API = """
    AllGather AllReduce AlltoAll Bcast Broadcast CommAbort CommCount CommCuDevice CommDestroy
    CommFinalize CommGetAsyncError CommInitAll CommInitRank CommInitRankConfig CommUserRank Gather
    GetErrorString GetLastError GetUniqueId GetVersion GroupEnd GroupStart MemAlloc MemFree Recv
    RedOpCreatePreMulSum RedOpDestroy Reduce ReduceScatter Scatter Send
"""
#: Runtime functions covered when nothing better can be read at run time.
EMBEDDED_RUNTIME_FUNCTIONS: frozenset[str] = frozenset(_EMBEDDED_RUNTIME.split())
#: NCCL functions (and their ``pnccl*`` profiling names) covered likewise.
EMBEDDED_NCCL_FUNCTIONS: frozenset[str] = frozenset(
    prefix + name for name in _EMBEDDED_NCCL_API.split() for prefix in ("nccl", "pnccl")
)

# --------------------------------------------------------------------------
# Symbol categories
# --------------------------------------------------------------------------

RUNTIME = "runtime"
DRIVER = "driver"
NCCL = "nccl"
CUBLAS = "cublas"
CUDNN = "cudnn"
CUDA_LIBRARY = "cuda-library"

CATEGORY_TITLES: dict[str, str] = {
    RUNTIME: "CUDA runtime",
    DRIVER: "CUDA driver API",
    NCCL: "NCCL",
    CUBLAS: "cuBLAS",
    CUDNN: "cuDNN",
    CUDA_LIBRARY: "other CUDA library",
}

_CATEGORY_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    (CUDNN, re.compile(r"cudnn[A-Z]")),
    (CUBLAS, re.compile(r"cublas")),
    (RUNTIME, re.compile(r"(?:__)?cuda[A-Z]")),
    (NCCL, re.compile(r"p?nccl[A-Z]")),
    (CUDA_LIBRARY, re.compile(r"(?:cufft|cusparse|cusolver|curand|cuFile|nvrtc|nvJitLink)[A-Za-z_]")),
    (DRIVER, re.compile(r"cu[A-Z]")),
)
# Cheap first test on the raw name bytes before any decoding.
_RELEVANT_PREFIXES: tuple[bytes, ...] = (b"cu", b"__cuda", b"nccl", b"pnccl", b"nvrtc", b"nvJitLink", b"PyInit_")

# Libraries known to link the runtime statically (name prefixes of their files).
STATIC_RUNTIME_LIBRARIES: tuple[str, ...] = (
    "libcublas", "libcublasLt", "libcudnn", "libcufft", "libcusparse", "libcusolver", "libcurand",
)
# Sections nvcc puts into every object that carries device code.
_FATBIN_SECTIONS = frozenset({".nv_fatbin", ".nvFatBinSegment", "__nv_relfatbin"})
# A symbol-name prefix of every internal function of libcudart_static.a.
_STATIC_RUNTIME_MARK = b"libcudart_static_"
# A string of the runtime's error table: present in any copy of the runtime.
_RUNTIME_ERROR_TABLE_MARK = b"cudaErrorInsufficientDriver"


def categorize(name: str) -> Optional[str]:
    """The category of a symbol name (``RUNTIME``, ``DRIVER``, ...), or None if it is not CUDA/NCCL."""
    for category, pattern in _CATEGORY_PATTERNS:
        if pattern.match(name):
            return category
    return None


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


class DoctorError(Exception):
    """The input cannot be analysed (missing, unreadable, not ELF); one line for the user."""


# --------------------------------------------------------------------------
# Coverage
# --------------------------------------------------------------------------


@dataclass
class VersionNode:
    """One node of a GNU ld version script: its name (None if anonymous) and patterns."""

    name: Optional[str]
    globals: list[str] = field(default_factory=list)
    locals: list[str] = field(default_factory=list)

    def exports(self, symbol: str) -> bool:
        """True if this node makes ``symbol`` global (glob patterns as ld uses them)."""
        return any(fnmatch.fnmatchcase(symbol, p) for p in self.globals)

    def literal_names(self) -> list[str]:
        """The global patterns that are plain names rather than globs."""
        return [p for p in self.globals if not any(c in p for c in "*?[")]


def parse_version_script(text: str) -> list[VersionNode]:
    """Parse the subset of GNU ld version-script syntax the emulator uses.

    Handles named and anonymous nodes, ``global:``/``local:`` sections, C
    comments, quoted names and node dependencies; ``extern "C++"`` blocks are
    skipped.  Raises ValueError on text it cannot follow.
    """
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"(?m)#.*$", " ", text)
    tokens = re.findall(r'"[^"]*"|[{};:]|[^\s{};:"]+', text)
    nodes: list[VersionNode] = []
    i = 0

    def expect(token: str) -> None:
        nonlocal i
        if i >= len(tokens) or tokens[i] != token:
            raise ValueError(f"expected {token!r} near token {i}")
        i += 1

    while i < len(tokens):
        name: Optional[str] = None
        if tokens[i] != "{":
            name = tokens[i]
            i += 1
        expect("{")
        node = VersionNode(name)
        section = node.globals
        while i < len(tokens) and tokens[i] != "}":
            token = tokens[i]
            if token in ("global", "local") and i + 1 < len(tokens) and tokens[i + 1] == ":":
                section = node.globals if token == "global" else node.locals
                i += 2
            elif token == "extern":
                while i < len(tokens) and tokens[i] != "}":  # skip `extern "C++" { ... }`
                    i += 1
                i += 1
                if i < len(tokens) and tokens[i] == ";":
                    i += 1
            elif token == ";":
                i += 1
            else:
                section.append(token.strip('"'))
                i += 1
        expect("}")
        while i < len(tokens) and tokens[i] != ";":  # dependencies on other nodes
            i += 1
        expect(";")
        nodes.append(node)
    return nodes


@dataclass
class Coverage:
    """The CUDA runtime and NCCL functions jitckpt's interposer handles.

    ``runtime`` and ``nccl`` map a function name to the symbol version it is
    exported with (None: unversioned, as NCCL).  ``sources`` says where the
    lists came from, for the report.
    """

    runtime: dict[str, Optional[str]]
    nccl: dict[str, Optional[str]]
    sources: list[str]

    def lookup(self, category: str) -> dict[str, Optional[str]]:
        """The covered names of a category (empty for categories never covered)."""
        if category == RUNTIME:
            return self.runtime
        if category == NCCL:
            return self.nccl
        return {}

    def to_json(self, full: bool = False) -> dict[str, Any]:
        """JSON form: counts and sources, plus the names when ``full``."""
        data: dict[str, Any] = {
            "sources": self.sources,
            "runtime_functions": len(self.runtime),
            "nccl_functions": len(self.nccl),
            "runtime_version": RUNTIME_VERSION_NODE,
        }
        if full:
            data["runtime"] = {n: v for n, v in sorted(self.runtime.items())}
            data["nccl"] = {n: v for n, v in sorted(self.nccl.items())}
        return data


def default_emulator_dir() -> Path:
    """``emulator/`` of the source checkout this package lives in."""
    return Path(__file__).resolve().parent.parent / "emulator"


def load_coverage(emulator_dir: Optional[Path] = None) -> Coverage:
    """Read what the interposer covers from the emulator, else use the embedded list.

    For each of the two libraries: the concrete names come from the built
    library's exported dynamic symbols (``emulator/build/``) when it exists,
    else from the embedded list; the version script (``cudart.map``,
    ``nccl.map``) then decides which names are exported and with which
    version, exactly as it does for the linker.
    """
    emulator_dir = default_emulator_dir() if emulator_dir is None else emulator_dir
    sources: list[str] = []
    runtime = _coverage_of(emulator_dir, "libcudart.so.13", "cudart.map", RUNTIME,
                           EMBEDDED_RUNTIME_FUNCTIONS, RUNTIME_VERSION_NODE, sources)
    nccl = _coverage_of(emulator_dir, "libnccl.so.2", "nccl.map", NCCL, EMBEDDED_NCCL_FUNCTIONS, None, sources)
    return Coverage(runtime, nccl, sources)


def _coverage_of(emulator_dir: Path, library: str, script: str, category: str, embedded: frozenset[str],
                 embedded_version: Optional[str], sources: list[str]) -> dict[str, Optional[str]]:
    """Covered names of one category -> version; appends a description of where they came from to ``sources``."""
    built = emulator_dir / "build" / library
    candidates: dict[str, Optional[str]] = {}
    from_library = False
    if built.is_file():
        try:
            obj = read_elf(built)
            for name, defs in obj.exports.items():
                if categorize(name) == category:
                    candidates[name] = next((v for v, hidden in defs if not hidden), defs[0][0])
            from_library = True
        except DoctorError:
            candidates = {}
    if not from_library:
        candidates = {name: embedded_version for name in embedded}
    nodes: list[VersionNode] = []
    script_path = emulator_dir / script
    if script_path.is_file():
        try:
            nodes = parse_version_script(script_path.read_text())
        except (OSError, ValueError):
            nodes = []
    covered: dict[str, Optional[str]] = {}
    if nodes:
        for name, version in candidates.items():
            node = next((n for n in nodes if n.exports(name)), None)
            if node is not None:
                covered[name] = node.name if not from_library else version
        for node in nodes:  # names a script lists literally are exported as such
            for name in node.literal_names():
                if categorize(name) == category and name not in covered and not from_library:
                    covered[name] = node.name
    else:
        covered = candidates
    what = str(built) if from_library else f"the list embedded in {__name__}"
    sources.append(what + (f", filtered by {script_path}" if nodes else ""))
    return covered


# --------------------------------------------------------------------------
# Reading one ELF file
# --------------------------------------------------------------------------


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


def _elf_identity(path: str) -> Optional[tuple[int, bool, int]]:
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


def _file_contains(path: str, needle: bytes) -> bool:
    """True if the file's bytes contain ``needle`` (memory-mapped, cheap even for huge files)."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            return m.find(needle) >= 0
    except (OSError, ValueError):
        return False


# --------------------------------------------------------------------------
# Finding libraries like the dynamic loader
# --------------------------------------------------------------------------

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
            found = _elf_identity(candidate)
            return found is not None and found[:2] == ident and _machine_name(found[2]) in (target.machine, None)

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
        if requester.nodeflib:
            return None, "not found (DF_1_NODEFLIB: no system directories)"
        for candidate in self.cache.get(needed, []):
            if os.path.isfile(candidate) and compatible(candidate):
                return candidate, "ld.so.cache"
        multiarch = _MULTIARCH.get(target.machine)
        defaults = ([f"/lib/{multiarch}", f"/usr/lib/{multiarch}"] if multiarch else []) + (
            ["/lib64", "/usr/lib64"] if target.elf_class == 64 else []) + ["/lib", "/usr/lib"]
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


_MACHINE_NUMBERS = {3: "EM_386", 62: "EM_X86_64", 183: "EM_AARCH64", 21: "EM_PPC64", 40: "EM_ARM", 243: "EM_RISCV"}


def _machine_name(number: int) -> Optional[str]:
    return _MACHINE_NUMBERS.get(number)


# --------------------------------------------------------------------------
# Analysis
# --------------------------------------------------------------------------

# Roles of an object in the closure.
ROLE_RUNTIME = "cuda-runtime"          # a libcudart.so.* that defines the runtime
ROLE_EMULATED_RUNTIME = "emulated-cuda-runtime"
ROLE_NCCL = "nccl"
ROLE_EMULATED_NCCL = "emulated-nccl"
ROLE_DRIVER = "cuda-driver"
ROLE_INTERPOSER = "jitckpt-interposer"

ROLE_LABELS = {
    ROLE_RUNTIME: "CUDA runtime (NVIDIA's)",
    ROLE_EMULATED_RUNTIME: "CUDA runtime: jitckpt's CPU device emulator",
    ROLE_NCCL: "NCCL (NVIDIA's)",
    ROLE_EMULATED_NCCL: "NCCL: jitckpt's CPU device emulator",
    ROLE_DRIVER: "CUDA driver",
    ROLE_INTERPOSER: "jitckpt's interposition library",
}
ROLE_TITLES = {
    ROLE_RUNTIME: "the CUDA runtime itself",
    ROLE_EMULATED_RUNTIME: "jitckpt's CPU device emulator of the CUDA runtime",
    ROLE_NCCL: "NCCL itself",
    ROLE_EMULATED_NCCL: "jitckpt's CPU device emulator of NCCL",
    ROLE_DRIVER: "the CUDA driver itself",
    ROLE_INTERPOSER: "jitckpt's interposition library",
}


@dataclass
class ImportReport:
    """One imported symbol of one object, with where it binds and whether jitckpt covers it."""

    importer: str
    symbol: Import
    bound_to: Optional[str]
    status: str  # "covered", "not covered", "version mismatch", "not interposed"
    reason: str

    def to_json(self) -> dict[str, Any]:
        """JSON form of this import."""
        return {
            "importer": self.importer, "symbol": self.symbol.display, "name": self.symbol.name,
            "version": self.symbol.version, "category": self.symbol.category, "weak": self.symbol.weak,
            "bound_to": self.bound_to, "status": self.status, "reason": self.reason,
        }


@dataclass
class ObjectReport:
    """One object of the closure: where it is, how it was found, and what it is."""

    obj: ElfObject
    found_via: str
    needed_by: Optional[str]
    role: Optional[str]
    static_runtime: list[str]   # evidence that it carries its own copy of the runtime
    static_nccl: list[str]      # evidence that it carries its own copy of NCCL

    def to_json(self) -> dict[str, Any]:
        """JSON form of this object."""
        o = self.obj
        return {
            "name": o.name, "path": o.path, "soname": o.soname, "found_via": self.found_via,
            "needed_by": self.needed_by, "needed": o.needed, "role": self.role,
            "static_runtime": self.static_runtime, "static_nccl": self.static_nccl,
            "stripped": not o.has_symtab, "device_code": o.has_fatbin,
            "exports": {c: sum(1 for n in o.exports if categorize(n) == c) for c in (RUNTIME, NCCL, DRIVER)
                        if any(categorize(n) == c for n in o.exports)},
            "imports": len(o.imports),
        }


@dataclass
class Reason:
    """Why a mode does or does not work: a short phrase for the verdict line, and the details."""

    short: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.short}: {self.detail}" if self.detail else self.short

    def to_json(self) -> dict[str, str]:
        """JSON form of this reason."""
        return {"reason": self.short, "detail": self.detail}


@dataclass
class ModeVerdict:
    """The verdict for one mode: ``ok``, ``not supported`` or ``not applicable``.

    ``reasons`` explain a ``not supported`` (or ``not applicable``); ``caveats``
    are things worth knowing that do not stop the mode from working.
    """

    status: str
    reasons: list[Reason]
    caveats: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """Status as printed on the verdict line."""
        return {"ok": "OK", "not supported": "NOT SUPPORTED", "not applicable": "not applicable"}[self.status]

    def to_json(self) -> dict[str, Any]:
        """JSON form of this verdict."""
        return {"status": self.status, "reasons": [r.to_json() for r in self.reasons], "caveats": self.caveats}


@dataclass
class Limit:
    """One of the three limits of runtime-level interposition, and whether it applies here."""

    key: str
    text: str
    applies: bool
    detail: str


@dataclass
class Report:
    """Everything `jit-run doctor` found about one program or library."""

    target: str
    kind: str
    root: ObjectReport
    objects: list[ObjectReport]
    missing: list[Resolved]
    imports: list[ImportReport]
    coverage: Coverage
    limits: list[Limit]
    notes: list[str]
    provider_summary: Optional[dict[str, Any]]
    passthrough: ModeVerdict
    transparent: ModeVerdict
    ld_library_path: list[str]

    @property
    def verdict_line(self) -> str:
        """The last line of the text report."""
        p, t = self.passthrough, self.transparent
        if p.status == "not applicable" and t.status == "not applicable":
            return f"verdict: not applicable ({p.reasons[0].short})"
        if p.status == t.status == "not supported" and [r.short for r in p.reasons] == [r.short for r in t.reasons]:
            return ("verdict: passthrough mode NOT SUPPORTED, transparent mode NOT SUPPORTED ("
                    + "; ".join(r.short for r in p.reasons) + ")")
        parts = []
        for mode, verdict in (("passthrough", p), ("transparent", t)):
            text = f"{mode} mode {verdict.label}"
            if verdict.status == "not supported":
                text += " (" + "; ".join(r.short for r in verdict.reasons) + ")"
            parts.append(text)
        return "verdict: " + "; ".join(parts)

    def to_json(self, full_coverage: bool = False) -> dict[str, Any]:
        """The whole report as JSON-ready data."""
        return {
            "target": self.target,
            "kind": self.kind,
            "ld_library_path": self.ld_library_path,
            "coverage": self.coverage.to_json(full_coverage),
            "objects": [o.to_json() for o in self.objects],
            "missing": [{"needed": m.needed, "needed_by": m.needed_by, "searched": m.found_via} for m in self.missing],
            "imports": [i.to_json() for i in self.imports],
            "provides": self.provider_summary,
            "limits": [{"key": l.key, "text": l.text, "applies": l.applies, "detail": l.detail} for l in self.limits],
            "notes": self.notes,
            "verdict": {
                "passthrough": self.passthrough.to_json(),
                "transparent": self.transparent.to_json(),
                "line": self.verdict_line,
            },
        }


def _kind(obj: ElfObject) -> str:
    if not obj.has_dynamic:
        return "statically linked executable"
    if obj.elf_type == "ET_EXEC":
        return "executable"
    if obj.python_extension:
        return "Python extension module"
    if obj.interpreter and not obj.soname:
        return "executable (PIE)"
    return "shared library"


def _role(obj: ElfObject) -> Optional[str]:
    exported = set(obj.exports)
    named_jitckpt = "jitckpt" in obj.name.lower() or "jitckpt" in os.path.basename(obj.path).lower()
    if named_jitckpt and any(categorize(n) in (RUNTIME, NCCL) for n in exported) and not obj.file_name_starts(
            ("libcudart", "libnccl")):
        return ROLE_INTERPOSER
    if obj.file_name_starts(("libcudart.so",)) and any(categorize(n) == RUNTIME for n in exported):
        return ROLE_EMULATED_RUNTIME if any(v.startswith("JITCKPT_SIMDEV") for v in obj.version_definitions) else ROLE_RUNTIME
    if obj.file_name_starts(("libnccl.so",)) and any(categorize(n) == NCCL for n in exported):
        return ROLE_EMULATED_NCCL if obj.private_imports else ROLE_NCCL
    if obj.file_name_starts(("libcuda.so",)) and any(categorize(n) == DRIVER for n in exported):
        return ROLE_DRIVER
    return None


def _static_runtime_evidence(obj: ElfObject, role: Optional[str]) -> list[str]:
    """Why we believe ``obj`` carries its own, statically linked copy of the CUDA runtime."""
    if role in (ROLE_RUNTIME, ROLE_EMULATED_RUNTIME, ROLE_INTERPOSER, ROLE_DRIVER):
        return []
    evidence: list[str] = []
    imports_runtime = any(i.category == RUNTIME for i in obj.imports)
    exported = sorted(n for n in obj.exports if categorize(n) == RUNTIME)
    if exported:
        evidence.append(f"exports {len(exported)} CUDA runtime functions itself (e.g. {exported[0]})")
    hidden_defined = [n for n in HIDDEN_ENTRY_POINTS if n in obj.local_definitions]
    if hidden_defined:
        evidence.append(f"defines {hidden_defined[0]} locally instead of importing it")
    elif obj.has_static_runtime_mark:
        evidence.append("contains libcudart_static internals")
    else:
        # nvcc's own host stubs define local helpers such as __cudaUnregisterBinaryUtil
        # in every object, so only public API names count here.
        public = sorted(n for n in obj.local_definitions if re.match(r"cuda[A-Z]", n))
        if public:
            evidence.append(f"defines the runtime function {public[0]} locally")
    if obj.has_fatbin and not any(i.name == "__cudaRegisterFatBinary" for i in obj.imports):
        evidence.append("has device code (.nv_fatbin) but does not import __cudaRegisterFatBinary")
    if obj.file_name_starts(STATIC_RUNTIME_LIBRARIES):
        evidence.append(f"{obj.name} is an NVIDIA math library, which links the runtime statically")
    if not evidence and not imports_runtime and _file_contains(obj.path, _RUNTIME_ERROR_TABLE_MARK):
        evidence.append("contains the CUDA runtime's error table but imports no runtime function")
    return evidence


def _static_nccl_evidence(obj: ElfObject, role: Optional[str]) -> list[str]:
    if role in (ROLE_NCCL, ROLE_EMULATED_NCCL, ROLE_INTERPOSER):
        return []
    exported = sorted(n for n in obj.exports if categorize(n) == NCCL)
    local = sorted(n for n in obj.local_definitions if categorize(n) == NCCL)
    if exported:
        return [f"exports {len(exported)} NCCL functions itself (e.g. {exported[0]})"]
    if local:
        return [f"defines {local[0]} locally instead of importing it"]
    return []


def _bind(imp: Import, scope: Sequence[ElfObject]) -> Optional[ElfObject]:
    """The first object of the loader's scope whose definition satisfies the import (glibc's rules)."""
    for obj in scope:
        for version, hidden in obj.exports.get(imp.name, ()):
            if imp.version is None:
                if not hidden:
                    return obj
            elif version == imp.version or (version is None and not hidden):
                return obj
    return None


def _judge(imp: Import, coverage: Coverage) -> tuple[str, str]:
    """(status, reason) of one import against jitckpt's coverage."""
    if imp.category == DRIVER:
        return "not interposed", "driver API: jitckpt interposes at the runtime level only"
    if imp.category in (CUBLAS, CUDNN, CUDA_LIBRARY):
        return "not interposed", (f"{CATEGORY_TITLES[imp.category]} API: not interposed; the library does its "
                                  "GPU work through its own static copy of the runtime")
    covered = coverage.lookup(imp.category)
    if imp.name not in covered:
        return "not covered", f"jitckpt does not implement {imp.name}"
    offered = covered[imp.name]
    if imp.version is not None and offered is not None and imp.version != offered:
        return "version mismatch", f"asks for version {imp.version}; jitckpt exports {imp.name}@{offered}"
    return "covered", "in jitckpt's coverage list"


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


def analyse(path: Path | str, coverage: Optional[Coverage] = None, search: Optional[LibrarySearch] = None) -> Report:
    """Analyse a program or shared library and its dependencies; raises DoctorError for bad input."""
    coverage = load_coverage() if coverage is None else coverage
    search = LibrarySearch() if search is None else search
    root = read_elf(path)
    kind = _kind(root)
    is_program = kind.startswith("executable") or kind == "statically linked executable"
    closure, missing = resolve_closure(root, search, is_program)
    scope = [obj for obj, _how, _by in closure]

    objects: list[ObjectReport] = []
    for obj, how, by in closure:
        role = _role(obj)
        objects.append(ObjectReport(obj, how, by, role, _static_runtime_evidence(obj, role), _static_nccl_evidence(obj, role)))
    root_report = objects[0]

    imports: list[ImportReport] = []
    for report in objects:
        for imp in sorted(report.obj.imports, key=lambda i: (i.category, i.name.startswith("__"), i.name)):
            bound = _bind(imp, scope)
            status, reason = _judge(imp, coverage)
            bound_name = bound.name if bound is not None else (imp.version_file or None)
            imports.append(ImportReport(report.obj.name, imp, bound_name, status, reason))

    provider = _provider_summary(root_report, coverage)
    limits, notes = _limits_and_notes(root_report, objects, imports, missing)
    passthrough, transparent = _verdicts(root_report, objects, imports, provider)
    return Report(
        target=str(path), kind=kind, root=root_report, objects=objects, missing=missing, imports=imports,
        coverage=coverage, limits=limits, notes=notes, provider_summary=provider,
        passthrough=passthrough, transparent=transparent, ld_library_path=search.ld_library_path,
    )


def _provider_summary(root: ObjectReport, coverage: Coverage) -> Optional[dict[str, Any]]:
    """For a root that *is* the runtime, NCCL or the driver: what it defines and how much jitckpt covers."""
    role = root.role
    if role is None:
        return None
    category = {ROLE_RUNTIME: RUNTIME, ROLE_EMULATED_RUNTIME: RUNTIME, ROLE_NCCL: NCCL,
                ROLE_EMULATED_NCCL: NCCL, ROLE_DRIVER: DRIVER, ROLE_INTERPOSER: RUNTIME}[role]
    defined = sorted(n for n in root.obj.exports if categorize(n) == category)
    covered_names = coverage.lookup(category)
    covered = [n for n in defined if n in covered_names]
    versions = sorted({v or "(unversioned)" for n in defined for v, _h in root.obj.exports[n]})
    return {
        "role": role,
        "category": category,
        "defines": len(defined),
        "versions": versions,
        "hidden_entry_points": [n for n in HIDDEN_ENTRY_POINTS if n in root.obj.exports],
        "covered": len(covered),
        "not_covered": [n for n in defined if n not in covered_names],
    }


def _limits_and_notes(root: ObjectReport, objects: list[ObjectReport], imports: list[ImportReport],
                      missing: list[Resolved]) -> tuple[list[Limit], list[str]]:
    """The three limits, each with whether and where it applies here, and the other notes."""
    driver_users = sorted({i.importer for i in imports if i.symbol.category == DRIVER})
    static_libs = [o for o in objects[1:] if o.static_runtime and o.role not in (ROLE_NCCL, ROLE_EMULATED_NCCL)]
    library_api = sorted({f"{i.importer} (calls {CATEGORY_TITLES[i.symbol.category]})" for i in imports
                          if i.symbol.category in (CUBLAS, CUDNN, CUDA_LIBRARY)})
    nccl_static = [o.obj.name for o in objects if o.static_runtime and o.role == ROLE_NCCL]
    root_static = bool(root.static_runtime) and root.role is None
    static_detail = ", ".join(sorted({o.obj.name for o in static_libs} | set(library_api))) or "none found"
    if nccl_static:
        static_detail += (f"; {', '.join(nccl_static)} has one too, which is expected and harmless (see the notes: "
                          "the NCCL API itself is interposed)")
    if root.role in (ROLE_RUNTIME, ROLE_EMULATED_RUNTIME):
        static_cudart_detail = f"no: {root.obj.name} is the shared runtime itself"
    elif root_static:
        static_cudart_detail = f"{root.obj.name}: " + "; ".join(root.static_runtime)
    elif any(i.symbol.category == RUNTIME and i.importer == root.obj.name for i in imports):
        static_cudart_detail = "no: it imports the runtime from a shared libcudart"
    else:
        static_cudart_detail = "no static runtime found in it"
    limits = [
        Limit("driver-api",
              "(a) Driver-API calls (cu* from libcuda.so.1) are NOT interposed: jitckpt interposes at the "
              "CUDA runtime level only.",
              bool(driver_users),
              ("imported by " + ", ".join(driver_users)) if driver_users else "no driver-API imports found"),
        Limit("static-runtime-libraries",
              "(b) Libraries that carry their own static copy of the runtime (cuBLAS, cuDNN, anything linked "
              "with cudart_static) are NOT covered: their GPU work never passes through libcudart.so.",
              bool(static_libs or library_api), static_detail),
        Limit("static-cudart",
              "(c) A program statically linked against the runtime (nvcc's default, -cudart static) cannot be "
              "interposed at all: rebuild it with -cudart shared.",
              root_static, static_cudart_detail),
    ]
    notes: list[str] = []
    for o in objects:
        if o.role in (ROLE_NCCL,) and o.static_runtime:
            notes.append(f"{o.obj.name} (NCCL) carries its own static copy of the runtime and reaches the GPU "
                         "through the driver API for its own work. That is expected: jitckpt takes the place of "
                         "the NCCL API itself, so NCCL's internals run untouched (passthrough) or inside the "
                         "device proxy (transparent).")
    for m in missing:
        hint = ""
        if m.needed.startswith("libcuda.so"):
            hint = " (the NVIDIA driver is not installed here; expected on a machine without a GPU)"
        elif m.needed.startswith(("libcudart.so", "libnccl.so")):
            hint = " (for the CPU device emulator, run with LD_LIBRARY_PATH=$(jit-run emulator-path))"
        what = "was not found" if m.found_via.startswith("not found") else m.found_via
        notes.append(f"{m.needed}, needed by {m.needed_by}, {what}{hint}: the program would not start here, and "
                     "that library's own imports could not be checked.")
    if root.obj.python_extension:
        notes.append(f"{root.obj.name} is loaded by a Python interpreter: libraries the interpreter or other "
                     "extensions load (for example torch's) are not part of this analysis; run doctor on them too.")
    notes.append("Libraries a program opens with dlopen() at run time are invisible here; run doctor on them as well.")
    return limits, notes


def _verdicts(root: ObjectReport, objects: list[ObjectReport], imports: list[ImportReport],
              provider: Optional[dict[str, Any]]) -> tuple[ModeVerdict, ModeVerdict]:
    """Passthrough and transparent verdicts, following the three limits and the coverage."""
    name = root.obj.name
    if provider is not None:
        title = ROLE_TITLES[provider["role"]]
        if provider["role"] == ROLE_DRIVER:
            why = Reason(f"{name} is {title}", "jitckpt does not interpose the driver API")
        elif provider["role"] == ROLE_INTERPOSER:
            why = Reason(f"{name} is {title}")
        else:
            why = Reason(f"{name} is {title}",
                         f"it defines {provider['defines']} {CATEGORY_TITLES[provider['category']]} functions "
                         f"and imports none; jitckpt covers {provider['covered']} of them. Run doctor on the "
                         "program or library that uses it")
        return ModeVerdict("not applicable", [why]), ModeVerdict("not applicable", [why])

    passthrough: list[Reason] = []
    transparent: list[Reason] = []
    p_caveats: list[str] = []
    runtime_imports = [i for i in imports if i.symbol.category == RUNTIME]
    if root.static_runtime:
        reason = Reason(f"{name} is statically linked against the CUDA runtime: rebuild with -cudart shared",
                        "; ".join(root.static_runtime) + ". Its CUDA calls never reach libcudart.so, so no "
                        "LD_PRELOAD library can intercept them. Rebuild with nvcc -cudart shared (CMake: "
                        "set CMAKE_CUDA_RUNTIME_LIBRARY to Shared)")
        passthrough.append(reason)
        transparent.append(reason)
    mismatched = [i for i in runtime_imports if i.status == "version mismatch"]
    if mismatched:
        versions = sorted({i.symbol.version or "" for i in mismatched})
        reason = Reason(f"built against another CUDA runtime ({', '.join(versions)})",
                        f"jitckpt exports {RUNTIME_VERSION_NODE} symbols, which those imports never bind to; "
                        "rebuild against CUDA 13")
        passthrough.append(reason)
        transparent.append(reason)
    static_deps = [o for o in objects[1:] if o.static_runtime and o.role not in (ROLE_NCCL, ROLE_EMULATED_NCCL)]
    for o in static_deps:
        transparent.append(Reason(f"{o.obj.name} has its own static CUDA runtime",
                                  "; ".join(o.static_runtime) + ". Its GPU work would bypass the device proxy"))
    if static_deps and not runtime_imports and not root.static_runtime:
        passthrough.append(Reason("no CUDA runtime call goes through libcudart.so",
                                  "the GPU work is done by libraries with their own static runtime ("
                                  + ", ".join(o.obj.name for o in static_deps) + "), which the interposer never sees"))
    elif static_deps:
        p_caveats.append("the CUDA work of " + ", ".join(o.obj.name for o in static_deps) + " is invisible to the "
                         "interposer (its own static runtime); it runs, but is not watched")
    seen_static = {o.obj.name for o in static_deps}
    library_calls: dict[str, set[str]] = {}
    for i in imports:
        if i.symbol.category in (CUBLAS, CUDNN, CUDA_LIBRARY) and (i.bound_to or "") not in seen_static:
            library_calls.setdefault(CATEGORY_TITLES[i.symbol.category], set()).add(i.bound_to or i.symbol.name)
    for title, providers in sorted(library_calls.items()):
        transparent.append(Reason(f"calls the {title} API ({', '.join(sorted(providers))})",
                                  f"not interposed: {title} does its GPU work through its own static copy of the "
                                  "runtime, out of the device proxy's reach"))
    driver = sorted({i.symbol.name for i in imports if i.symbol.category == DRIVER})
    if driver:
        users = sorted({i.importer for i in imports if i.symbol.category == DRIVER})
        transparent.append(Reason(f"imports the CUDA driver API ({_sample(driver, 3)})",
                                  f"in {', '.join(users)}; driver calls are not interposed (runtime-level "
                                  "interposition only), so they would run in the worker instead of the device proxy"))
        p_caveats.append(f"driver-API calls ({_sample(driver, 3)}) run unwatched, straight to libcuda.so.1")
    for o in objects:
        if o.static_nccl:
            transparent.append(Reason(f"{o.obj.name} contains its own copy of NCCL", "; ".join(o.static_nccl)))
            if o is root:
                passthrough.append(Reason(f"{o.obj.name} contains its own copy of NCCL",
                                          "its collectives never reach libnccl.so, so the watchdog cannot see them"))
    for category in (RUNTIME, NCCL):
        uncovered = sorted({i.symbol.name for i in imports if i.symbol.category == category and i.status == "not covered"})
        if uncovered:
            plural = "s" if len(uncovered) != 1 else ""
            transparent.append(Reason(f"{len(uncovered)} {CATEGORY_TITLES[category]} function{plural} not covered "
                                      f"({_sample(uncovered)})",
                                      "transparent mode must forward every call to the device proxy, and jitckpt "
                                      "does not implement these"))
            p_caveats.append(f"{len(uncovered)} {CATEGORY_TITLES[category]} function{plural} "
                             f"({_sample(uncovered, 3)}) {'are' if plural else 'is'} not wrapped and "
                             f"go{'' if plural else 'es'} straight to the real library, which is harmless in "
                             "passthrough mode")

    uses_cuda = bool(imports) or any(o.static_runtime or o.static_nccl or o.obj.has_fatbin for o in objects)
    if not uses_cuda:
        why = Reason(f"{name} uses no CUDA or NCCL function",
                     "it and its libraries import none, so there is nothing to interpose. If it loads CUDA with "
                     "dlopen (as Python does), run doctor on those libraries")
        return ModeVerdict("not applicable", [why]), ModeVerdict("not applicable", [why])
    if not passthrough:
        nccl_imports = [i for i in imports if i.symbol.category == NCCL]
        via = " and ".join(sorted({i.bound_to or i.symbol.version_file or "?" for i in runtime_imports + nccl_imports}))
        count = len(runtime_imports) + len(nccl_imports)
        what = " and ".join(t for t, used in (("the CUDA runtime", runtime_imports), ("NCCL", nccl_imports)) if used)
        passthrough.append(Reason(f"calls to {what or 'CUDA'} go through shared libraries",
                                  f"{count} imported runtime/NCCL function{'s' if count != 1 else ''} bind"
                                  f"{'' if count != 1 else 's'} to {via or '-'}, in front of which the interposer "
                                  "sits"))
        p_status = "ok"
    else:
        p_status = "not supported"
        p_caveats = []
    if not transparent:
        covered = [i for i in imports if i.status == "covered"]
        transparent.append(Reason("every imported CUDA runtime and NCCL function is covered",
                                  f"{len(covered)} imports, all in jitckpt's coverage list; no driver-API "
                                  "imports and no static copies of the runtime"))
        t_status = "ok"
    else:
        t_status = "not supported"
    return ModeVerdict(p_status, passthrough, p_caveats), ModeVerdict(t_status, transparent)


def _sample(names: Sequence[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... {len(names) - limit} more" if len(names) > limit else "")


# --------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------


def _wrap(text: str, indent: str, hanging: Optional[str] = None, width: int = 100) -> str:
    """``text`` filled to ``width``; continuation lines line up after ``indent`` (or use ``hanging``)."""
    hanging = " " * len(indent) if hanging is None else hanging
    return textwrap.fill(text, width=width, initial_indent=indent, subsequent_indent=hanging,
                         break_on_hyphens=False, break_long_words=False)


def render_text(report: Report, verbose: bool = False) -> str:
    """The human-readable report; its last line is the verdict."""
    out: list[str] = []
    root = report.root.obj
    out.append(f"{PROG}: {report.target}")
    out.append(f"  {report.kind}, {root.machine.replace('EM_', '').lower()}, {root.elf_class}-bit"
               + (f", soname {root.soname}" if root.soname else ""))
    if root.needed:
        out.append(_wrap("needs: " + " ".join(root.needed), "  ", "    "))
    if report.root.static_runtime:
        out.append(_wrap("carries a static copy of the CUDA runtime: " + "; ".join(report.root.static_runtime),
                         "  ", "    "))
    if report.root.static_nccl:
        out.append(_wrap("contains its own NCCL: " + "; ".join(report.root.static_nccl), "  ", "    "))
    cov = report.coverage
    out.append(f"  jitckpt covers {len(cov.runtime)} CUDA runtime functions ({RUNTIME_VERSION_NODE}) and "
               f"{len(cov.nccl)} NCCL functions (--transparent-list prints them)")

    out.append("")
    ldp = ":".join(report.ld_library_path) if report.ld_library_path else "unset"
    out.append(f"Libraries, resolved like the dynamic loader (LD_LIBRARY_PATH {ldp}):")
    quiet: list[str] = []
    for o in report.objects[1:]:
        relevant = o.role or o.static_runtime or o.static_nccl or o.obj.imports
        if not relevant and not verbose:
            quiet.append(o.obj.name)
            continue
        what = ROLE_LABELS.get(o.role or "", "")
        if o.static_runtime:
            what = (what + "; " if what else "") + "carries a static copy of the CUDA runtime"
        if o.static_nccl:
            what = (what + "; " if what else "") + "contains its own NCCL"
        out.append(f"  {o.obj.name:<20} {o.obj.path}  [{o.found_via}]")
        if what:
            out.append(f"  {'':<20} {what}")
    if quiet:
        out.append(_wrap("no CUDA/NCCL use: " + ", ".join(quiet), "  ", "    "))
    for m in report.missing:
        out.append(f"  {m.needed:<20} NOT FOUND (needed by {m.needed_by})")
    if len(report.objects) == 1 and not report.missing:
        out.append("  (none)")

    provider = report.provider_summary
    if provider is not None:
        out.append("")
        out.append(f"{root.name} is {ROLE_TITLES[provider['role']]}: it defines rather than imports.")
        out.append(f"  defines {provider['defines']} {CATEGORY_TITLES[provider['category']]} functions, "
                   f"versions: {', '.join(provider['versions']) or '-'}")
        if provider["hidden_entry_points"]:
            out.append(_wrap("hidden entry points: " + " ".join(provider["hidden_entry_points"]), "  ", "    "))
        if provider["category"] in (RUNTIME, NCCL):
            out.append(f"  jitckpt covers {provider['covered']} of them; not covered: {len(provider['not_covered'])}")
            if provider["not_covered"]:
                names = provider["not_covered"] if verbose else provider["not_covered"][:24]
                more = len(provider["not_covered"]) - len(names)
                out.append(_wrap(" ".join(names) + (f" ... and {more} more (-v or --json lists all)" if more else ""),
                                 "    "))

    out.append("")
    out.append(f"CUDA and NCCL imports ({len(report.imports)}):")
    if not report.imports:
        out.append("  (none)")
    importer = None
    width = max((len(i.symbol.display) for i in report.imports), default=0)
    width = min(max(width, 20), 60)
    for i in report.imports:
        if i.importer != importer:
            importer = i.importer
            out.append(f"  {importer}:")
        where = f"-> {i.bound_to}" if i.bound_to else "-> (unresolved)"
        line = f"    {i.symbol.display:<{width}}  {i.symbol.category:<12} {i.status:<16} {where}"
        if i.status not in ("covered",):
            line += f"  ({i.reason})"
        out.append(line)

    out.append("")
    out.append("Limits of runtime-level interposition:")
    for limit in report.limits:
        out.append(_wrap(limit.text, "  ", "      "))
        out.append(_wrap(("APPLIES HERE: " if limit.applies else "here: ") + limit.detail, "      ", "        "))
    if report.notes:
        out.append("")
        out.append("Notes:")
        for note in report.notes:
            out.append(_wrap(note, "  - "))

    out.append("")
    p, t = report.passthrough, report.transparent
    same = p.status == t.status and [str(r) for r in p.reasons] == [str(r) for r in t.reasons]
    for mode, verdict in (("passthrough", p), ("transparent", t)):
        if same and verdict is p:
            out.append(f"passthrough mode: {verdict.label}")
            continue
        out.append(f"{mode} mode: {verdict.label}" + ("  (both modes, because:)" if same else ""))
        for reason in verdict.reasons:
            out.append(_wrap(reason.short, "  - "))
            if reason.detail:
                out.append(_wrap(reason.detail, "    "))
        for caveat in verdict.caveats:
            out.append(_wrap("note: " + caveat, "  - "))
    out.append(report.verdict_line)
    return "\n".join(out) + "\n"


def render_coverage(coverage: Coverage) -> str:
    """The text of ``--transparent-list``: every function the interposer covers."""
    out = ["Functions jitckpt covers (the CPU device emulator implements them; transparent mode forwards them "
           "to the device proxy):"]
    for source in coverage.sources:
        out.append(_wrap("from " + source, "  "))
    for title, table in ((f"CUDA runtime, version {RUNTIME_VERSION_NODE}", coverage.runtime), ("NCCL, unversioned", coverage.nccl)):
        out.append(f"{title} ({len(table)}):")
        out.append(_wrap(" ".join(sorted(table)), "  "))
    out.append("Never covered: the driver API (cu*), cuBLAS, cuDNN and other libraries with their own static "
               "runtime, and programs linked with -cudart static.")
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------


def _locate(argument: str) -> str:
    """A path for the argument: as given if it exists, else looked up on PATH like a command."""
    if os.path.exists(argument) or "/" in argument:
        return argument
    found = shutil.which(argument)
    return found if found else argument


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `jit-run doctor`."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="List the CUDA runtime, driver, NCCL, cuBLAS and cuDNN symbols a program or library and its "
                    "dependencies import, say which ones jitckpt's interposer covers, and whether passthrough "
                    "(user-level) and transparent mode can work for it.",
        epilog="Exit status: 0 when the analysis ran (read the verdict), 2 for bad usage or input.",
    )
    parser.add_argument("target", nargs="?", metavar="PROGRAM_OR_LIBRARY",
                        help="an executable, shared library or Python extension module (a bare name is looked up on PATH)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--transparent-list", action="store_true",
                        help="print every CUDA runtime and NCCL function jitckpt covers (with PROGRAM: as well as the report)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="list every library and every uncovered function, not just the interesting ones")
    return parser


def main(argv: Optional[list[str]] = None, stdout: Optional[TextIO] = None) -> int:
    """Entry point of `jit-run doctor ARGS`; returns the exit status."""
    out = sys.stdout if stdout is None else stdout
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if args.target is None and not args.transparent_list:
        parser.error("a PROGRAM_OR_LIBRARY is required (or --transparent-list)")
    coverage = load_coverage()
    if args.target is None:
        if args.json:
            out.write(json.dumps({"coverage": coverage.to_json(full=True)}, indent=2) + "\n")
        else:
            out.write(render_coverage(coverage))
        return 0
    try:
        report = analyse(_locate(args.target), coverage=coverage)
    except DoctorError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    if args.json:
        out.write(json.dumps(report.to_json(full_coverage=args.transparent_list), indent=2) + "\n")
    else:
        if args.transparent_list:
            out.write(render_coverage(coverage) + "\n")
        out.write(render_text(report, verbose=args.verbose))
    return 0


if __name__ == "__main__":
    sys.exit(main())
