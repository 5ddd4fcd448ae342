"""Reads k8s/base/settings.env, the project's single source of names, paths and ports.

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
K8S_ROOT = ROOT / "k8s"
SETTINGS_FILE = K8S_ROOT / "base" / "settings.env"


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


def _settings_root(k8s_dir: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path] | None:
    """(the tree to copy, its settings file) for a kustomization: the nearest directory at or above k8s_dir that
    holds base/settings.env (k8s/ for every overlay), else k8s_dir itself when it holds a settings.env."""
    for directory in (k8s_dir, *k8s_dir.parents):
        if (directory / "base" / SETTINGS_FILE.name).exists():
            return directory, directory / "base" / SETTINGS_FILE.name
    if (k8s_dir / SETTINGS_FILE.name).exists():
        return k8s_dir, k8s_dir / SETTINGS_FILE.name
    return None


@contextlib.contextmanager
def kustomization(k8s_dir: pathlib.Path, environ: Mapping[str, str] | None = None) -> Iterator[pathlib.Path]:
    """k8s_dir, or the same directory in a copy of its tree whose settings.env holds the environment's overrides,
    for kustomize to read (an overlay reads the settings through ../../base)."""
    k8s_dir = k8s_dir.resolve()
    found = _settings_root(k8s_dir)
    if found is None:
        yield k8s_dir
        return
    tree, path = found
    effective = load(path, environ)
    if effective == load_file(path):
        yield k8s_dir
        return
    with tempfile.TemporaryDirectory(prefix="kustomization-") as tmp:
        copy = pathlib.Path(tmp) / tree.name
        shutil.copytree(tree, copy, ignore=shutil.ignore_patterns(".*"))
        (copy / path.relative_to(tree)).write_text("".join(f"{key}={value}\n" for key, value in effective.items()))
        yield copy / k8s_dir.relative_to(tree)
