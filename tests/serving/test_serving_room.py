"""trainer/serving/ is an optional room: nothing outside it imports it, and a copy of the project without it (and
without these tests) still collects every test and trains."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import pytest

from rooms import imported_modules

ROOT = pathlib.Path(__file__).resolve().parents[2]


def imports_serving(path: pathlib.Path) -> bool:
    return any(name == "trainer.serving" or name.startswith("trainer.serving.") for name in imported_modules(path))


def test_nothing_outside_the_room_imports_it():
    outside = [
        path.relative_to(ROOT).as_posix()
        for folder in ("trainer", "scripts", "examples", "modules")
        for path in (ROOT / folder).rglob("*.py")
        if "serving" not in path.relative_to(ROOT).parts[:2] and imports_serving(path)
    ]
    assert not outside, f"{outside} import trainer/serving: only its own modules and tests may"


@pytest.mark.slow  # several processes for long: make test-slow
def test_without_the_room_every_test_collects_and_training_works(tmp_path):
    project = tmp_path / "project"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    project.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", project / "pyproject.toml")
    for name in ("trainer", "scripts", "tests", "k8s", "examples", "modules"):
        shutil.copytree(ROOT / name, project / name, ignore=ignore)
    shutil.rmtree(project / "trainer" / "serving")
    shutil.rmtree(project / "tests" / "serving")
    (project / "tests" / "helpers" / "model_server.py").unlink()
    run = {"cwd": project, "capture_output": True, "text": True, "timeout": 600}

    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"], **run
    )
    assert collected.returncode == 0, collected.stdout[-3000:]
    trained = subprocess.run(
        [sys.executable, "-m", "trainer", "--dataset", "synthetic", "--train-examples", "64", "--test-examples", "32"]
        + ["--epochs", "1", "--per-worker-batch-size", "32", "--model-dir", str(tmp_path / "model")],
        **run,
    )
    assert trained.returncode == 0, trained.stderr[-3000:]
    assert list((tmp_path / "model" / "serving").iterdir())
