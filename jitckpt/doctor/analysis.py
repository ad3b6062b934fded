"""Analysis: what each library of a program is, what its imports bind to, and the verdict per mode.

``analyse`` reads a program or library (``elf``), resolves its dependencies
like the loader (``search``), gives each object a role (NVIDIA's runtime,
the emulator's, NCCL, the driver, the interposer), looks for static copies
of the runtime and of NCCL, binds every CUDA/NCCL import and judges it
against the coverage list (``coverage``), states the three limits of
runtime-level interposition, and returns a ``Report`` with a verdict for
passthrough and transparent mode.  Rendering the report is ``render``'s job.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

from jitckpt.doctor.coverage import Coverage, load_coverage
from jitckpt.doctor.elf import ElfObject, Import, file_contains, read_elf
from jitckpt.doctor.runtime_abi import RuntimeAbi, runtime_abi
from jitckpt.doctor.search import LibrarySearch, Resolved, resolve_closure
from jitckpt.doctor.symbols import (
    CATEGORY_TITLES, CUBLAS, CUDA_LIBRARY, CUDNN, DRIVER, HIDDEN_ENTRY_POINTS, NCCL, RUNTIME, categorize,
)

# Libraries known to link the runtime statically (name prefixes of their files).
STATIC_RUNTIME_LIBRARIES: tuple[str, ...] = (
    "libcublas", "libcublasLt", "libcudnn", "libcufft", "libcusparse", "libcusolver", "libcurand",
)
# NVIDIA's libraries a CUDA PyTorch links, for the per-library table (issue 19): (file name prefix, name, used on
# PyTorch's common training paths: GEMMs, convolutions, normalisation).  Longer prefixes first.
NVIDIA_LIBRARIES: tuple[tuple[str, str, bool], ...] = (
    ("libcublasLt", "cuBLASLt", True), ("libcublas", "cuBLAS", True), ("libcudnn", "cuDNN", True),
    ("libcufft", "cuFFT", False), ("libcusparseLt", "cuSPARSELt", False), ("libcusparse", "cuSPARSE", False),
    ("libcusolver", "cuSOLVER", False), ("libcurand", "cuRAND", False), ("libcufile", "cuFile", False),
    ("libnvshmem", "NVSHMEM", False),
)
# A string of the runtime's error table: present in any copy of the runtime.
_RUNTIME_ERROR_TABLE_MARK = b"cudaErrorInsufficientDriver"


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
    status: str  # "covered", "not covered", "version mismatch", "not interposed", "coverage unknown"
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
    """The verdict for one mode: ``ok``, ``not supported``, ``not applicable`` or ``unknown``.

    ``reasons`` explain a ``not supported``, ``not applicable`` or ``unknown``
    (transparent mode when the coverage list is not built); ``caveats``
    are things worth knowing that do not stop the mode from working.
    """

    status: str
    reasons: list[Reason]
    caveats: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        """Status as printed on the verdict line."""
        return {"ok": "OK", "not supported": "NOT SUPPORTED", "not applicable": "not applicable",
                "unknown": "UNKNOWN"}[self.status]

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
    #: which libcudart (12 or 13) the code uses; None if it uses no CUDA runtime
    runtime_abi: Optional[RuntimeAbi] = None
    #: NVIDIA's libraries in the closure and what transparent mode does with each (library_table)
    libraries: list[dict[str, Any]] = field(default_factory=list)

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
            if verdict.status in ("not supported", "unknown"):
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
            "runtime_abi": self.runtime_abi.to_json() if self.runtime_abi is not None else None,
            "limits": [{"key": l.key, "text": l.text, "applies": l.applies, "detail": l.detail} for l in self.limits],
            "notes": self.notes,
            "libraries": self.libraries,
            "verdict": {
                "passthrough": self.passthrough.to_json(),
                "transparent": self.transparent.to_json(),
                "line": self.verdict_line,
            },
        }


def _kind(obj: ElfObject) -> str:
    """What the file is, in words: executable, PIE, shared library, Python extension module."""
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
    """The ROLE_* of an object that is the runtime, NCCL, the driver or the interposer; None for anything else."""
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
    if not evidence and not imports_runtime and file_contains(obj.path, _RUNTIME_ERROR_TABLE_MARK):
        evidence.append("contains the CUDA runtime's error table but imports no runtime function")
    return evidence


def _static_nccl_evidence(obj: ElfObject, role: Optional[str]) -> list[str]:
    """Why we believe ``obj`` carries its own copy of NCCL."""
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
    if imp.category in (CUBLAS, CUDNN) and coverage.lookup(imp.category):
        pass  # this build forwards cuBLAS/cuDNN to the device proxy (issue 19): judged as the runtime is, below
    elif imp.category in (CUBLAS, CUDNN, CUDA_LIBRARY):
        return "not interposed", (f"{CATEGORY_TITLES[imp.category]} API: not interposed; the library does its "
                                  "GPU work through its own static copy of the runtime")
    if not coverage.known:
        if imp.category == RUNTIME and imp.version is not None and imp.version != coverage.runtime_version:
            return "version mismatch", (f"asks for version {imp.version}; jitckpt's interposer exports "
                                        f"{coverage.runtime_version} symbols")
        return "coverage unknown", "jitckpt's coverage list is not built"
    covered = coverage.lookup(imp.category)
    if imp.name not in covered:
        refusal = coverage.refusal(imp.name)
        if refusal is not None:
            return "not covered", f"transparent mode refuses {imp.name}: {refusal}"
        return "not covered", f"jitckpt does not implement {imp.name}"
    offered = covered[imp.name]
    if imp.version is not None and offered is not None and imp.version != offered:
        return "version mismatch", f"asks for version {imp.version}; jitckpt exports {imp.name}@{offered}"
    return "covered", "in jitckpt's coverage list"



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
    abi = runtime_abi([o.obj for o in objects], [i.symbol for i in imports])
    passthrough, transparent = _verdicts(root_report, objects, imports, provider, coverage, abi)
    return Report(
        target=str(path), kind=kind, root=root_report, objects=objects, missing=missing, imports=imports,
        coverage=coverage, limits=limits, notes=notes, provider_summary=provider,
        passthrough=passthrough, transparent=transparent, ld_library_path=search.ld_library_path,
        runtime_abi=abi, libraries=library_table(objects, coverage),
    )


def library_table(objects: list[ObjectReport], coverage: Coverage) -> list[dict[str, Any]]:
    """Each of NVIDIA's libraries in the closure, once per file: ``forwarded`` (this build sends its API to the
    device proxy) or ``refused when called`` (its own static runtime would reach the driver: the job stops at
    its first such call, naming it; a library never called is no reason to refuse), and whether PyTorch's
    common training paths use it."""
    forwarded = {"cuBLAS": bool(coverage.lookup(CUBLAS)), "cuBLASLt": "cublasLtMatmul" in coverage.lookup(CUBLAS),
                 "cuDNN": bool(coverage.lookup(CUDNN))}
    rows, seen = [], set()
    for o in objects[1:]:
        for prefix, name, common in NVIDIA_LIBRARIES:
            if o.obj.file_name_starts((prefix,)) and o.obj.name not in seen:
                seen.add(o.obj.name)
                rows.append({"library": name, "file": o.obj.name,
                             "transparent": "forwarded" if forwarded.get(name) else "refused when called",
                             "pytorch_common_path": common})
                break
    return rows


def _provider_summary(root: ObjectReport, coverage: Coverage) -> Optional[dict[str, Any]]:
    """For a root that *is* the runtime, NCCL or the driver: what it defines and how much jitckpt covers.

    ``covered`` and ``not_covered`` are None when the coverage list is not built.
    """
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
        "covered": len(covered) if coverage.known else None,
        "not_covered": [n for n in defined if n not in covered_names] if coverage.known else None,
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
              provider: Optional[dict[str, Any]], coverage: Coverage,
              abi: Optional[RuntimeAbi] = None) -> tuple[ModeVerdict, ModeVerdict]:
    """Passthrough and transparent verdicts, following the three limits and the coverage."""
    name = root.obj.name
    if provider is not None:
        title = ROLE_TITLES[provider["role"]]
        if provider["role"] == ROLE_DRIVER:
            why = Reason(f"{name} is {title}", "jitckpt does not interpose the driver API")
        elif provider["role"] == ROLE_INTERPOSER:
            why = Reason(f"{name} is {title}")
        else:
            covers = (f"jitckpt covers {provider['covered']} of them" if coverage.known
                      else "jitckpt's coverage of them is unknown (its coverage list is not built)")
            why = Reason(f"{name} is {title}",
                         f"it defines {provider['defines']} {CATEGORY_TITLES[provider['category']]} functions "
                         f"and imports none; {covers}. Run doctor on the program or library that uses it")
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
    if abi is not None and not abi.covered:
        reason = Reason(f"uses the {abi.summary} runtime, which jitckpt does not cover",
                        "; ".join(abi.evidence) + f". jitckpt's interposer exports {coverage.runtime_version} "
                        "symbols only, which this code never binds to, so its CUDA calls would run unwatched. "
                        "Rebuild against CUDA 13 (for PyTorch: a CUDA 13 build); until then jit-run leaves the "
                        "interposer out and the Python watchdog stays in charge")
        passthrough.append(reason)
        transparent.append(reason)
    elif mismatched:
        versions = sorted({i.symbol.version or "" for i in mismatched})
        reason = Reason(f"built against another CUDA runtime ({', '.join(versions)})",
                        f"jitckpt exports {coverage.runtime_version} symbols, which those imports never bind to; "
                        "rebuild against CUDA 13")
        passthrough.append(reason)
        transparent.append(reason)
    # Refused when called, not when loaded (issue 19): libjitckpt_remote.so stops the job at the call that
    # would reach the driver (remote/bypass.c: dlopen of libcuda, every driver function) and refuses each
    # runtime/NCCL function it cannot marshal by name; a library that is linked but never called is no reason.
    when_called: list[Reason] = []
    t_notes: list[str] = []  # what transparent mode does with a library, said whatever the verdict
    static_deps = [o for o in objects[1:] if o.static_runtime and o.role not in (ROLE_NCCL, ROLE_EMULATED_NCCL)]
    blas_forwarded = bool(coverage.lookup(CUBLAS))
    lt_forwarded = "cublasLtMatmul" in coverage.lookup(CUBLAS)  # (a build with cublasLt.h too)
    dnn_forwarded = bool(coverage.lookup(CUDNN))
    for o in static_deps:
        if blas_forwarded and o.obj.file_name_starts(("libcublas.so",)):
            continue  # its API is forwarded (below): the worker never calls into it
        if lt_forwarded and o.obj.file_name_starts(("libcublasLt.so",)):
            continue  # likewise cuBLASLt's
        if dnn_forwarded and o.obj.file_name_starts(("libcudnn",)):
            continue  # likewise cuDNN's (and the sub-libraries libcudnn.so.9 would load)
        when_called.append(Reason(f"{o.obj.name} has its own static CUDA runtime",
                                  "; ".join(o.static_runtime) + ". Its GPU work would bypass the device proxy: "
                                  "the job stops at its first call that opens the CUDA driver"))
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
        if (i.symbol.category == CUBLAS and blas_forwarded) or (i.symbol.category == CUDNN and dnn_forwarded):
            continue  # forwarded, or refused by name (below)
        if i.symbol.category in (CUBLAS, CUDNN, CUDA_LIBRARY) and (i.bound_to or "") not in seen_static:
            library_calls.setdefault(CATEGORY_TITLES[i.symbol.category], set()).add(i.bound_to or i.symbol.name)
    for title, providers in sorted(library_calls.items()):
        when_called.append(Reason(f"calls the {title} API ({', '.join(sorted(providers))})",
                                  f"not forwarded: {title} does its GPU work through its own static copy of the "
                                  "runtime, out of the device proxy's reach; the job stops when it opens the driver"))
    driver = sorted({i.symbol.name for i in imports if i.symbol.category == DRIVER})
    if driver:
        users = sorted({i.importer for i in imports if i.symbol.category == DRIVER})
        when_called.append(Reason(f"imports the CUDA driver API ({_sample(driver, 3)})",
                                  f"in {', '.join(users)}; driver calls are not forwarded (runtime-level "
                                  "interposition only): the job stops at the first one, naming it"))
        p_caveats.append(f"driver-API calls ({_sample(driver, 3)}) run unwatched, straight to libcuda.so.1")
    for o in objects:
        if o.static_nccl:
            transparent.append(Reason(f"{o.obj.name} contains its own copy of NCCL", "; ".join(o.static_nccl)))
            if o is root:
                passthrough.append(Reason(f"{o.obj.name} contains its own copy of NCCL",
                                          "its collectives never reach libnccl.so, so the watchdog cannot see them"))
    for category, on in ((CUBLAS, blas_forwarded), (CUDNN, dnn_forwarded)):
        library_imports = sorted({i.symbol.name for i in imports if i.symbol.category == category})
        forwarded = [n for n in library_imports if n in coverage.lookup(category)]
        if on and library_imports:
            title = CATEGORY_TITLES[category]
            t_notes.append(f"{title} is forwarded to the device proxy: {len(forwarded)} of the {len(library_imports)} "
                           f"{title} functions imported ({_sample(forwarded, 3) or 'none'}); the others are refused "
                           "by name when called")
    for category in (RUNTIME, NCCL, CUBLAS, CUDNN):
        uncovered = sorted({i.symbol.name for i in imports if i.symbol.category == category and i.status == "not covered"})
        refused_by_name = [n for n in uncovered if coverage.refusal(n) is not None]
        if refused_by_name:  # exported by the remote library as a refusal: an error return when called
            plural = "s" if len(refused_by_name) != 1 else ""
            when_called.append(Reason(
                f"{len(refused_by_name)} {CATEGORY_TITLES[category]} function{plural} refused when called "
                f"({_sample(refused_by_name)})",
                "each returns an error naming it (" + ", ".join(f"{n}: {coverage.refusal(n)}" for n in refused_by_name)
                + ")"))
        uncovered = [n for n in uncovered if coverage.refusal(n) is None]
        if uncovered and category == CUBLAS:
            # Not in cublas_api.h (cuBLASLt's API): they run in a library with its own static runtime, which
            # the driver fence stops at its first call (remote/bypass.c), naming it.
            plural = "s" if len(uncovered) != 1 else ""
            when_called.append(Reason(f"{len(uncovered)} cuBLAS function{plural} not forwarded ({_sample(uncovered)})",
                                      "their library's own static CUDA runtime would run them in the worker: the "
                                      "job stops when it opens the CUDA driver"))
        elif uncovered:
            plural = "s" if len(uncovered) != 1 else ""
            detail = ("transparent mode must forward every call to the device proxy, and jitckpt does not "
                      "implement these")
            transparent.append(Reason(f"{len(uncovered)} {CATEGORY_TITLES[category]} function{plural} not covered "
                                      f"({_sample(uncovered)})", detail))
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
    unjudged = len([i for i in imports if i.status == "coverage unknown"])
    t_caveats: list[str] = []
    if not transparent and unjudged:
        transparent.append(Reason(str(coverage.missing), f"{unjudged} imported CUDA runtime/NCCL function"
                                  f"{'s' if unjudged != 1 else ''} could not be checked against it"))
        t_status = "unknown"
    elif not transparent:
        covered = [i for i in imports if i.status == "covered"]
        if when_called:
            transparent.append(Reason("every imported CUDA runtime and NCCL function is forwarded or refused by name "
                                      "when called", f"{len(covered)} imports in jitckpt's coverage list"))
            t_caveats.extend(f"refused when called: {r.short}: {r.detail}" for r in when_called)
        else:
            transparent.append(Reason("every imported CUDA runtime and NCCL function is covered",
                                      f"{len(covered)} imports, all in jitckpt's coverage list; no driver-API "
                                      "imports and no static copies of the runtime"))
        t_status = "ok"
        placeholders = sorted({i.symbol.name for i in covered if coverage.remote.get(i.symbol.name) == "placeholder"})
        if placeholders:
            t_caveats.append(f"{', '.join(placeholders)} {'returns' if len(placeholders) == 1 else 'return'} a fixed "
                             "text in transparent mode, '(not available in transparent mode)', instead of the "
                             "library's message (said once on stderr when called); the program goes on")
    else:
        t_status = "not supported"
        if unjudged:
            t_caveats.append(f"{coverage.missing}, so whether jitckpt covers the {unjudged} imported CUDA runtime/NCCL "
                             "functions was not checked either")
    if t_status != "ok":
        t_caveats.extend(f"also refused when called: {r.short}: {r.detail}" for r in when_called)
    t_caveats[:0] = t_notes
    return ModeVerdict(p_status, passthrough, p_caveats), ModeVerdict(t_status, transparent, t_caveats)


def _sample(names: Sequence[str], limit: int = 4) -> str:
    """The first ``limit`` names, and how many more there are."""
    shown = ", ".join(names[:limit])
    return shown + (f", ... {len(names) - limit} more" if len(names) > limit else "")
