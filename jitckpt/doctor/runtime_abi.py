"""Which CUDA runtime ABI a program, a library or the installed PyTorch uses.

jitckpt's interposition library stands in front of ``libcudart.so.13``: its
wrappers are exported in that version node, the node CUDA 13 binaries bind
(``cudaMalloc@libcudart.so.13``).  A CUDA 12 build binds
``cudaMalloc@libcudart.so.12`` instead, and the dynamic linker never lets a
``libcudart.so.13`` symbol stand in for it: preloaded into such a job, the
interposer would sit there unused while the job looked covered.  So the ABI
is stated, never guessed:

* ``runtime_abi`` reads it off the objects doctor analysed: the versions the
  runtime imports ask for, ``DT_NEEDED`` entries naming a ``libcudart``, and a
  root that *is* a runtime;
* ``torch_runtime`` finds it for the installed PyTorch without importing torch
  (which takes seconds): the ``DT_NEEDED`` entries of ``torch/lib/libtorch_cuda.so``
  (a bundled, renamed ``libcudart-<hash>.so.12`` counts too), else the
  ``cuda`` string of ``torch/version.py``.  jit-run uses it to keep the
  interposer out of a CUDA 12 job, and says so.

Only ``libcudart.so.13`` (CUDA 13) is covered.  A second build of the
interposer for ``libcudart.so.12`` is not offered: the CUDA 12 headers, and
so the exact CUDA 12 prototypes the generator would need, are not available
to check it against.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile

from jitckpt.doctor.elf import ElfObject, Import
from jitckpt.doctor.symbols import RUNTIME, RUNTIME_VERSION_NODE

#: The one runtime ABI the interposer covers.
COVERED_MAJOR = 13
# libcudart.so.12, and the renamed copies wheels bundle (libcudart-9335f6a2.so.12).
_RUNTIME_NAME = re.compile(r"^libcudart(?:-[0-9a-f]+)?\.so\.(\d+)(?:\.[\d.]+)?$")
# torch/version.py: cuda: Optional[str] = '12.4'  (or cuda = None on a CPU build)
_TORCH_VERSION_CUDA = re.compile(r"^cuda\s*(?::[^=\n]*)?=\s*['\"](\d+)(?:\.[\d.]*)?['\"]", re.M)


def runtime_major(name: str) -> Optional[int]:
    """12 for ``libcudart.so.12`` (or a renamed ``libcudart-<hash>.so.12``); None for anything else."""
    m = _RUNTIME_NAME.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class RuntimeAbi:
    """The CUDA runtime ABIs one program (with its libraries) or one PyTorch build uses."""

    #: the runtime names seen, e.g. ("libcudart.so.12",)
    names: tuple[str, ...]
    #: where each was seen, one phrase per name
    evidence: tuple[str, ...]

    @property
    def majors(self) -> tuple[int, ...]:
        """The CUDA major versions, e.g. (12,)."""
        return tuple(sorted({m for m in (runtime_major(n) for n in self.names) if m is not None}))

    @property
    def covered(self) -> bool:
        """True if every runtime in use is the one the interposer covers (libcudart.so.13)."""
        return self.majors == (COVERED_MAJOR,)

    @property
    def summary(self) -> str:
        """``libcudart.so.12 (CUDA 12)``."""
        majors = ", ".join(f"CUDA {m}" for m in self.majors) or "unknown CUDA version"
        return f"{', '.join(self.names)} ({majors})"

    @property
    def line(self) -> str:
        """One sentence for the report: the ABI, and plainly whether it is covered."""
        if self.covered:
            return (f"CUDA runtime ABI: {self.summary}, the ABI jitckpt's interposer covers "
                    f"({RUNTIME_VERSION_NODE} symbol versions)")
        return (f"CUDA runtime ABI: {self.summary}: NOT covered. jitckpt's interposer stands in front of "
                f"{RUNTIME_VERSION_NODE} (CUDA {COVERED_MAJOR}) only; this code binds other symbol versions, "
                "which it never sees. Under jit-run the interposer is not preloaded for it and the Python "
                "watchdog stays in charge")

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"names": list(self.names), "majors": list(self.majors), "evidence": list(self.evidence),
                "covered": self.covered, "covered_abi": RUNTIME_VERSION_NODE, "line": self.line}


def runtime_abi(objects: Sequence[ElfObject], imports: Iterable[Import]) -> Optional[RuntimeAbi]:
    """The runtime ABI of analysed objects (the first is the root); None if none of them uses a runtime."""
    found: dict[str, str] = {}
    for imp in imports:
        if imp.category == RUNTIME and imp.version and runtime_major(imp.version) is not None:
            found.setdefault(imp.version, f"imports {imp.display}")
    for obj in objects:
        for needed in obj.needed:
            if runtime_major(needed) is not None:
                found.setdefault(needed, f"{obj.name} needs {needed}")
    root = objects[0] if objects else None
    if root is not None:
        for name in (root.soname or "", *root.version_definitions):
            if runtime_major(name) is not None and any(v == name for vs in root.exports.values() for v, _ in vs):
                found.setdefault(name, f"{root.name} is that runtime (defines version {name})")
    if not found:
        return None
    names = tuple(sorted(found, key=lambda n: (runtime_major(n) or 0, n)))
    return RuntimeAbi(names, tuple(found[n] for n in names))


def needed_entries(path: Path | str) -> list[str]:
    """The DT_NEEDED entries of one ELF file, read without its symbol tables (quick on a 1 GB library)."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        for section in elf.iter_sections():
            if isinstance(section, DynamicSection):
                return [tag.needed for tag in section.iter_tags("DT_NEEDED")]
    return []


