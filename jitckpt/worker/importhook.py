"""Run a function right after a named module is imported, without importing it ourselves.

``PostImportHooks`` sits first on ``sys.meta_path``.  For any module it was not
asked about it returns None at once (one dictionary look-up per import), so a
script that never imports a framework pays nothing else.  For a module it was
asked about, it lets the other finders find it and wraps the loader so that,
once the module's code has run, the hook gets the module.  A hook that fails
prints a warning; it never breaks the user's import.
"""

from __future__ import annotations

import importlib.abc
import sys
import threading
from types import ModuleType
from typing import Any, Callable, Sequence

from jitckpt.worker.console import log

Hook = Callable[[ModuleType], None]


def run_hook(hook: Hook, module: ModuleType) -> None:
    try:
        hook(module)
    except Exception as exc:  # the user's import goes on; only jitckpt's integration is lost
        log(f"warning: could not attach to {module.__name__} ({type(exc).__name__}: {exc}); "
            f"just-in-time checkpointing of this framework's training is off")


class _LoaderWithHook(importlib.abc.Loader):
    """The real loader, then the hook."""

    def __init__(self, loader: Any, hook: Hook) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        run_hook(self._hook, module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_resource_reader, ... as the real loader has them
        return getattr(self._loader, name)


class PostImportHooks(importlib.abc.MetaPathFinder):
    """A meta-path finder that calls ``hooks[name](module)`` after ``name`` is imported."""

    def __init__(self, hooks: dict[str, Hook]) -> None:
        self._hooks = dict(hooks)
        self._busy = threading.local()

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        hook = self._hooks.get(fullname)
        if hook is None or getattr(self._busy, "active", False):
            return None
        self._busy.active = True
        try:
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._busy.active = False
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _LoaderWithHook(spec.loader, hook)
        return spec


def install(hooks: dict[str, Hook]) -> None:
    """Call each hook after its module is imported (at once for a module that already is)."""
    pending = {}
    for name, hook in hooks.items():
        module = sys.modules.get(name)
        if module is not None:
            run_hook(hook, module)
        else:
            pending[name] = hook
    if pending:
        sys.meta_path.insert(0, PostImportHooks(pending))
