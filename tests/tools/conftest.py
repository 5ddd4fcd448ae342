"""Fixtures shared by the tools' tests."""

from __future__ import annotations

import pytest

from scripts.common import manifest


@pytest.fixture(scope="session")
def rendered_overlays() -> dict[tuple[str, str], list[dict]]:
    """Every engine folder's overlay (k8s/engines/*/sync, async) as kubectl kustomize renders it, once per session
    (with the settings file's values: tests that override settings render their own)."""
    return {
        (engine, strategy): manifest.render(manifest.overlay(engine, strategy))
        for engine in manifest.ENGINES
        for strategy in manifest.STRATEGIES
    }
