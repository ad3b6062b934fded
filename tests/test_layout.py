"""The package's shape: imports point one way, importing has no side effects, the code map is true.

The map is the Layout section of ``docs/design.md`` (it moved there from the README).

Layers, lowest first (a module may import its own layer's base modules and
anything below; subpackages of one layer do not import each other):

    0  config, validate, eventlog, jit_event, faults     names, checks and records
    1  store, native                                     checkpoint tiers; native libraries
    2  worker, doctor, plan                              where code runs / offline tools
    3  api, adapters, transparent                        the public calls; framework adapters (zero-code);
                                                         transparent mode's Python side
    4  launch, __init__                                  jit-run; the package's front door
    5  __main__                                          ``python -m jitckpt`` is ``jit-run``

No circles, not even between two modules of one subpackage.  An import counts
wherever it stands: inside a function, under TYPE_CHECKING (but for
INJECTED_TYPES), relative, or a name taken from a package's ``__init__``.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import REPO, job_env

PACKAGE = REPO / "jitckpt"
LAYERS: dict[str, int] = {
    "config": 0, "validate": 0, "eventlog": 0, "jit_event": 0, "faults": 0, "console": 0,
    "store": 1, "native": 1,
    "worker": 2, "doctor": 2, "plan": 2,
    "api": 3, "adapters": 3, "transparent": 3,
    "launch": 4, "__init__": 4,
    "__main__": 5,
}


# Modules that pass themselves to the helpers they call, which name their type for annotations only:
# a type-only import of one of these is not counted as an edge back.  Nothing else is exempt.
INJECTED_TYPES: dict[str, str] = {
    "jitckpt.worker.runtime": "the JitRuntime hands itself to its helpers (save, sharding, resume, ...)",
}


def _module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _modules(package: Path = PACKAGE) -> dict[str, Path]:
    return {_module_name(p, package): p for p in package.rglob("*.py") if "_bootstrap" not in p.parts}


def _owner(name: str, known: set[str]) -> str:
    """The most specific module of the package that ``name`` (a module or a name in one) refers to."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name


def _imports(path: Path, module: str, known: set[str]) -> tuple[set[str], set[str]]:
    """Modules of the package that ``path`` (module ``module``) imports: (at run time, anywhere, also inside
    functions; for type checking only, under TYPE_CHECKING).

    ``from P import n`` is an edge to the module ``P.n`` when there is one, else to ``P`` itself,
    whose namespace ``n`` is taken from (its ``__init__`` for a package, even your own package's);
    relative imports count like absolute ones.
    """
    tree = ast.parse(path.read_text(), str(path))
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only |= {id(n) for n in ast.walk(node)}
    here = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: tuple[set[str], set[str]] = (set(), set())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for name in names:
            target = _owner(name, known)
            if target and target != module:
                found[id(node) in typing_only].add(target)
    return found


