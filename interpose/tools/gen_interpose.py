#!/usr/bin/env python3
"""Generate the passthrough parts of libjitckpt_interpose.so from NVIDIA's headers.

Inputs: the real ``cuda_runtime_api.h`` and ``nccl.h`` (prototypes, the
``_ptsz``/``_ptds`` names from the header's ``__CUDART_API_PTDS``/``_PTSZ``
lines, and NCCL's version), the facts table beside this file
(``api_facts.py``: what the headers cannot say) and the control header
``include/jitckpt_interpose.h``.  Nothing built is an input: the CPU device
emulator is not needed to build the interposer or the proxy.

Any ``nccl.h`` from NCCL 2.27 on will do.  A function of the facts table that
a newer NCCL added (its ``since``) is left out of a build against an older
header: passthrough mode forwards it unchanged, and transparent mode refuses
it by name, saying which NCCL added it.

Outputs, in OUT (every file opens with a "do not edit" banner; none is
committed):

  next_syms.h, next_syms.c  the next definition of every function the library
                            wraps, needs, or looks up (``next_<name>``), and the
                            prototypes no header declares
  cuda_entry.c              the CUDA runtime entry points, plain flavour
  cuda_entry_ptsz.c         their ``_ptsz``/``_ptds`` twins
  nccl_entry.c              the NCCL entry points
  interpose.map             the linker version script
  coverage.json             every CUDA runtime and NCCL function the headers
                            and the facts table name, whether passthrough mode
                            wraps it and whether transparent mode covers it
                            (``libjitckpt_remote.so`` handles it: the remote
                            files are generated here too, in memory, and read
                            back), with the remote library's refusals and their
                            reasons (read by ``jit-run doctor``)
  jitckpt_interpose.cdef    the control interface, for cffi's ``ffi.cdef()``

Every entry point fetches the real function and makes one call into a
hand-written hook of ``src/hooks.h``.  The entry points compile against the
real headers, so a prototype read wrongly here is a compile error.

Usage (run by interpose/Makefile):

    gen_interpose.py --cuda-header H --nccl-header H --control-header H \
        [--cudart-soname libcudart.so.13] [--remote] --out DIR
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, replace
from pathlib import Path

sys.dont_write_bytecode = True  # keep the source tree clean
sys.path.insert(0, str(Path(__file__).resolve().parent))
from api_facts import ANSWERED_IN_WORKER, CUBLAS, CUBLASLT_HAND, CUDNN, DNN_HAND, FACTS, HIDDEN_HAND, Fact  # noqa: E402
import gen_remote  # noqa: E402

GENERATOR = "interpose/tools/gen_interpose.py"
CONTROL_NODE = "JITCKPT_INTERPOSE_1"
CUDART, NCCL, CUBLAS_LIB, CUBLASLT_LIB, CUDNN_LIB = "cudart", "nccl", "cublas", "cublasLt", "cudnn"
NOT_FOUND = {CUDART: "cudaErrorSharedObjectSymbolNotFound", NCCL: "ncclSystemError"}


class GenError(Exception):
    """A fact, header or library the generator cannot work with; the message names it."""


# ---- parsing the headers -----------------------------------------------------------


@dataclass(frozen=True)
class Param:
    type: str      # normalised, e.g. "const void *"
    name: str

    def decl(self) -> str:
        return f"{self.type}{self.name}" if self.type.endswith("*") else f"{self.type} {self.name}"


@dataclass(frozen=True)
class Proto:
    ret: str
    name: str
    params: tuple[Param, ...]

    def renamed(self, name: str) -> "Proto":
        return Proto(self.ret, name, self.params)

    def decl(self) -> str:
        params = ", ".join(p.decl() for p in self.params) or "void"
        return f"{self.ret} {self.name}({params})"


def strip_comments(text: str) -> str:
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    return re.sub(r"//[^\n]*", " ", text)


def normalize_type(text: str) -> str:
    text = " ".join(text.split())
    text = re.sub(r"\s*\*\s*", "*", text)
    return re.sub(r"(\w)\*", r"\1 *", text)


def split_top(text: str) -> list[str]:
    """Splits a parameter list at the commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts]


def parse_params(text: str, where: str) -> tuple[Param, ...] | None:
    """The parameters of a prototype; None if one has no name (e.g. a function pointer)."""
    text = re.sub(r"__dv\s*\([^()]*\)", "", text)
    params = []
    for raw in split_top(text):
        raw = raw.split("=")[0].strip()       # C++ default arguments
        if raw in ("", "void"):
            continue
        m = re.fullmatch(r"(.*?[\s*])(\w+)\s*(\[\w*\])?", raw, flags=re.S)
        if not m or "(" in raw or not m.group(1).strip():
            return None
        type_ = normalize_type(m.group(1) + ("*" if m.group(3) else ""))
        params.append(Param(type_, m.group(2)))
    return tuple(params)


