"""The engines, found from their folders: k8s/engines/<engine>/ is an engine when it holds engine.env (its kind and
facts); its overlays are <engine>/sync and <engine>/async, its install the folder's own kustomization. Adding an
engine is adding such a folder; deleting one (a fork that runs only TFJobs) leaves the others working."""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
from types import ModuleType

from .settings import ROOT

ENGINES_DIR = ROOT / "k8s" / "engines"
FACTS_FILE = "engine.env"
STRATEGIES = ("sync", "async")
DEFAULT = "tfjob"  # the template's engine, make's ENGINE default; the others are optional rooms


@dataclasses.dataclass(frozen=True)
class Engine:
    name: str
    kind: str  # the object that runs the group: TFJob, JobSet, TrainJob
    requires: tuple[str, ...]  # the engine folders this one builds on
    facts: dict[str, str]

    @property
    def folder(self) -> pathlib.Path:
        return ENGINES_DIR / self.name

    def overlay(self, strategy: str) -> pathlib.Path:
        return self.folder / strategy


def _facts(path: pathlib.Path) -> dict[str, str]:
    pairs = (line.partition("=") for line in path.read_text().splitlines() if line and not line.startswith("#"))
    return {key: value for key, _, value in pairs}


def engines(root: pathlib.Path = ENGINES_DIR) -> dict[str, Engine]:
    """Every engine folder under root, the default first, then by name."""
    found = {}
    for path in sorted(root.glob(f"*/{FACTS_FILE}"), key=lambda p: (p.parent.name != DEFAULT, p.parent.name)):
        facts = _facts(path)
        requires = tuple(name for name in facts.get("ENGINE_REQUIRES", "").split(",") if name)
        found[path.parent.name] = Engine(path.parent.name, facts["ENGINE_KIND"], requires, facts)
    return found


def names() -> tuple[str, ...]:
    return tuple(engines())


def kinds() -> dict[str, str]:
    """Each engine's kind to its name: {"TFJob": "tfjob", ...}."""
    return {engine.kind: name for name, engine in engines().items()}


def has_part(name: str, module: str) -> bool:
    """Whether the engine's folder holds this part (k8s/engines/<name>/<module>.py: local_run, customize, cluster,
    katib...)."""
    return (ENGINES_DIR / name / f"{module}.py").is_file()


def part(name: str, module: str) -> ModuleType:
    """One part of an engine's folder, imported when first asked for."""
    return importlib.import_module(f"k8s.engines.{name}.{module}")


def dependents(name: str) -> list[str]:
    """The engine and every engine that builds on it, which go when it goes."""
    found, every = [name], engines()
    for other in every.values():
        if other.name not in found and set(other.requires) & set(found):
            found.append(other.name)
    return found
