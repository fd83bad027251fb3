# Copyright 2026 treetune-verl contributors
#
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
"""Post-import hooks: run a callback right after a module has been executed, without importing it early.

Standard library only, so that importing it from inside ``import verl`` (a plugin, an external module) stays light.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable
from types import ModuleType

_LOCK = threading.RLock()

_PENDING_HOOKS: dict[str, list[Callable[[ModuleType], None]]] = {}


class _HookedLoader(importlib.abc.Loader):
    """Wraps a module's real loader; after the module body ran, restores the real loader and runs the hooks."""

    def __init__(self, loader: importlib.abc.Loader, fullname: str):
        self._loader = loader
        self._fullname = fullname

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        module.__loader__ = self._loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self._loader
        with _LOCK:
            hooks = _PENDING_HOOKS.pop(self._fullname, [])
        for hook in hooks:
            hook(module)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder that only intervenes for module names with pending hooks."""

    def find_spec(self, fullname, path, target=None):
        if fullname not in _PENDING_HOOKS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _HookedLoader(spec.loader, fullname)
        return spec


_FINDER = _PostImportFinder()


def _still_importing(module: ModuleType) -> bool:
    """True while the module's body is still running (importlib marks its spec until the body has finished)."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def run_after_import(module_name: str, hook: Callable[[ModuleType], None]) -> None:
    """Call ``hook(module)`` once ``module_name`` is imported: now if it already is, else right after its import.

    A module whose body is still running counts as not imported yet: the hook runs when the body has finished,
    provided the module's import started after a hook for it was registered (see :func:`watch`).

    Args:
        module_name: fully qualified module name, e.g. ``"verl.workers.rollout.base"``.
        hook: called with the module object; must be idempotent.
    """
    module = sys.modules.get(module_name)
    if module is not None and not _still_importing(module):
        hook(module)
        return
    with _LOCK:
        _PENDING_HOOKS.setdefault(module_name, []).append(hook)
        if _FINDER not in sys.meta_path:
            sys.meta_path.insert(0, _FINDER)


def _nothing(module: ModuleType) -> None:
    return None


def watch(module_name: str) -> None:
    """Be told when ``module_name`` finishes importing, so that hooks registered while its body runs still run.

    verl creates its platform on the first device query, which can come from inside the body of a module that
    verl-cpu patches; the hooks registered then run when that body has finished. Does nothing by itself.
    """
    if module_name not in sys.modules:
        run_after_import(module_name, _nothing)
