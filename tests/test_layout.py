"""The package's shape: imports point one way, importing has no side effects, the README's map is true.

Layers, lowest first (a module may import its own layer's base modules and
anything below; subpackages of one layer do not import each other):

    0  config, validate, eventlog, jit_event, faults     names, checks and records
    1  store, native                                     checkpoint tiers; native libraries
    2  worker, doctor, plan                              where code runs / offline tools
    3  api, adapters, transparent                        the public calls; framework adapters (zero-code);
                                                         transparent mode's Python side
    4  launch, __init__                                  jit-run; the package's front door
    5  __main__                                          ``python -m jitckpt`` is ``jit-run``
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import textwrap
from pathlib import Path

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


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "_bootstrap" not in p.parts}


def _imports(path: Path, known: set[str]) -> set[str]:
    """Modules of the package that ``path`` imports anywhere (also inside functions), except under TYPE_CHECKING."""
    tree = ast.parse(path.read_text(), str(path))
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for n in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            # the most specific module of the package the name refers to
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != "jitckpt":
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    graph = {}
    for name, path in modules.items():
        targets = _imports(path, known)
        # importing a submodule of your own package is not an edge to that package's __init__
        graph[name] = {t for t in targets if t != name and not name.startswith(t + ".")}
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


def test_no_import_cycles_even_through_function_level_imports():
    cycle = find_cycle(_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


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


def _readme_layout() -> str:
    text = (REPO / "README.md").read_text()
    match = re.search(r"^## Layout\n(.*?)(?=^## |\Z)", text, flags=re.S | re.M)
    assert match, "README.md has no '## Layout' section"
    return match.group(1)


def test_readme_layout_names_only_paths_that_exist():
    section = _readme_layout()
    paths = [p for p in re.findall(r"`([^`\s]+)`", section) if "/" in p or re.search(r"\.(py|c|h|md|sh)$", p)]
    assert len(paths) > 20, "the Layout section should map mechanisms to files"
    missing = [p for p in paths if not (REPO / p.rstrip("/")).exists()]
    assert not missing, f"README Layout names paths that do not exist: {missing}"


def test_readme_layout_covers_every_folder_and_every_part_of_the_package():
    section = _readme_layout()
    named = set(re.findall(r"`([^`\s]+)`", section))
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    folders = {Path(p).parts[0] for p in tracked if len(Path(p).parts) > 1 and not p.startswith(".")}
    package_parts = {
        str(p.relative_to(REPO)) + ("/" if p.is_dir() else "")
        for p in PACKAGE.iterdir()
        if (p.is_dir() and (p / "__init__.py").exists()) or (p.suffix == ".py" and p.name not in ("__init__.py", "__main__.py"))
    }
    unnamed = sorted(f"{f}/" for f in folders if f"{f}/" not in named) + sorted(package_parts - named)
    assert not unnamed, f"README Layout does not mention: {unnamed}"
