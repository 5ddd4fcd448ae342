"""The trainer's rooms: the core reads the task instead of naming a problem, and the optional room trainer/ps (the
parameter-server mode) can be deleted with the sync path, and its evaluator, still working."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from multiworker import python_prints, tf_config
from rooms import imported_modules, run_quick_tests

ROOT = pathlib.Path(__file__).resolve().parents[2]
# What only makes sense for one problem; the task files (trainer/tasks/) are where such words belong. The datasets
# (trainer/data/) describe their own examples (the synthetic set's labels and best accuracy). A method named labels
# (Prometheus's metric.labels(...)) is a metric's labels, not a problem's.
PROBLEM_WORDS = re.compile(r"\b(accuracy|logits|(?<!\.)labels)\b", re.IGNORECASE)
# The tests that exercise trainer/ps go with it.
PS_TESTS = [
    "tests/trainer/test_async.py",
    "tests/tools/test_async_manifest.py",
    "scripts/bench/tests/test_bench_async.py",
    "tests/helpers/worker_lost_in_copy.py",
]


def test_outside_the_task_files_no_trainer_module_names_a_problem():
    found = []
    for path in sorted((ROOT / "trainer").rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(("trainer/tasks/", "trainer/data/")):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if PROBLEM_WORDS.search(line):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert not found, "read the task's metric names instead:\n" + "\n".join(found)


def test_only_the_entry_point_imports_the_ps_room_and_only_for_its_roles():
    importers = sorted(
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "trainer").rglob("*.py")
        if "ps" not in path.relative_to(ROOT / "trainer").parts[:1]
        and any(name == "trainer.ps" or name.startswith("trainer.ps.") for name in imported_modules(path))
    )
    assert importers == ["trainer/__main__.py"]
    # Importing the entry point, as `python -m trainer` does before it knows the role, loads none of trainer/ps.
    code = "import sys, trainer.__main__; print(sorted(m for m in sys.modules if m.startswith('trainer.ps')))"
    assert python_prints(code, dict(os.environ)) == "[]"


def copy_without_ps(target: pathlib.Path) -> pathlib.Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    target.mkdir()
    shutil.copy2(ROOT / "pyproject.toml", target / "pyproject.toml")
    for name in ("trainer", "scripts", "tests", "k8s"):
        shutil.copytree(ROOT / name, target / name, ignore=ignore)
    shutil.rmtree(target / "trainer" / "ps")
    for test in PS_TESTS:
        (target / test).unlink()
    return target


@pytest.mark.slow  # several processes for long: make test-slow
def test_without_the_ps_room_sync_training_and_its_evaluator_work_and_a_ps_role_is_refused_clearly(tmp_path):
    project = copy_without_ps(tmp_path / "project")
    run = {"cwd": project, "capture_output": True, "text": True, "timeout": 600}
    tests = run_quick_tests(
        project,
        "tests/trainer/test_train.py",
        "tests/trainer/test_config.py",
        "tests/trainer/test_model.py",
        "tests/trainer/test_evaluator_edges.py",
    )
    assert tests.returncode == 0, tests.stdout[-3000:]

    cluster = {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}
    refused = subprocess.run(
        [sys.executable, "-m", "trainer", "--dataset", "synthetic", "--model-dir", str(tmp_path / "model")],
        env={"PATH": "/usr/bin:/bin", "TF_CONFIG": tf_config(cluster, "chief", 0)},
        **run,
    )
    assert refused.returncode == 2, refused.stderr[-3000:]
    assert "has no trainer/ps package" in refused.stderr and "restore trainer/ps" in refused.stderr


def test_every_room_is_a_package_that_git_keeps_and_the_wheel_finds():
    # A room without a tracked __init__.py (once hidden by .gitignore's artifacts/) leaves the installed wheel,
    # and so the image, without it, although an editable install still imports it as a namespace package.
    import setuptools

    rooms = {
        ".".join(path.parent.relative_to(ROOT).parts)
        for path in (ROOT / "trainer").rglob("*.py")
        if "__pycache__" not in path.parts
    }
    assert rooms <= set(setuptools.find_packages(str(ROOT), include=["trainer", "trainer.*"]))
    tracked = subprocess.run(
        ["git", "ls-files", "trainer"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    assert {f"{room.replace('.', '/')}/__init__.py" for room in rooms} <= set(tracked)


def test_every_function_in_the_trainer_reads_at_once():
    # What a forker reads whole: a longer function is split into the parts it already has (setup, loop, finish).
    import ast

    long = [
        f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for path in sorted((ROOT / "trainer").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 60
    ]
    assert long == []