def parse_cuda_header(path: Path) -> tuple[dict[str, Proto], dict[str, str]]:
    """(prototypes by name, per-thread twin by plain name) of cuda_runtime_api.h."""
    source = path.read_text(encoding="utf-8", errors="replace")
    text = strip_comments(source)
    protos: dict[str, Proto] = {}
    decl = re.compile(r"\bextern\s+([\w\s*]+?)\bCUDARTAPI\s+(\w+)\s*\(([^;{}]*)\)\s*;", re.S)
    for m in decl.finditer(text):
        ret = " ".join(t for t in m.group(1).split() if not t.startswith("__"))
        params = parse_params(m.group(3), m.group(2))
        if params is not None and m.group(2) not in protos:
            protos[m.group(2)] = Proto(normalize_type(ret), m.group(2), params)
    # "#define __CUDART_API_PTDS(api) api ## _ptds" (the per-thread definition of the macro)
    suffix = dict(re.findall(r"#\s*define\s+__CUDART_API_(PTDS|PTSZ)\s*\(\s*api\s*\)\s*api\s*##\s*(\w+)", text))
    if set(suffix) != {"PTDS", "PTSZ"}:
        raise GenError(f"{path}: no '#define __CUDART_API_PTDS(api) api ## _ptds' lines; header format changed?")
    twins = {}
    for name, kind, arg in re.findall(r"#\s*define\s+(\w+)\s+__CUDART_API_(PTDS|PTSZ)\s*\(\s*(\w+)\s*\)", text):
        if name == arg:
            twins[name] = name + suffix[kind]
    if len(protos) < 200 or len(twins) < 20:
        raise GenError(f"{path}: only {len(protos)} prototypes and {len(twins)} per-thread names parsed; "
                       f"header format changed?")
    return protos, twins


def parse_nccl_header(path: Path) -> dict[str, Proto]:
    text = strip_comments(path.read_text(encoding="utf-8", errors="replace"))
    text = re.sub(r"__attribute__\s*\(\((?:[^()]|\([^()]*\))*\)\)", " ", text)
    protos: dict[str, Proto] = {}
    decl = re.compile(r"^[ \t]*((?:const\s+)?\w+(?:\s*\*)*)\s*\b(p?nccl\w+)\s*\(([^;{}]*)\)\s*;", re.S | re.M)
    for m in decl.finditer(text):
        params = parse_params(m.group(3), m.group(2))
        if params is not None and m.group(2) not in protos:
            protos[m.group(2)] = Proto(normalize_type(m.group(1)), m.group(2), params)
    if len(protos) < 40:
        raise GenError(f"{path}: only {len(protos)} NCCL prototypes parsed; header format changed?")
    return protos


def parse_cublas_header(path: Path, least: int = 100, what: str = "cuBLAS's cublas_api.h") -> dict[str, Proto]:
    """The prototypes of cuBLAS's cublas_api.h or cublasLt.h (``cublasStatus_t CUBLASWINAPI cublasSgemm_v2(...)``)."""
    text = strip_comments(path.read_text(encoding="utf-8", errors="replace"))
    protos: dict[str, Proto] = {}
    decl = re.compile(r"^[ \t]*((?:const\s+)?\w+(?:\s*\*)*)\s*\bCUBLASWINAPI\s+(cublas\w+)\s*\(([^;{}]*)\)\s*;",
                      re.S | re.M)
    for m in decl.finditer(text):
        params = parse_params(m.group(3), m.group(2))
        if params is not None and m.group(2) not in protos:
            protos[m.group(2)] = Proto(normalize_type(m.group(1)), m.group(2), params)
    if len(protos) < least:
        raise GenError(f"{path}: only {len(protos)} cuBLAS prototypes parsed; is it {what}?")
    return protos


def parse_cublaslt_header(path: Path) -> dict[str, Proto]:
    """The prototypes of cuBLASLt's cublasLt.h; every function transparent mode writes by hand must be there."""
    protos = {n: p for n, p in parse_cublas_header(path, 30, "cuBLASLt's cublasLt.h").items()
              if n.startswith("cublasLt")}
    absent = [n for n in CUBLASLT_HAND if n not in protos]
    if absent:
        raise GenError(f"{path} does not declare {', '.join(absent)} (interpose/tools/api_facts.py: CUBLASLT_HAND)")
    return protos


def describe_cublas(path: Path) -> tuple[dict[str, "Function"], dict[str, Proto]]:
    """(the cuBLAS functions transparent mode forwards, every prototype of the header)."""
    protos = parse_cublas_header(path)
    functions = {}
    for name, fact in CUBLAS.items():
        if name not in protos:
            raise GenError(f"{name}: in the cuBLAS facts table (interpose/tools/api_facts.py) but not declared "
                           f"by {path}")
        check_fact(name, protos[name], fact)
        functions[name] = Function(name, CUBLAS_LIB, protos[name], fact, "")
    return functions, protos


# cuDNN's headers, in the order cudnn.h includes them: every prototype is forwarded or refused by name.
CUDNN_HEADERS = ("cudnn_graph.h", "cudnn_ops.h", "cudnn_adv.h", "cudnn_cnn.h")