def _graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the modules it imports, at run time or for type checking only (but for INJECTED_TYPES).

    A circle through an annotation is a circle too: neither module can be read or moved without the other.
    """
    modules = _modules(package)
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        runtime, typing = _imports(path, name, known)
        graph[name] = runtime | {t for t in typing if t not in INJECTED_TYPES}
    return graph


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a list of modules, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_planted_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles_even_through_function_level_or_type_only_imports():
    cycle = find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


PLANTED_CIRCLES = {
    "type-only": {
        "sub/base.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.shard import Shard\n"
                       "class Error(Exception): ...\n",
        "sub/shard.py": "from pkg.sub.base import Error\nclass Shard: ...\n",
    },
    "relative": {
        "sub/a.py": "from .b import B\nclass A: ...\n",
        "sub/b.py": "class B: ...\ndef late():\n    from . import a\n",
    },
    "relative-from-the-parent": {
        "top.py": "from pkg.sub.c import C\n",
        "sub/c.py": "class C: ...\ndef late():\n    from .. import top\n",
    },
    "through-the-package-init": {
        "sub/__init__.py": "from pkg.sub.a import A\nLIMIT = 3\n",
        "sub/a.py": "from pkg.sub import LIMIT\nclass A: ...\n",
    },
}


def _plant(root: Path, files: dict[str, str]) -> Path:
    package = root / "pkg"
    for name, text in {"__init__.py": "", "sub/__init__.py": "", **files}.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return package


@pytest.mark.parametrize("kind", PLANTED_CIRCLES)
def test_a_circle_inside_a_subpackage_is_found(tmp_path, kind):
    cycle = find_cycle(_graph(_plant(tmp_path, PLANTED_CIRCLES[kind])))
    assert cycle is not None and len(cycle) == 3, cycle
    planted = {_module_name(tmp_path / "pkg" / name, tmp_path / "pkg") for name in PLANTED_CIRCLES[kind]}
    assert set(cycle) == planted


def test_a_sibling_imported_through_its_package_is_not_an_edge_to_the_package(tmp_path):
    package = _plant(tmp_path, {
        "sub/__init__.py": "from pkg.sub.b import B\n",
        "sub/a.py": "class A: ...\n",
        "sub/b.py": "from pkg.sub import a\nfrom . import a as again\nclass B: ...\n",
    })
    graph = _graph(package)
    assert graph["pkg.sub.b"] == {"pkg.sub.a"} and find_cycle(graph) is None, graph


def test_every_module_has_a_layer():
    missing = sorted({_top(m) for m in _modules()} - LAYERS.keys())
    assert not missing, f"add these to LAYERS in {__file__}: {missing}"


def test_imports_point_down_the_layers():
    wrong = []
    for module, targets in _graph().items():
        here = _top(module)
        for target in targets:
            there = _top(target)
            if here == there:
                continue
            if LAYERS[there] > LAYERS[here] or (LAYERS[there] == LAYERS[here] and LAYERS[here] > 0):
                wrong.append(f"{module} (layer {LAYERS[here]}) imports {target} (layer {LAYERS[there]})")
    assert not wrong, "\n".join(sorted(wrong))


def test_importing_jitckpt_has_no_side_effects():
    """Even inside a jit-run worker's environment, ``import jitckpt`` arms nothing and imports no torch."""
    probe = textwrap.dedent(
        """
        import signal, sys, threading
        before = signal.getsignal(signal.SIGTERM)
        import jitckpt, jitckpt.api, jitckpt.worker, jitckpt.store, jitckpt.native
        assert jitckpt.worker.current() is None, "a runtime was created on import"
        assert threading.active_count() == 1, threading.enumerate()
        assert signal.getsignal(signal.SIGTERM) is before, "SIGTERM handler changed on import"
        assert "torch" not in sys.modules, "import jitckpt imported torch"
        print("CLEAN")
        """
    )
    env = job_env() | {"JITCKPT_ACTIVE": "1", "RANK": "0", "WORLD_SIZE": "1"}
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0 and "CLEAN" in result.stdout, result.stdout + result.stderr


LAYOUT_DOC = REPO / "docs" / "design.md"


def _layout_section() -> str:
    text = LAYOUT_DOC.read_text()
    match = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, "docs/design.md has no '## Layout' section"
    return match.group(1)


def test_layout_map_names_only_paths_that_exist():
    section = _layout_section()
    paths = [p for p in re.findall(r"`([^`\s]+)`", section) if "/" in p or re.search(r"\.(py|c|h|md|sh)$", p)]
    assert len(paths) > 20, "the Layout section should map mechanisms to files"
    missing = [p for p in paths if not (REPO / p.rstrip("/")).exists()]
    assert not missing, f"docs/design.md Layout names paths that do not exist: {missing}"


def test_layout_map_covers_every_folder_and_every_part_of_the_package():
    section = _layout_section()
    named = set(re.findall(r"`([^`\s]+)`", section))
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    folders = {Path(p).parts[0] for p in tracked if len(Path(p).parts) > 1 and not p.startswith(".")}
    package_parts = {
        str(p.relative_to(REPO)) + ("/" if p.is_dir() else "")
        for p in PACKAGE.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name not in ("__init__.py", "__main__.py"))
    }
    unnamed = sorted(f"{f}/" for f in folders if f"{f}/" not in named) + sorted(package_parts - named)
    assert not unnamed, f"docs/design.md Layout does not mention: {unnamed}"
