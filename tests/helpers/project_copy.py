"""A copy of the project that runs make with the venv running the tests, and never reinstalls into it."""

from __future__ import annotations

import os
import pathlib
import shutil
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
VENV = pathlib.Path(sys.executable).parent.parent
# What the venv's install stamp is made from (the Makefile's $(VENV)/.installed rule).
INSTALL_INPUTS = ("pyproject.toml", "constraints.txt")


def copy_project(
    target: pathlib.Path, files: tuple[str, ...], folders: tuple[str, ...], stamp: pathlib.Path = VENV / ".installed"
) -> pathlib.Path:
    """The named files and folders of the project in target. The copy's install inputs get the stamp's time: make
    then finds the venv installed in every make it starts (`make -o` reaches no sub-make), so none of them
    reinstalls the venv from the copy, which would point the venv's trainer at the copy for every later test."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    target.mkdir()
    for name in (*files, *INSTALL_INPUTS):
        shutil.copy2(ROOT / name, target / name)
    for name in folders:
        shutil.copytree(ROOT / name, target / name, ignore=ignore)
    if stamp.exists():  # without one, `make -o` stands in
        # In nanoseconds: the float st_mtime rounds up about half the time, and make then finds the copy newer.
        stamp_time = stamp.stat().st_mtime_ns
        for name in INSTALL_INPUTS:
            os.utime(target / name, ns=(stamp_time, stamp_time))
    return target


def venv_trainer() -> pathlib.Path:
    """Where the venv's `import trainer` leads, from outside any project folder."""
    import subprocess

    found = subprocess.run(
        [sys.executable, "-c", "import trainer; print(trainer.__file__)"],
        cwd="/",
        capture_output=True,
        text=True,
        check=True,
    )
    return pathlib.Path(found.stdout.strip()).parent