def parse_cudnn_headers(include: Path) -> dict[str, Proto]:
    """The prototypes of cuDNN 9's headers (``[CUDNN_DEPRECATED] cudnnStatus_t CUDNNWINAPI cudnnCreate(...)``)."""
    protos: dict[str, Proto] = {}
    decl = re.compile(r"^[ \t]*(?:CUDNN_DEPRECATED\s+)?((?:const\s+)?\w+(?:\s*\*)*)\s*\bCUDNNWINAPI\s+(cudnn\w+)\s*"
                      r"\(([^;{}]*)\)\s*;", re.S | re.M)
    for header in CUDNN_HEADERS:
        path = include / header
        if not path.is_file():
            raise GenError(f"{path}: not found (--cudnn-include names the directory with cuDNN 9's headers)")
        for m in decl.finditer(strip_comments(path.read_text(encoding="utf-8", errors="replace"))):
            params = parse_params(m.group(3), m.group(2))
            if params is not None and m.group(2) not in protos:
                protos[m.group(2)] = Proto(normalize_type(m.group(1)), m.group(2), params)
    if len(protos) < 150:
        raise GenError(f"{include}: only {len(protos)} cuDNN prototypes parsed; are these cuDNN 9's headers?")
    absent = [n for n in (*CUDNN, *DNN_HAND) if n not in protos]
    if absent:
        raise GenError(f"{include} does not declare {', '.join(absent)} (interpose/tools/api_facts.py: CUDNN, DNN_HAND)")
    return protos


def describe_cudnn(protos: dict[str, Proto]) -> dict[str, "Function"]:
    """The cuDNN functions transparent mode marshals, their facts completed from the prototypes (api_facts._bn):
    a tensor descriptor crosses by value, an activation descriptor must be NULL, a pointer to void is device
    memory unless a host scalar, a size_t * is an output."""
    functions = {}
    for name, fact in CUDNN.items():
        proto = protos[name]
        handles, device, outputs, check = dict(fact.handles), list(fact.device), list(fact.outputs), fact.remote_check
        for p in proto.params:
            base = p.type.replace("const ", "").strip()
            if p.name in handles or p.name in fact.host_in or p.name in fact.creates or p.name in outputs:
                continue
            if base == "cudnnTensorDescriptor_t":
                handles[p.name] = "dnn_tensor"
            elif base == "cudnnActivationDescriptor_t":
                handles[p.name] = "null_only"
                check = f"{p.name} != NULL"
            elif base == "void *":
                device.append(p.name)
            elif base == "size_t *":
                outputs.append(p.name)
        fact = replace(fact, handles=handles, device=tuple(device), outputs=tuple(outputs), remote_check=check)
        check_fact(name, proto, fact)
        functions[name] = Function(name, CUDNN_LIB, proto, fact, "")
    return functions


_DNN_SCALAR_BYTES = {"Boolean": "sizeof(bool)", "64-bit signed integer": "sizeof(int64_t)",
                     "32-bit float": "sizeof(float)", "64-bit double": "sizeof(double)",
                     "Void pointer": "sizeof(void *)", "32-bit signed integer": "sizeof(int32_t)",
                     "Character": "sizeof(char)"}


def dnn_attribute_types(include: Path) -> list[tuple[str, str]]:
    """(CUDNN_TYPE_..., C expression of one element's size) for every backend attribute type of cudnn_graph.h,
    from the type each member's comment documents (``cudnnDataType_t value``, ``64-bit signed integer value``)."""
    text = (include / "cudnn_graph.h").read_text(encoding="utf-8", errors="replace")
    m = re.search(r"typedef\s+enum\s*\{(?P<body>(?:(?!typedef).)*?)\}\s*cudnnBackendAttributeType_t\s*;", text, re.S)
    if m is None:
        raise GenError(f"{include / 'cudnn_graph.h'}: no 'typedef enum {{ ... }} cudnnBackendAttributeType_t;'")
    out = []
    for member in re.finditer(r"^\s*(CUDNN_TYPE_\w+)\b[^=\n]*=\s*\d+\s*,?\s*/\*\*<\s*([^.*]+?)\s+value\b", m.group("body"),
                              re.M):
        doc = member.group(2).strip()
        size = f"sizeof({doc})" if re.fullmatch(r"cudnn\w+_t", doc) else _DNN_SCALAR_BYTES.get(doc)
        if size is None:
            raise GenError(f"cudnn_graph.h: {member.group(1)} documents a '{doc}' value, whose size the generator "
                           f"does not know (gen_interpose.py: _DNN_SCALAR_BYTES)")
        out.append((member.group(1), size))
    if len(out) < 20 or not any(name == "CUDNN_TYPE_BACKEND_DESCRIPTOR" for name, _ in out):
        raise GenError(f"cudnn_graph.h: only {len(out)} backend attribute types parsed; header format changed?")
    return out


def dnn_last_data_type(include: Path) -> int:
    """The largest value of cudnn_graph.h's cudnnDataType_t (a tensor descriptor of a larger one is refused, as
    cuDNN refuses it)."""
    text = (include / "cudnn_graph.h").read_text(encoding="utf-8", errors="replace")
    m = re.search(r"typedef\s+enum\s*\{(?P<body>(?:(?!typedef).)*?)\}\s*cudnnDataType_t\s*;", text, re.S)
    values = [int(v) for v in re.findall(r"^\s*CUDNN_DATA_\w+\s*=\s*(\d+)", m.group("body"), re.M)] if m else []
    if not values:
        raise GenError(f"{include / 'cudnn_graph.h'}: no cudnnDataType_t values parsed; header format changed?")
    return max(values)


