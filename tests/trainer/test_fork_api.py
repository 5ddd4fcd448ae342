"""A fork's imports are one public module, trainer.api, and they keep working: the examples and the docs import
nothing else from the trainer, and forks written against earlier layouts (today's examples with the imports a fork
of that date had) still load, register their task and dataset, and build their model through the trainer's own
flags."""

from __future__ import annotations

import ast
import os
import pathlib
import re
import subprocess
import sys

import pytest

import trainer.api

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The imports the examples had on each date (git show of examples/ then): a fork written then has these lines.
IMPORTS_AS_OF = {
    "2026_12_01": """from trainer.config import Config
from trainer.data import datasets
from trainer.errors import ConfigError, DataError
from trainer.options import option
from trainer.task import Objective, Task, register""",
    "2026_12_03": """from trainer.base.errors import DataError
from trainer.data import datasets
from trainer.settings.config import Config
from trainer.settings.options import option
from trainer.task import Objective, Task, register""",
}
# An import of the trainer in a document's code: a line starting `from trainer... import` or `import trainer...`.
DOC_IMPORT = re.compile(r"^\s*(?:from\s+(trainer[\w.]*)\s+import|import\s+(trainer[\w.]*))", re.MULTILINE)


def trainer_imports(path: pathlib.Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "trainer":
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found += [alias.name for alias in node.names if alias.name.split(".")[0] == "trainer"]
    return found


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.py")), ids=lambda path: path.name)
def test_an_example_imports_only_the_fork_api_from_the_trainer(example):
    imports = trainer_imports(example)
    assert imports and set(imports) == {"trainer.api"}, f"{example.name} imports {imports}: use trainer.api"


def test_the_docs_show_forks_importing_only_the_fork_api():
    documents = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "modules" / "README.md"]
    found = {
        f"{path.relative_to(ROOT)}: {match.group(0).strip()}"
        for path in documents
        for match in DOC_IMPORT.finditer(path.read_text())
        if (match.group(1) or match.group(2)) != "trainer.api"
    }
    assert not found, f"docs show imports of trainer's internals, not trainer.api: {sorted(found)}"


def test_every_name_the_fork_api_lists_is_there():
    assert all(hasattr(trainer.api, name) for name in trainer.api.__all__)
    assert {"Task", "register", "Objective", "datasets", "option", "Config", "DataError"} <= set(trainer.api.__all__)


# Loads the fork through the trainer's own flag parsing (its module imported by --task-module and --dataset-module),
# then builds its dataset's Source and its task's model: what a training run does before the first step.
LOAD = """
import sys
from trainer.context import parse_config
from trainer.data import catalog
from trainer.task import task_of
config = parse_config(sys.argv[1:])
source = catalog.load(config)
model = task_of(config).build_model(source)
print("loaded", config.task, config.dataset, model.count_params())
"""


def fork_as_of(example: str, date: str, folder: pathlib.Path) -> str:
    """examples/EXAMPLE.py as a fork written on DATE imports the trainer; the module's name."""
    text = (ROOT / "examples" / f"{example}.py").read_text()
    (api_import,) = [line for line in text.splitlines() if line.startswith("from trainer.api import")]
    name = f"{example}_{date}"
    (folder / f"{name}.py").write_text(text.replace(api_import, IMPORTS_AS_OF[date]))
    return name


@pytest.mark.parametrize(
    "example, date, flags",
    [
        ("regression", "2026_12_01", ["--task", "regression", "--dataset", "linear_features"]),
        pytest.param(  # the quick suite's margin: the older layout of the same example stays quick
            "regression", "2026_12_03", ["--task", "regression", "--dataset", "linear_features"], marks=pytest.mark.slow
        ),
        ("tabular", "2026_12_03", ["--task", "tabular", "--dataset", "csv", "--csv-train", "rows.csv"]),
    ],
)
def test_a_fork_written_against_an_earlier_layout_still_loads_and_builds_its_model(tmp_path, example, date, flags):
    fork = fork_as_of(example, date, tmp_path)
    (tmp_path / "rows.csv").write_text("a,b,label\n" + "".join(f"{i % 7},{i % 3},{i % 2}\n" for i in range(64)))
    flags = [*flags, "--csv-test", "rows.csv"] if "--csv-train" in flags else flags
    result = subprocess.run(
        [sys.executable, "-c", LOAD, "--task-module", fork, "--dataset-module", fork, *flags],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]), "CUDA_VISIBLE_DEVICES": ""},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith(f"loaded {flags[1]} {flags[3]}"), result.stdout


# What a fork's module may import besides trainer.api: the standard library and the libraries a task is written in.
FORK_LIBRARIES = {"tensorflow", "keras", "numpy"}


def top_level_imports(path: pathlib.Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
    return found


def test_the_default_task_imports_only_what_a_fork_may_as_the_model_a_fork_copies():
    default_task = ROOT / "trainer" / "tasks" / "image_classification.py"
    outside = {
        name
        for name in top_level_imports(default_task)
        if name != "trainer.api"
        and name.split(".")[0] not in FORK_LIBRARIES
        and name.split(".")[0] not in sys.stdlib_module_names
    }
    assert not outside, (
        f"the default task imports {sorted(outside)}: a fork may import only trainer.api from the trainer"
    )
