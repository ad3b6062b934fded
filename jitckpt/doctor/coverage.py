"""What jitckpt covers: the interposer's generated coverage list, read as a ``Coverage``.

``make -C interpose`` generates ``gen/coverage.json`` from the real CUDA and
NCCL headers (``interpose/tools/gen_interpose.py``); a wheel carries it as
package data.  ``jitckpt.native.find`` says where it is.  Its form::

    {"generated_by": "...", "runtime_version_node": "libcudart.so.13",
     "functions": {"cudaMalloc": {"library": "cudart", "version": "libcudart.so.13",
                                  "passthrough": "forwarded", "transparent": true}, ...},
     "remote_library": "libjitckpt_remote.so",
     "remote": {"cudaMalloc": "marshalled", "__cudaRegisterFatBinary": "hand-written", ...},
     "refused": {"cudaGraphLaunch": "CUDA graphs: ...", ...}}

A function is *covered* when ``transparent`` is true: transparent mode's
worker library, ``libjitckpt_remote.so``, forwards it to the device proxy
(or, for a pure function such as ``cudaGetErrorString``, runs it in the
worker).  The generator reads that from the remote library's own generated
stubs, so it is what the library does today, not a plan; the CPU device
emulator is no input (``tests/test_interpose.py`` checks that it implements
every function sent to the proxy).  ``remote`` says how each function is handled
(``marshalled``: generated stub and dispatch; ``hand-written``: nvcc's hidden
entry points, launches, pinned host memory; ``in-process``), and ``refused``
gives the reason the library prints when a program calls a function it
refuses (both optional: older lists and the tests' fixtures lack them).
``passthrough`` says whether passthrough mode wraps a function (``wrapped``)
or hands it to the real library unchanged (``forwarded``).  When the list is
not built, ``load_coverage`` returns a ``Coverage`` that says so (``known``
is False) instead of guessing: the doctor then still analyses the program but
reports the coverage as unknown.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from jitckpt import native
from jitckpt.doctor.errors import DoctorError
from jitckpt.doctor.symbols import CUBLAS, CUDNN, NCCL, RUNTIME, RUNTIME_VERSION_NODE

#: Where the list lives inside the interposer's build directory.
COVERAGE_FILE = "gen/coverage.json"
#: The report's words when the list is not built.
NOT_BUILT = ("coverage unknown: the interposer's coverage list (" + COVERAGE_FILE + ") is not built; run "
             "`make -C interpose` in the jitckpt source tree, or reinstall jitckpt")
# The list's library names -> the symbol category their functions belong to.
_LIBRARIES = {"cudart": RUNTIME, "nccl": NCCL, "cublas": CUBLAS, "cublasLt": CUBLAS,  # (cuBLASLt: judged with cuBLAS)
              "cudnn": CUDNN}
_PASSTHROUGH_MODES = ("wrapped", "forwarded")


@dataclass
class Coverage:
    """The CUDA runtime and NCCL functions jitckpt's interposer covers in transparent mode.

    ``runtime`` and ``nccl`` map a covered function name to the symbol
    version it is exported with (None: unversioned, as NCCL).
    ``passthrough`` maps every listed runtime and NCCL function, covered or
    not, to ``wrapped`` or ``forwarded``.  ``remote`` maps a function
    ``libjitckpt_remote.so`` handles to how (``marshalled``,
    ``hand-written``, ``in-process``) and ``refused`` a function it refuses
    to its reason; both are empty for a list without those tables.
    ``sources`` says where the list came from, for the report.  ``missing``
    is None when the list was read, else why it is unknown (then the tables
    are empty).
    """

    runtime: dict[str, Optional[str]]
    nccl: dict[str, Optional[str]]
    sources: list[str]
    passthrough: dict[str, str] = field(default_factory=dict)
    runtime_version: str = RUNTIME_VERSION_NODE
    missing: Optional[str] = None
    remote: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    # cuBLAS functions forwarded to the device proxy (a build with cuBLAS's header; issue 19), by version
    cublas: dict[str, Optional[str]] = field(default_factory=dict)
    # cuDNN functions forwarded likewise (a build with cuDNN's headers)
    cudnn: dict[str, Optional[str]] = field(default_factory=dict)

    @classmethod
    def unknown(cls, why: str = NOT_BUILT) -> Coverage:
        """A coverage that could not be read, saying ``why``."""
        return cls({}, {}, [], missing=why)

    @property
    def known(self) -> bool:
        """True if the coverage list was read (False: nothing can be judged covered or not)."""
        return self.missing is None

    def lookup(self, category: str) -> dict[str, Optional[str]]:
        """The covered names of a category (empty for categories never covered)."""
        if category == RUNTIME:
            return self.runtime
        if category == NCCL:
            return self.nccl
        if category == CUBLAS:
            return self.cublas
        if category == CUDNN:
            return self.cudnn
        return {}

    def refusal(self, name: str) -> Optional[str]:
        """The reason ``libjitckpt_remote.so`` gives when it refuses ``name``; None if it does not (or is not known to)."""
        return self.refused.get(name)

    def to_json(self, full: bool = False) -> dict[str, Any]:
        """JSON form: whether it is known, counts and sources, plus the names when ``full``."""
        data: dict[str, Any] = {
            "known": self.known,
            "sources": self.sources,
            "runtime_functions": len(self.runtime),
            "nccl_functions": len(self.nccl),
            "runtime_version": self.runtime_version,
        }
        if not self.known:
            data["missing"] = self.missing
        if full:
            data["runtime"] = {n: v for n, v in sorted(self.runtime.items())}
            data["nccl"] = {n: v for n, v in sorted(self.nccl.items())}
            data["passthrough"] = {n: v for n, v in sorted(self.passthrough.items())}
            data["remote"] = {n: v for n, v in sorted(self.remote.items())}
            data["refused"] = {n: v for n, v in sorted(self.refused.items())}
        return data


def default_path() -> Optional[Path]:
    """The built coverage list (package data or ``interpose/build``), or None if it is not built."""
    return native.find(native.INTERPOSE, COVERAGE_FILE)


def load_coverage(path: Optional[Path | str] = None) -> Coverage:
    """Read the coverage list at ``path``, or the built one when ``path`` is None.

    With no ``path`` and no built list, the result is ``Coverage.unknown()``.
    Raises DoctorError (one line) for a file that is missing (when named),
    unreadable or not in the generator's format.
    """
    if path is None:
        path = default_path()
        if path is None:
            return Coverage.unknown()
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DoctorError(f"{path}: no such coverage list") from None
    except OSError as exc:
        raise DoctorError(f"{path}: cannot read the coverage list ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DoctorError(f"{path}: not a coverage list, invalid JSON ({exc})") from None
    try:
        return _parse(data, str(path))
    except ValueError as exc:
        raise DoctorError(f"{path}: not a coverage list as interpose/tools/gen_interpose.py writes it: {exc}; "
                          "rebuild it with `make -C interpose`") from None


def _parse(data: Any, source: str) -> Coverage:
    """The Coverage of a decoded coverage list; ValueError names what is wrong with it."""
    if not isinstance(data, dict) or not isinstance(data.get("functions"), dict):
        raise ValueError("no 'functions' object")
    version_node = data.get("runtime_version_node", RUNTIME_VERSION_NODE)
    if not isinstance(version_node, str):
        raise ValueError(f"'runtime_version_node' must be a string, got {version_node!r}")
    tables: dict[str, dict[str, Optional[str]]] = {RUNTIME: {}, NCCL: {}, CUBLAS: {}, CUDNN: {}}
    passthrough: dict[str, str] = {}
    for name, entry in data["functions"].items():
        if not isinstance(entry, dict):
            raise ValueError(f"the entry of {name} is not an object")
        library, version = entry.get("library"), entry.get("version")
        mode, transparent = entry.get("passthrough"), entry.get("transparent")
        if not isinstance(library, str) or not (version is None or isinstance(version, str)):
            raise ValueError(f"{name}: 'library' must be a string and 'version' a string or null")
        if mode not in _PASSTHROUGH_MODES or not isinstance(transparent, bool):
            raise ValueError(f"{name}: 'passthrough' must be one of {', '.join(_PASSTHROUGH_MODES)} "
                             "and 'transparent' true or false")
        category = _LIBRARIES.get(library)
        if category is None:  # a library doctor does not judge imports of
            continue
        passthrough[name] = mode
        if transparent:
            tables[category][name] = version
    remote, refused = data.get("remote", {}), data.get("refused", {})
    for key, table in (("remote", remote), ("refused", refused)):
        if not isinstance(table, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in table.items()):
            raise ValueError(f"'{key}' must map function names to strings")
    return Coverage(tables[RUNTIME], tables[NCCL], [source], passthrough, version_node,
                    remote=dict(remote), refused=dict(refused), cublas=tables[CUBLAS],
                    cudnn=tables[CUDNN])