def dnn_attribute_table(types: list[tuple[str, str]]) -> str:
    """The element size of each backend attribute type (appended to remote_stubs.c and proxy_dispatch.c:
    remote/dnn.c sizes a SetAttribute's array, the proxy checks what it receives)."""
    rows = [f"    [{name}] = {size}," for name, size in types]
    return "\n".join(["", "#ifdef JITCKPT_REMOTE_CUDNN",
                      "/* The size of one element of each cuDNN backend attribute type, from cudnn_graph.h. */",
                      "const size_t jitckpt_dnn_type_bytes[] = {", *rows, "};",
                      "const unsigned jitckpt_dnn_type_count = sizeof jitckpt_dnn_type_bytes / sizeof jitckpt_dnn_type_bytes[0];",
                      "#endif", ""])


# The three attribute enums of cublasLt.h whose values the worker keeps (interpose/remote/blaslt.c).
LT_ATTRIBUTE_ENUMS = {"cublasLtMatmulDescAttributes_t": "JITCKPT_LT_MATMUL_DESC",
                      "cublasLtMatrixLayoutAttribute_t": "JITCKPT_LT_LAYOUT",
                      "cublasLtMatmulPreferenceAttributes_t": "JITCKPT_LT_PREFERENCE"}
_LT_TYPE_BYTES = {"int8_t": 1, "uint8_t": 1, "int16_t": 2, "uint16_t": 2, "int32_t": 4, "uint32_t": 4,
                  "int64_t": 8, "uint64_t": 8, "float": 4, "double": 8, "void *": 8, "const void *": 8}


def lt_attribute_sizes(path: Path) -> list[tuple[str, str, int, int]]:
    """(kind, attribute, value, size) of every attribute of cublasLt.h's three attribute enums.

    The size is that of the type its comment documents (``* int32_t, default: ...``, ``Bias case: const
    void *, ...``), 0 where the comment names none: the worker then accepts any size and the library checks
    it when a call carries the attribute."""
    text = path.read_text(encoding="utf-8", errors="replace")
    line_type = re.compile(r"^\s*\*\s*(?:[\w ]+:\s*)?(const void \*|void \*|u?int(?:8|16|32|64)_t|float|double)\s*(?:[,;]|\s+based\b|$)",
                           re.M)
    out = []
    for enum, kind in LT_ATTRIBUTE_ENUMS.items():
        m = re.search(r"typedef\s+enum\s*\{(?P<body>(?:(?!typedef).)*?)\}\s*" + enum + r"\s*;", text, re.S)
        if m is None:
            raise GenError(f"{path}: no 'typedef enum {{ ... }} {enum};'")
        previous = 0
        body = m.group("body")
        for member in re.finditer(r"^\s*(CUBLASLT_\w+)\s*=\s*(\d+)\s*,?", body, re.M):
            doc = body[previous:member.start()]
            previous = member.end()
            found = line_type.search(doc)
            out.append((kind, member.group(1), int(member.group(2)), _LT_TYPE_BYTES[found.group(1)] if found else 0))
        if not any(k == kind for k, *_ in out):
            raise GenError(f"{path}: {enum} has no members")
    return out


def lt_attribute_table(sizes: list[tuple[str, str, int, int]]) -> str:
    """The C table remote/blaslt.c checks a SetAttribute against (appended to remote_stubs.c)."""
    rows = [f"    {{{kind}, {value}, {size}}},  /* {name} */" for kind, name, value, size in sizes]
    return "\n".join(["", "/* cuBLASLt's attributes and the size of each value (0: not documented), from cublasLt.h:",
                      " * remote/blaslt.c refuses an unknown attribute or a wrong size as cuBLASLt does. */",
                      "const struct jitckpt_lt_attr_size remote_lt_attr_sizes[] = {", *rows, "};",
                      f"const unsigned remote_lt_attr_count = {len(sizes)};", ""])


def version_code(major: int, minor: int, patch: int) -> int:
    """NCCL_VERSION(major, minor, patch), as nccl.h computes it."""
    return major * 1000 + minor * 100 + patch if major <= 2 and minor <= 8 else major * 10000 + minor * 100 + patch


def nccl_version(path: Path) -> tuple[int, str]:
    """(NCCL_VERSION_CODE, "major.minor.patch") of an nccl.h."""
    text = path.read_text(encoding="utf-8", errors="replace")
    fields = dict(re.findall(r"#\s*define\s+NCCL_(MAJOR|MINOR|PATCH)\s+(\d+)", text))
    if set(fields) != {"MAJOR", "MINOR", "PATCH"}:
        raise GenError(f"{path}: no '#define NCCL_MAJOR/NCCL_MINOR/NCCL_PATCH' lines; is it NCCL's nccl.h?")
    major, minor, patch = (int(fields[k]) for k in ("MAJOR", "MINOR", "PATCH"))
    return version_code(major, minor, patch), f"{major}.{minor}.{patch}"


def newer_than_header(nccl_header: Path, facts: dict[str, Fact]) -> dict[str, str]:
    """The facts table's NCCL functions that NCCL added after the header's version: name -> reason.

    The reason is what transparent mode says when a program calls one (the
    remote library refuses it by name).  GenError when a ``since`` disagrees
    with the header: a header older than ``since`` that declares the
    function, or a ``since`` on a CUDA runtime function.
    """
    code, version = nccl_version(nccl_header)
    declared = parse_nccl_header(nccl_header)
    out = {}
    for name, fact in facts.items():
        if not fact.since:
            continue
        m = re.fullmatch(r"(\d+)\.(\d+)", fact.since)
        if not name.startswith("nccl") or not m:
            raise GenError(f"{name}: since={fact.since!r}; only an NCCL function has one, as \"major.minor\"")
        if code >= version_code(int(m.group(1)), int(m.group(2)), 0):
            continue
        if name in declared:
            raise GenError(f"{name}: the facts table says NCCL {fact.since} added it, but {nccl_header} "
                           f"(NCCL {version}) declares it; correct its since= in interpose/tools/api_facts.py")
        out[name] = (f"NCCL {fact.since} added it, and jitckpt was built against the nccl.h of NCCL {version}: "
                     f"rebuild jitckpt's native parts against the NCCL the job uses (NCCL_INCLUDE=...)")
    return out