@dataclass(frozen=True)
class TorchRuntime:
    """The CUDA runtime the installed PyTorch uses, found without importing it."""

    torch_dir: Path
    #: None for a CPU-only build
    abi: Optional[RuntimeAbi]


def torch_dir() -> Optional[Path]:
    """The installed ``torch`` package's directory (not imported); None if torch is not installed."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent


def torch_runtime(directory: Optional[Path] = None) -> Optional[TorchRuntime]:
    """The CUDA runtime of the PyTorch in ``directory`` (default: the installed one); None without torch."""
    directory = torch_dir() if directory is None else Path(directory)
    if directory is None or not directory.is_dir():
        return None
    lib = directory / "lib"
    found: dict[str, str] = {}
    for name in ("libtorch_cuda.so", "libc10_cuda.so"):
        path = lib / name
        if not path.is_file():
            continue
        try:
            needed = needed_entries(path)
        except Exception:  # a damaged or foreign file: fall back to version.py
            continue
        for entry in needed:
            if runtime_major(entry) is not None:
                found.setdefault(entry, f"torch/lib/{name} needs {entry}")
    if not found and lib.is_dir():
        for path in sorted(lib.glob("libcudart*.so*")):
            if runtime_major(path.name) is not None:
                found.setdefault(path.name, f"torch/lib bundles {path.name}")
    if not found:
        try:
            text = (directory / "version.py").read_text(encoding="utf-8", errors="replace")
        except OSError:
            text = ""
        m = _TORCH_VERSION_CUDA.search(text)
        if m:
            name = f"libcudart.so.{int(m.group(1))}"
            found[name] = f"torch/version.py says cuda {m.group(0).split('=', 1)[1].strip()}"
    if not found:
        return TorchRuntime(directory, None)
    names = tuple(sorted(found))
    return TorchRuntime(directory, RuntimeAbi(names, tuple(found[n] for n in names)))


def interposer_gap(directory: Optional[Path] = None) -> Optional[str]:
    """Why the interposer would not cover a job of the installed PyTorch (a CUDA 12 build); None if it would.

    jit-run prints it and leaves the interposer out: the Python watchdog, which
    tracks torch.distributed work handles whatever the runtime, stays in charge.
    """
    found = torch_runtime(directory)
    if found is None or found.abi is None or found.abi.covered:
        return None
    return (f"the CUDA/NCCL interposition library does not cover this job: PyTorch at {found.torch_dir} uses "
            f"{found.abi.summary} ({'; '.join(found.abi.evidence)}), and the interposer stands in front of "
            f"{RUNTIME_VERSION_NODE} (CUDA {COVERED_MAJOR}) only. It is not preloaded; the Python watchdog stays "
            "in charge (hang timeout over torch.distributed work; no CUDA-event watch, no NCCL async-error "
            "watch, no save-time copy redirection). `jit-run doctor` names the runtime of any program")
