"""Import paths a released fork used that have since moved, kept working: `from trainer.config import Config` gets
trainer.settings.config's Config. A fork updates trainer/ from upstream and never edits it (docs/design.md), so a
move must not break its imports; new forks import trainer.api, whose names never move. Installed by
trainer/__init__.py, so it holds before any fork module is imported."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
from types import ModuleType
from typing import Any

# old module -> the module that holds it now
MOVED_MODULES = {
    "trainer.config": "trainer.settings.config",
    "trainer.options": "trainer.settings.options",
    "trainer.errors": "trainer.base.errors",
    "trainer.datasets": "trainer.data.datasets",
    "trainer.artifacts.atomic_file": "trainer.base.atomic_file",
}
# (module, name) that moved out of a module which is still there -> the module that holds the name now
MOVED_NAMES = {
    ("trainer.data.datasets", "TfdsOptions"): "trainer.data.tfds",
    ("trainer.data.datasets", "RecordOptions"): "trainer.data.tfrecord",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an old module name with the module now holding it (the same object, so its registries are shared)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(name, self) if name in MOVED_MODULES else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(MOVED_MODULES[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """The module was executed under its own name."""


def install() -> None:
    if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
        sys.meta_path.append(_MovedModules())


def moved_name(module: str, name: str) -> Any:
    """For a module's __getattr__: a name that moved to another module, or AttributeError as usual."""
    holder = MOVED_NAMES.get((module, name))
    if holder is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return getattr(importlib.import_module(holder), name)