def parse_prototype(text: str, name: str) -> Proto:
    m = re.fullmatch(r"\s*([\w\s*]+?)\s*\b(\w+)\s*\((.*)\)\s*;?\s*", text, flags=re.S)
    params = parse_params(m.group(3), name) if m else None
    if not m or m.group(2) != name or params is None:
        raise GenError(f"{name}: the facts table's prototype does not parse: {text!r}")
    return Proto(normalize_type(m.group(1)), name, params)


# ---- the API description: headers + facts --------------------------------------------


@dataclass(frozen=True)
class Function:
    name: str                    # plain name
    library: str                 # CUDART or NCCL
    proto: Proto
    fact: Fact
    twin: str                    # per-thread-default-stream twin, or ""

    def flavours(self) -> list[tuple[str, int]]:
        """(exported name, ptds) of each default-stream flavour."""
        return [(self.name, 0)] + ([(self.twin, 1)] if self.twin else [])


def describe(cuda_header: Path, nccl_header: Path, facts: dict[str, Fact]) -> dict[str, Function]:
    """Every function the facts table names, with its prototype; GenError naming any the headers lack.

    NCCL functions newer than the header (``newer_than_header``) are left out.
    """
    cuda, twins = parse_cuda_header(cuda_header)
    nccl = parse_nccl_header(nccl_header)
    newer = newer_than_header(nccl_header, facts)
    functions = {}

    def header_path(library: str) -> Path:
        return nccl_header if library == NCCL else cuda_header

    for name, fact in facts.items():
        if name in newer:
            continue
        library = NCCL if name.startswith(("nccl", "pnccl")) else CUDART
        header = nccl if library == NCCL else cuda
        if fact.prototype:
            if name in header:
                raise GenError(f"{name}: the facts table gives a prototype, but {header_path(library)} declares one")
            proto = parse_prototype(fact.prototype, name)
            twin = fact.per_thread
        elif name in header:
            proto, twin = header[name], twins.get(name, "")
        else:
            since = f" (NCCL {fact.since} added it, and this header is not older)" if fact.since else ""
            raise GenError(f"{name}: in the facts table (interpose/tools/api_facts.py) but not declared by "
                           f"{header_path(library)}{since}")
        check_fact(name, proto, fact)
        functions[name] = Function(name, library, proto, fact, twin)
    for function in functions.values():
        for other in function.fact.needs:
            if other not in functions:
                raise GenError(f"{function.name}: needs {other}, which is not in the facts table")
    return functions


def check_fact(name: str, proto: Proto, fact: Fact) -> None:
    params = {p.name for p in proto.params}
    named = [*fact.before_args, *fact.handles, *fact.creates, *fact.destroys, *fact.outputs, *fact.log_bytes]
    unknown = [p for p in named if p not in params]
    if unknown:
        raise GenError(f"{name}: the facts table names parameters {unknown} that {proto.decl()} does not have")
    if fact.hook and fact.before:
        raise GenError(f"{name}: a fact has either a hook or a before-hook, not both")
    if fact.lookup and fact.wrapped:
        raise GenError(f"{name}: a looked-up function is not wrapped")
    if fact.needs and not fact.hook:
        raise GenError(f"{name}: only a hook receives the functions it needs")
    if fact.per_thread and not fact.prototype:
        raise GenError(f"{name}: per_thread goes with prototype; the header names the twins of the others")


def next_symbols(functions: dict[str, Function]) -> list[tuple[str, str]]:
    """(name, library) of every next_<name> the library uses, wrapped flavours first."""
    out: dict[str, str] = {}
    for f in functions.values():
        if f.fact.wrapped:
            for name, ptds in f.flavours():
                out[name] = f.library
                for other in f.fact.needs:
                    out[flavour(functions[other], ptds)] = functions[other].library
    for f in functions.values():
        if f.fact.lookup:
            out[f.name] = f.library
    return list(out.items())


def flavour(function: Function, ptds: int) -> str:
    return function.twin if ptds and function.twin else function.name


# ---- writing ------------------------------------------------------------------------


def banner(what: str, inputs: list[Path]) -> str:
    names = ", ".join(p.name for p in inputs)
    return (f"/* Generated by {GENERATOR} from {names} -- do not edit.\n"
            f" * {what} */\n")


