"""A test of an optional engine skips where a fork deleted the engine's folder (k8s/engines/<engine>/)."""

from __future__ import annotations

from types import ModuleType

import pytest

from scripts.common import engine_folders


def needs(*engines: str) -> pytest.MarkDecorator:
    missing = sorted(set(engines) - set(engine_folders.names()))
    return pytest.mark.skipif(bool(missing), reason=f"the engine folders {missing} are deleted (k8s/engines/)")


def present(*pairs: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The parameters whose engine (their first item) this checkout holds."""
    return [pair for pair in pairs if pair[0] in engine_folders.names()]


def part(engine: str, module: str) -> ModuleType:
    """One module of an engine's folder (k8s/engines/<engine>/<module>.py), imported when a test uses it: the test
    skips where a fork deleted the folder, whose checks went with it."""
    if engine not in engine_folders.names():
        pytest.skip(f"the engine folder k8s/engines/{engine}/ is deleted")
    return engine_folders.part(engine, module)
