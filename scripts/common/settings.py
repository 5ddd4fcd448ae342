"""Reads k8s/settings.env, the project's single source of names, paths and ports."""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository
SETTINGS_FILE = ROOT / "k8s" / "settings.env"


def load(path: pathlib.Path = SETTINGS_FILE) -> dict[str, str]:
    """Returns the KEY=VALUE pairs of the settings file, in file order."""
    settings: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.isidentifier() or " " in value or '"' in value:
            raise ValueError(f"{path}:{number}: expected KEY=VALUE without quotes or spaces, got {line!r}")
        settings[key] = value
    return settings