def entry_point(function: Function, name: str, ptds: int, functions: dict[str, Function]) -> str:
    """One exported entry point: fetch the real function, then one call into its hook."""
    proto, fact = function.proto.renamed(name), function.fact
    args = [p.name for p in proto.params]
    lines = [f"EXPORT {proto.decl()}", "{",
             f"    __typeof__({name}) *next = forward_fn(&next_{name});",
             "    if (unlikely(next == NULL))",
             f"        return {NOT_FOUND[function.library]};"]
    if fact.hook:
        needs = [f"forward_fn(&next_{flavour(functions[n], ptds)})" for n in fact.needs]
        lines.append(f"    return hook_{fact.hook}({', '.join(['next', *needs, *args, str(ptds)])});")
    else:
        lines.append(f"    hook_{fact.before}({', '.join(fact.before_args)});")
        lines.append(f"    return next({', '.join(args)});")
    return "\n".join(lines + ["}", ""])


def entry_file(functions: dict[str, Function], library: str, ptds: int, purpose: str, inputs: list[Path]) -> str:
    out = [banner(purpose, inputs)]
    if ptds:
        out.append("/* The real header then declares the _ptsz/_ptds names, which the definitions\n"
                   " * below must match. */\n#define CUDA_API_PER_THREAD_DEFAULT_STREAM 1")
    out.append('#include "hooks.h"\n')
    for f in functions.values():
        if f.library == library and f.fact.wrapped:
            for name, p in f.flavours():
                if p == ptds:
                    out.append(entry_point(f, name, ptds, functions))
    return "\n".join(out)


def next_syms_files(functions: dict[str, Function], inputs: list[Path]) -> tuple[str, str]:
    syms = next_symbols(functions)
    header = [banner("The next definition of every function the library wraps, needs or looks up "
                     "(see forward.c),\n * and the prototypes no header declares (the facts table).", inputs),
              "#ifndef JITCKPT_INTERPOSE_NEXT_SYMS_H", "#define JITCKPT_INTERPOSE_NEXT_SYMS_H", ""]
    for f in functions.values():
        if f.fact.prototype:
            header += [f"{f.proto.decl()};"] + ([f"{f.proto.renamed(f.twin).decl()};"] if f.twin else [])
    header += [""] + [f"extern struct next_sym next_{name};" for name, _ in syms] + ["", "#endif", ""]
    source = [banner("The next-symbol table (see forward.c).", inputs), '#include "interpose.h"', ""]
    lib = {CUDART: "NEXT_CUDART", NCCL: "NEXT_NCCL"}
    source += [f'struct next_sym next_{name} = {{"{name}", {lib[library]}, NULL, 0}};' for name, library in syms]
    return "\n".join(header), "\n".join(source + [""])


def version_script(functions: dict[str, Function], soname: str, inputs: list[Path]) -> str:
    cuda = [name for f in functions.values() if f.library == CUDART and f.fact.wrapped for name, _ in f.flavours()]
    return "\n".join([
        banner(f"Exports of libjitckpt_interpose.so.  The wrapped CUDA runtime functions are in\n"
               f" * node {soname}, the node of the real runtime, so that CUDA 13 binaries'\n"
               f" * versioned imports bind here.  NCCL's functions are unversioned, as in the\n"
               f" * real library: not named here, they land in the base version (everything\n"
               f" * else is hidden by -fvisibility=hidden).  The control interface has its own node.",
               inputs).rstrip("\n"),
        f"{soname} {{", "  global:", *[f"    {name};" for name in cuda], "};", "",
        f"{CONTROL_NODE} {{", "  global:", "    jitckpt_interpose_*;", "    jitckpt_phase_*;", "};", ""])


REMOTE_MARSHALLED, REMOTE_HAND, REMOTE_IN_PROCESS = "marshalled", "hand-written", "in-process"
# A function that returns a string about a handle (ncclGetLastError(comm)): the library
# says once that it is not marshalled and returns a fixed text; the program goes on.
REMOTE_PLACEHOLDER = "placeholder"


def remote_column(remote_files: dict[str, str], functions: dict[str, Function]) -> tuple[dict[str, str], dict[str, str]]:
    """What ``libjitckpt_remote.so`` does with each function, read back from its generated files.

    Returns ``(handled, refused)``: ``handled`` maps a function the remote
    library takes care of to how (``marshalled``: a generated stub and proxy
    dispatch; ``hand-written``: ``interpose/remote/special.c`` and the
    proxy's; ``in-process``: a pure function, called in the worker, or one the worker answers itself
    (``api_facts.ANSWERED_IN_WORKER``: driver entry points, cuBLASLt descriptors);
    ``placeholder``: a string about a handle, such as ``ncclGetLastError``,
    which says once that it is not marshalled and returns a fixed text, the
    program going on), and ``refused`` maps every function it refuses by
    name (the call fails) to the reason it gives at run time.  Read from the very text the library is built from
    (``remote_fns.h``, ``remote_stubs.c``), so ``jit-run doctor`` can never
    promise what the library refuses.
    """
    ids = re.findall(r"^    RFN_(\w+),$", remote_files["remote_fns.h"], flags=re.M)
    generated = {n for n, f in functions.items() if f.fact.remote == "gen"} | {
        n for n, f in (*CUBLAS.items(), *CUDNN.items()) if f.remote == "gen"}
    handled = {name: REMOTE_MARSHALLED if name in generated else REMOTE_HAND
               for name in ids if name not in ("none", "count")}
    stubs = remote_files["remote_stubs.c"]
    for name in re.findall(r'remote_local_fn\(&fn, "(\w+)"', stubs):
        handled[name] = REMOTE_IN_PROCESS
    for plain, twin in re.findall(r"/\* per-thread twin of (\w+) \*/\nEXPORT [^(]*?(\w+)\(", stubs):
        handled[twin] = handled[plain]
    for name in ANSWERED_IN_WORKER:  # hand-written, answered in the worker without the proxy
        if name in handled:
            handled[name] = REMOTE_IN_PROCESS
    # Functions the library does not export: they bind to the real library in the worker and
    # touch no device state (gen_remote.py: void results, pointer parameters, no error code).
    unexported = re.search(r"/\* Not exported \(.*?\): ([\w, ]*) \*/", stubs)
    for name in (unexported.group(1).split(", ") if unexported and unexported.group(1).strip() else []):
        handled[name] = REMOTE_IN_PROCESS
    refused = {}
    for name, reason, result in re.findall(r'remote_refuse\("(\w+)", "((?:[^"\\]|\\.)*)"\);\n    return ([^;]*);',
                                           stubs):
        if result.startswith('"'):
            handled[name] = REMOTE_PLACEHOLDER
        else:
            refused[name] = re.sub(r"\\(.)", r"\1", reason)
    if len(refused) + sum(1 for how in handled.values() if how == REMOTE_PLACEHOLDER) != stubs.count("remote_refuse("):
        raise GenError("remote_column: a refusal in remote_stubs.c does not have the form it expects")
    both = sorted(set(handled) & set(refused))
    if both:
        raise GenError(f"the remote files both handle and refuse {both[:5]}")
    return handled, refused


