"""The project copies that slow tests run make in never reinstall the venv running the tests (a reinstall from a copy
points the venv's trainer at it, and every later test imports the copy)."""

from __future__ import annotations

import os
import subprocess

from project_copy import copy_project

# A time whose float seconds round up past it: the copy once took its inputs' time from st_mtime and was newer.
ROUNDS_UP_NS = 1_764_820_800_123_456_863


def test_make_finds_the_venv_installed_in_a_copy_made_just_after_the_install(tmp_path):
    venv = tmp_path / "venv"
    venv.mkdir()
    stamp = venv / ".installed"
    stamp.touch()
    os.utime(stamp, ns=(ROUNDS_UP_NS, ROUNDS_UP_NS))
    project = copy_project(tmp_path / "project", files=("Makefile",), folders=(), stamp=stamp)
    # make -q: exit 0 when the target is up to date, 1 when a make would rebuild it (here: reinstall the venv).
    up_to_date = subprocess.run(["make", "-q", f"VENV={venv}", f"{venv}/.installed"], cwd=project, capture_output=True)
    assert up_to_date.returncode == 0, "a make in the copy would reinstall the venv from the copy"
