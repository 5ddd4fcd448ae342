"""Reads k8s/settings.env, the project's single source of names, paths and ports.

The file holds the defaults; a variable of the same name in the environment wins over it (make exports
its effective values, so `WORKERS=3 make submit` and `make submit WORKERS=3` both reach the scripts).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import tempfile
from collections.abc import Iterator, Mapping

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the repository
SETTINGS_FILE = ROOT / "k8s" / "settings.env"


def _check(key: str, value: str, where: str) -> None:
    if not key.isidentifier() or " " in value or '"' in value:
        raise ValueError(f"{where}: expected KEY=VALUE without quotes or spaces, got {key}={value!r}")


def load_file(path: pathlib.Path = SETTINGS_FILE) -> dict[str, str]:
    """The KEY=VALUE pairs of the settings file, in file order, without the environment."""
    settings: dict[str, str] = {}
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"{path}:{number}: expected KEY=VALUE without quotes or spaces, got {line!r}")
        _check(key, value, f"{path}:{number}")
        settings[key] = value
    return settings


def load(path: pathlib.Path = SETTINGS_FILE, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The settings file's pairs, each replaced by a non-empty environment variable of the same name."""
    environ = os.environ if environ is None else environ
    settings = load_file(path)
    for key in settings:
        if environ.get(key):
            _check(key, environ[key], f"environment variable {key}")
            settings[key] = environ[key]
    return settings


@contextlib.contextmanager
def kustomization(k8s_dir: pathlib.Path, environ: Mapping[str, str] | None = None) -> Iterator[pathlib.Path]:
    """k8s_dir, or a copy of it whose settings.env holds the environment's overrides, for kustomize to read.

    An overlay without a settings.env of its own (k8s-async/ reads its base as ../k8s) is copied beside a copy
    of the base directory that holds the project's settings, so the overrides reach it too.
    """
    settings_dir = k8s_dir if (k8s_dir / SETTINGS_FILE.name).exists() else SETTINGS_FILE.parent
    path = settings_dir / SETTINGS_FILE.name
    if not path.exists():
        yield k8s_dir
        return
    effective = load(path, environ)
    if effective == load_file(path):
        yield k8s_dir
        return
    with tempfile.TemporaryDirectory(prefix="kustomization-") as tmp:
        for directory in {k8s_dir.resolve(), settings_dir.resolve()}:
            shutil.copytree(directory, pathlib.Path(tmp) / directory.name)
        (pathlib.Path(tmp) / settings_dir.name / SETTINGS_FILE.name).write_text(
            "".join(f"{key}={value}\n" for key, value in effective.items())
        )
        yield pathlib.Path(tmp) / k8s_dir.name