def coverage(functions: dict[str, Function], soname: str, remote: tuple[dict[str, str], dict[str, str]]) -> str:
    """coverage.json: per function its library, version, passthrough mode and transparent coverage.

    The rows are every function of the facts table (each default-stream
    flavour) and every function the remote library handles or refuses: the
    whole API the headers declare, and nvcc's hidden entry points.
    ``transparent`` is true when transparent mode covers the function today:
    ``libjitckpt_remote.so`` handles it (``remote_column``).  Two more
    tables follow the rows: ``remote`` (how the remote library handles each
    function it does) and ``refused`` (every function it refuses by name,
    with the reason it prints).  The CPU device emulator is not an input:
    ``tests/test_interpose.py`` checks that it implements what is covered.
    """
    handled, refused = remote
    wrapped = {name for f in functions.values() if f.fact.wrapped for name, _ in f.flavours()}
    names = {name for f in functions.values() for name, _ in f.flavours()} | set(handled) | set(refused)

    def row(name: str) -> tuple[str, str | None]:
        if name.startswith("cudnn"):
            return CUDNN_LIB, "libcudnn.so.9"
        if name.startswith("cublasLt"):
            return CUBLASLT_LIB, "libcublasLt.so.13"
        if name.startswith("cublas"):
            return CUBLAS_LIB, "libcublas.so.13"
        library = NCCL if name.startswith(("nccl", "pnccl")) else CUDART
        return library, soname if library == CUDART else None

    rows = [f"  {json.dumps(name)}: " + json.dumps({
                "library": row(name)[0], "version": row(name)[1],
                "passthrough": "wrapped" if name in wrapped else "forwarded",
                "transparent": name in handled})
            for name in sorted(names)]

    def lines(mapping: dict[str, str]) -> str:
        return ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(mapping.items()))

    # One function a line, as json.dumps(indent=...) cannot write it.
    return (f'{{"generated_by": {json.dumps(GENERATOR + " -- do not edit")},\n'
            f' "runtime_version_node": {json.dumps(soname)},\n'
            f' "functions": {{\n' + ",\n".join(rows) + "\n },\n"
            f' "remote_library": "libjitckpt_remote.so",\n'
            f' "remote": {{\n' + lines(handled) + "\n },\n"
            f' "refused": {{\n' + lines(refused) + "\n }}\n")


def cdef(control_header: Path, inputs: list[Path]) -> str:
    """The control header as cffi's cdef() takes it: no preprocessor but the API version."""
    text = strip_comments(control_header.read_text(encoding="utf-8"))
    out, live = [], [True]
    for line in text.splitlines():
        directive = re.match(r"\s*#\s*(\w+)\s*(.*)", line)
        if not directive:
            if all(live) and line.strip():
                out.append(line.rstrip())
            continue
        word, rest = directive.groups()
        if word in ("if", "ifdef", "ifndef"):
            # Only the C view: __cplusplus is undefined, the include guard is not yet defined.
            live.append(word == "ifndef" or (word == "ifdef" and rest.strip() != "__cplusplus"))
        elif word == "endif":
            live.pop()
        elif word == "define" and rest.startswith("JITCKPT_INTERPOSE_API_VERSION") and all(live):
            out.append(f"#define {rest.strip()}")
    if not any(line.startswith("#define JITCKPT_INTERPOSE_API_VERSION ") for line in out):
        raise GenError(f"{control_header}: no '#define JITCKPT_INTERPOSE_API_VERSION <n>' line")
    return banner("The declarations of jitckpt_interpose.h, for cffi's ffi.cdef().", inputs) + "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cuda-header", type=Path, required=True)
    parser.add_argument("--nccl-header", type=Path, required=True)
    parser.add_argument("--control-header", type=Path, required=True)
    parser.add_argument("--cudart-soname", default="libcudart.so.13")
    parser.add_argument("--cublas-header", type=Path, default=None,
                        help="cuBLAS's cublas_api.h: transparent mode then forwards cuBLAS (api_facts.CUBLAS); "
                             "without it every cuBLAS call meets the driver fence")
    parser.add_argument("--cublaslt-header", type=Path, default=None,
                        help="cuBLASLt's cublasLt.h (with --cublas-header): transparent mode then forwards "
                             "cuBLASLt too (api_facts.CUBLASLT_HAND, interpose/remote/blaslt.c)")
    parser.add_argument("--cudnn-include", type=Path, default=None,
                        help="the directory with cuDNN 9's headers (cudnn_graph.h, cudnn_ops.h, ...): transparent "
                             "mode then forwards cuDNN (api_facts.CUDNN, DNN_HAND, interpose/remote/dnn.c)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--remote", action="store_true",
                        help="write the remote-mode files instead (gen_remote.py): the worker stubs of "
                             "libjitckpt_remote.so and the proxy's dispatch")
    args = parser.parse_args(argv)
    facts_file = Path(__file__).resolve().parent / "api_facts.py"
    if args.remote:
        return remote_main(args, facts_file)
    try:
        headers = [args.cuda_header, args.nccl_header]
        functions = describe(args.cuda_header, args.nccl_header, FACTS)
        remote = remote_column(remote_files(args, functions, facts_file), functions)
        inputs = [*headers, facts_file]
        files = {
            "cuda_entry.c": entry_file(functions, CUDART, 0, "The CUDA runtime entry points the library takes "
                                       "the place of: each one calls its hook in src/hooks.h.", inputs),
            "cuda_entry_ptsz.c": entry_file(functions, CUDART, 1, "The per-thread-default-stream twins "
                                            "(_ptsz/_ptds) of those entry points, called by code\n * built "
                                            "with --default-stream per-thread: stream 0 is the calling "
                                            "thread's own.", inputs),
            "nccl_entry.c": entry_file(functions, NCCL, 0, "The NCCL entry points the library takes the "
                                       "place of: each one calls its hook in src/hooks.h.", inputs),
            "interpose.map": version_script(functions, args.cudart_soname, inputs),
            "coverage.json": coverage(functions, args.cudart_soname, remote),
            "jitckpt_interpose.cdef": cdef(args.control_header, [args.control_header]),
        }
        files["next_syms.h"], files["next_syms.c"] = next_syms_files(functions, inputs)
    except (GenError, gen_remote.RemoteGenError) as exc:
        print(f"gen_interpose: {exc}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (args.out / name).write_text(text, encoding="utf-8")
    return 0


def remote_files(args: argparse.Namespace, functions: dict[str, Function], facts_file: Path) -> dict[str, str]:
    """The remote-mode files (gen_remote.py), by name; raises GenError or gen_remote.RemoteGenError."""
    cuda, twins = parse_cuda_header(args.cuda_header)
    nccl = parse_nccl_header(args.nccl_header)
    newer = newer_than_header(args.nccl_header, FACTS)
    names = gen_remote.header_names(strip_comments(args.cuda_header.read_text(errors="replace")))
    names |= gen_remote.header_names(strip_comments(args.nccl_header.read_text(errors="replace")))
    inputs = [args.cuda_header, args.nccl_header, facts_file, Path(gen_remote.__file__)]
    blas: dict[str, Proto] = {}
    if args.cublas_header is not None:
        blas_functions, blas = describe_cublas(args.cublas_header)
        functions = {**functions, **blas_functions}
        inputs.insert(2, args.cublas_header)
    hand = HIDDEN_HAND
    if args.cublaslt_header is not None:
        if args.cublas_header is None:
            raise GenError("--cublaslt-header needs --cublas-header (a cuBLASLt handle is a cuBLAS handle)")
        blas = {**blas, **parse_cublaslt_header(args.cublaslt_header)}
        hand = (*hand, *CUBLASLT_HAND)
        inputs.insert(3, args.cublaslt_header)
    dnn: dict[str, Proto] = {}
    if args.cudnn_include is not None:
        dnn = parse_cudnn_headers(args.cudnn_include)
        functions = {**functions, **describe_cudnn(dnn)}
        hand = (*hand, *DNN_HAND)
        inputs.insert(len(inputs) - 2, args.cudnn_include / "cudnn_graph.h")
    files = gen_remote.generate(functions, cuda, nccl, twins, names, newer, hand,
                                banner("Remote mode (transparent mode): see proxy_server/README.md.", inputs),
                                args.cudart_soname, blas, dnn)
    if args.cublaslt_header is not None:
        files["remote_stubs.c"] += lt_attribute_table(lt_attribute_sizes(args.cublaslt_header))
    if args.cudnn_include is not None:
        table = dnn_attribute_table(dnn_attribute_types(args.cudnn_include))
        table += ("#ifdef JITCKPT_REMOTE_CUDNN\nconst int jitckpt_dnn_last_data_type = "
                  f"{dnn_last_data_type(args.cudnn_include)};\n#endif\n")
        files["remote_stubs.c"] += table
        files["proxy_dispatch.c"] += table
    return files


def remote_main(args: argparse.Namespace, facts_file: Path) -> int:
    try:
        functions = describe(args.cuda_header, args.nccl_header, FACTS)
        files = remote_files(args, functions, facts_file)
    except (GenError, gen_remote.RemoteGenError) as exc:
        print(f"gen_interpose: {exc}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (args.out / name).write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
