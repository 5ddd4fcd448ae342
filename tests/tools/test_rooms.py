"""Each optional tool room can be deleted: no module or test left after a room's deletion imports it (each room on
its own, read from the sources), and a copy of the project without every one of them (scripts/bench, scripts/cluster,
scripts/pipeline, scripts/tune, scripts/versions and the tests that go with them) still imports every remaining
module, collects every test, runs a small set of quick tests, and runs run-local; every optional room design.md names
is one a test deletes."""

from __future__ import annotations

import ast
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest
import yaml

from project_copy import VENV, copy_project
from rooms import imported_modules, run_quick_tests
from scripts.common import engine_folders

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The tests that belong to a room, outside its folder, go with it.
ROOM_TESTS = {
    "bench": [],  # its tests are in scripts/bench/tests/, deleted with it
    "cluster": [
        "tests/tools/test_submit.py",
        "tests/tools/test_submit_api.py",
        "tests/tools/test_submit_engines.py",
        "tests/tools/test_engine_manifests.py",
        "tests/tools/test_cluster_scripts.py",
        "tests/tools/test_upload_images.py",
    ],
    "node": [],  # its tests are in scripts/node/tests/, deleted with it
    "pipeline": [
        "tests/serving/test_pipeline.py",
        "tests/serving/test_pipeline_submit.py",
        "tests/serving/test_cluster_pipeline.py",
        "scripts/node/tests/test_serving_pipeline.py",
    ],
    "tune": ["tests/tools/test_tune.py", "tests/tools/test_tune_space.py", "tests/tools/test_tune_cluster.py"],
    "versions": ["tests/tools/test_versions.py"],
}
# The folders a room deletes: its own, and a room built on it (the local node runs the cluster tools' installs).
ROOM_FOLDERS = {"cluster": ["scripts/cluster", "scripts/node"]}


def room_folders(room: str) -> list[str]:
    return ROOM_FOLDERS.get(room, [f"scripts/{room}"])


IMPORT_EVERY_MODULE = """
import pkgutil, importlib, scripts
names = [m.name for m in pkgutil.walk_packages(scripts.__path__, "scripts.")]
for name in names:
    importlib.import_module(name)
print(len(names))
"""


# The trainer's optional rooms, each deleted by its own test (they train without it, which these rooms' test cannot).
TRAINER_ROOM_TESTS = {
    "trainer/ps": "tests/trainer/test_trainer_rooms.py",
    "trainer/serving": "tests/serving/test_serving_room.py",
}
DESIGN_PAGE = ROOT / "docs" / "design.md"


def optional_rooms_named(page: pathlib.Path = DESIGN_PAGE) -> list[str]:
    """The folders of design.md's layer row of optional features."""
    (row,) = [line for line in page.read_text().splitlines() if line.startswith("| optional features |")]
    return [folder.rstrip("/") for folder in re.findall(r"`([\w/]+/)`", row.split("|")[2])]


def test_every_optional_room_the_docs_name_is_one_a_test_deletes():
    named = optional_rooms_named()
    assert "scripts/pipeline" in named and "trainer/ps" in named, named
    deleted_here = {folder for room in ROOM_TESTS for folder in room_folders(room)}
    deleted_here |= {f"k8s/engines/{engine}" for engine in OPTIONAL_ENGINES}  # the engine room test's
    undeleted = [
        folder
        for folder in named
        if folder not in deleted_here
        and '"' + '" / "'.join(folder.split("/")) + '"' not in read_if_there(TRAINER_ROOM_TESTS.get(folder))
    ]
    assert undeleted == [], f"docs/design.md names optional rooms no test deletes: {undeleted} (add them to ROOM_TESTS)"


def read_if_there(test: str | None) -> str:
    return (ROOT / test).read_text() if test and (ROOT / test).exists() else ""


def test_every_test_a_room_takes_with_it_is_there():
    # A test whose folder is gone went with a room (the template without its harness has no scripts/node/tests/).
    missing = [
        test
        for tests in ROOM_TESTS.values()
        for test in tests
        if (ROOT / test).parent.exists() and not (ROOT / test).exists()
    ]
    assert missing == [], f"ROOM_TESTS names tests that are gone: {missing}"


def copy_without(rooms: list[str], target: pathlib.Path) -> pathlib.Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache")
    target.mkdir()
    for name in ("pyproject.toml", "Dockerfile"):
        shutil.copy2(ROOT / name, target / name)
    for name in ("trainer", "scripts", "tests", "k8s"):
        shutil.copytree(ROOT / name, target / name, ignore=ignore)
    for path in (target / gone for room in rooms for gone in room_paths(room)):
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():  # a test inside another room's folder may be gone with it
            path.unlink()
    return target


def scripts_imports(path: pathlib.Path) -> set[str]:
    """The `scripts.<room>` packages a module imports (absolute imports; relative ones stay in the room)."""
    return {".".join(name.split(".")[:2]) for name in imported_modules(path) if name.startswith("scripts.")}


def test_no_tool_room_imports_another_rooms_internals():
    for path in sorted((ROOT / "scripts").rglob("*.py")):
        room, *inside = path.relative_to(ROOT / "scripts").parts
        if inside[:1] == ["tests"]:
            continue  # a room's own tests (the local node's suite) drive the whole project, as tests/ does
        foreign = {name for name in scripts_imports(path) if name not in ("scripts.common", f"scripts.{room}")}
        assert not foreign, f"{path.relative_to(ROOT)} imports {sorted(foreign)}: tools share only scripts/common"


def sys_path_uses(tree: ast.AST) -> list[int]:
    """The lines that reach sys.path: through the module by any name it is imported as, or `from sys import path`."""
    names = {"sys"} | {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name == "sys"
    }
    return [
        node.lineno
        for node in ast.walk(tree)
        if (
            isinstance(node, ast.Attribute)
            and node.attr == "path"
            and isinstance(node.value, ast.Name)
            and node.value.id in names
        )
        or (isinstance(node, ast.ImportFrom) and node.module == "sys" and any(a.name == "path" for a in node.names))
    ]


def test_no_module_touches_sys_path():
    for folder in ("scripts", "tests", "trainer"):
        for path in (ROOT / folder).rglob("*.py"):
            uses = sys_path_uses(ast.parse(path.read_text()))
            assert not uses, f"{path.relative_to(ROOT)}:{uses[0]} uses sys.path; import through the packages instead"


@pytest.mark.parametrize(
    "source", ["import sys\nsys.path.insert(0, 'x')", "import sys as s\ns.path.append('x')", "from sys import path"]
)
def test_the_sys_path_check_sees_every_spelling(source):
    assert sys_path_uses(ast.parse(source)) == [len(source.splitlines())]


def room_paths(room: str) -> list[str]:
    """What a room's deletion takes: its folders, and its tests outside them."""
    return [*room_folders(room), *ROOM_TESTS[room]]


def importers_of(room: str, root: pathlib.Path = ROOT) -> list[str]:
    """Each module or test left after the room's deletion that imports one of the room's packages."""
    gone = room_paths(room)
    packages = [folder.replace("/", ".") for folder in room_folders(room)]
    left = [
        path
        for folder in ("trainer", "scripts", "tests", "k8s", "examples", "modules")
        for path in sorted((root / folder).rglob("*.py"))
        if not any(f"{path.relative_to(root).as_posix()}/".startswith(f"{deleted}/") for deleted in gone)
    ]
    return [
        f"{path.relative_to(root)} imports {name}"
        for path in left
        for name in sorted(imported_modules(path))
        if any(name == package or name.startswith(f"{package}.") for package in packages)
    ]


@pytest.mark.parametrize("room", sorted(ROOM_TESTS))
def test_nothing_left_after_a_rooms_deletion_imports_it(room):
    # Each room deleted on its own, read from the sources; the copy below deletes them all and runs what is left.
    importers = importers_of(room)
    assert importers == [], f"deleting scripts/{room} breaks {importers[:5]}: move them into the room or its ROOM_TESTS"


def test_the_import_check_finds_a_test_left_behind(tmp_path):
    (tmp_path / "scripts" / "tune").mkdir(parents=True)
    (tmp_path / "scripts" / "tune" / "study.py").write_text("import scripts.tune.space\n")
    (tmp_path / "tests" / "tools").mkdir(parents=True)
    (tmp_path / "tests" / "test_left.py").write_text("from scripts.tune import study\nimport scripts.tunes\n")
    (tmp_path / "tests" / "tools" / "test_tune.py").write_text("import scripts.tune\n")  # in ROOM_TESTS: goes too
    assert importers_of("tune", tmp_path) == [
        "tests/test_left.py imports scripts.tune",
        "tests/test_left.py imports scripts.tune.study",
    ]


@pytest.mark.slow  # several processes for long: make test-slow
def test_the_project_works_without_its_optional_rooms(tmp_path):
    project = copy_without(sorted(ROOM_TESTS), tmp_path / "project")
    run = {"cwd": project, "capture_output": True, "text": True, "timeout": 300}

    imported = subprocess.run([sys.executable, "-c", IMPORT_EVERY_MODULE], **run)
    assert imported.returncode == 0, imported.stderr[-3000:]

    # Every remaining test module still imports: none of the rooms' tests was left behind.
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"], **run
    )
    assert collected.returncode == 0, collected.stdout[-3000:]

    tests = run_quick_tests(project, "tests/trainer/test_config.py", "tests/tools/test_run_local_manifest.py")
    assert tests.returncode == 0, tests.stdout[-3000:]

    # run-local end to end on a one-replica job.
    job = {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "solo"},
        "spec": {
            "tfReplicaSpecs": {
                "Worker": {
                    "replicas": 1,
                    "restartPolicy": "Never",
                    "template": {
                        "spec": {
                            "containers": [
                                {
                                    "name": "tensorflow",
                                    "image": "img",
                                    "command": ["python", "-c", "print('replica ran')"],
                                }
                            ]
                        }
                    },
                }
            }
        },
    }
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(job))
    local = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.localrun.run_local",
            "--manifest",
            str(tmp_path / "job.yaml"),
            "--job-dir",
            str(tmp_path / "job"),
        ],
        **run,
    )
    assert local.returncode == 0, local.stdout[-3000:] + local.stderr[-3000:]
    assert "replica ran" in local.stdout and "Succeeded" in local.stdout


def test_lint_reads_every_room_and_skips_only_the_measured_results():
    listed = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--show-files", "."], cwd=ROOT, capture_output=True, text=True
    )
    assert listed.returncode == 0, listed.stderr[-2000:]
    checked = {pathlib.Path(line.strip()).relative_to(ROOT) for line in listed.stdout.splitlines() if line.strip()}
    rooms = [room for room in (ROOT / "scripts").iterdir() if room.is_dir() and not room.name.startswith("__")]
    for folder in ("trainer", *(f"scripts/{room.name}" for room in rooms)):  # no __pycache__
        sources = {path.relative_to(ROOT) for path in (ROOT / folder).rglob("*.py")}
        assert sources and sources <= checked, f"make lint skips {sorted(sources - checked)[:5]}"
    assert not [path for path in checked if path.parts[0] == "bench"]


# The harness's rooms (docs/verification.md): each one folder holding its scripts, settings, make targets, release
# records and tests; what its deletion takes from `make help`, and the runs-here text its pins leave on the versions
# page.
HARNESS_ROOMS = {
    "node": (("cluster-up", "cluster-down", "test-cluster"), "local node"),
    # bench-tools first: the one probed must not also be a path (bench/ holds the results, so make finds `bench` done).
    "bench": (("bench-tools", "bench", "bench-serving", "bench-floor"), "bench tools"),
}


def without_harness_rooms(tmp_path: pathlib.Path, *rooms: str) -> pathlib.Path:
    """A copy of the project with the rooms' folders deleted as a fork would, and the versions page printed again
    (its table lists a deleted room's pins until then, and its test says so)."""
    # bench/ holds the measured results the docs show: the figures stay when the programs go.
    folders = ("trainer", "scripts", "tests", "k8s", "docs", "examples", "modules", "bench")
    files = ("Makefile", "Dockerfile", "README.md", "checkov-constraints.txt", ".dockerignore", ".gitignore")
    project = copy_project(tmp_path / "project", files, folders)
    for room in rooms:
        shutil.rmtree(project / "scripts" / room)
    table = subprocess.run(
        [sys.executable, "-m", "scripts.versions.versions", "--markdown"], cwd=project, capture_output=True, text=True
    )
    assert table.returncode == 0, table.stderr
    page = project / "docs" / "versions.md"
    page.write_text(page.read_text().split("| component |")[0] + table.stdout)
    # A fork is a git repository: the image is tagged by its revision, and tests ask git what it keeps.
    git = ["git", "-c", "user.name=fork", "-c", "user.email=fork@example.com"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "fork"]):
        subprocess.run([*git, *command], cwd=project, check=True, capture_output=True)
    (project / ".venv").symlink_to(VENV)  # some tests run .venv/bin/python, as make does
    return project


# -o: the venv running this test is the one installed (and its checkov venv); make must not reinstall into it.
MAKE_IN_A_COPY = ["make", "-o", f"{VENV}/.installed", "-o", f"{VENV}/checkov/.installed", f"VENV={VENV}"]


@pytest.mark.slow  # copies the project and runs make: make test-slow
@pytest.mark.parametrize("room", sorted(HARNESS_ROOMS))
def test_a_deleted_harness_room_takes_its_targets_its_pins_and_its_tools_with_it(tmp_path, room):
    targets, runs_here = HARNESS_ROOMS[room]
    project = without_harness_rooms(tmp_path, room)
    run = {"cwd": project, "capture_output": True, "text": True, "timeout": 120}

    listed = subprocess.run([*MAKE_IN_A_COPY, "help"], **run)
    assert listed.returncode == 0, listed.stderr
    names = {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}
    assert {"run-local", "submit", "k3d-up", "test", "test-slow"} <= names and not names & set(targets)
    gone = subprocess.run([*MAKE_IN_A_COPY, targets[0]], **run)
    assert gone.returncode != 0 and f"No rule to make target '{targets[0]}'" in gone.stderr
    planned = subprocess.run([*MAKE_IN_A_COPY, "-n", "test-slow"], **run)
    assert planned.returncode == 0 and f"scripts.{room}" not in planned.stdout, planned.stdout + planned.stderr
    versions = (project / "docs" / "versions.md").read_text()
    assert not re.search(rf"\| {runs_here}( \([^)]*\))? \|$", versions, re.MULTILINE), versions


# What deleting the harness can change: make's targets, the settings, docs, manifests and versions (tests/tools/), and
# a test elsewhere that names a harness room (its folder, or the first of its targets); every other test must still
# import.
HARNESS_NAMES = re.compile(
    rf"scripts[./]({'|'.join(HARNESS_ROOMS)})\b|"
    + "|".join(re.escape(targets[0]) for targets, _ in HARNESS_ROOMS.values())
)


def harness_affected_tests(project: pathlib.Path) -> list[str]:
    named = [
        path.relative_to(project).as_posix()
        for path in sorted((project / "tests").rglob("test_*.py"))
        if path.parent.name != "tools" and HARNESS_NAMES.search(path.read_text())
    ]
    return ["tests/tools", *named]


@pytest.mark.slow  # make test's affected part and a two-worker run-local in a copy: make test-slow
def test_the_template_passes_make_test_and_runs_without_the_harness(tmp_path):
    """The harness apart from the template: with the local node and the benches deleted, every test module imports,
    make test passes on the tests that the deletion can change (the k3d path's offline checks among them) and make
    run-local trains two workers."""
    project = without_harness_rooms(tmp_path, *HARNESS_ROOMS)
    # The limit stops a hang: beside the cluster suite, on 2 CPUs, this run once took over 900 s.
    run = {"cwd": project, "capture_output": True, "text": True, "timeout": 1800}

    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"], **run
    )
    assert collected.returncode == 0, collected.stdout[-3000:]
    affected = harness_affected_tests(project)
    assert "tests/trainer/test_trainer_rooms.py" in affected, affected  # the selection sees a room named outside tools
    environment = {**os.environ, "PYTEST_ADDOPTS": " ".join(affected)}
    tested = subprocess.run([*MAKE_IN_A_COPY, "test"], **run, env=environment)
    assert tested.returncode == 0, tested.stdout[-5000:] + tested.stderr[-2000:]
    assert re.search(r"=+ \d+ passed", tested.stdout), tested.stdout[-2000:]

    job = ["run-local", "DATASET=synthetic", "EPOCHS=1", "ARGS=--train-examples 256 --test-examples 64"]
    trained = subprocess.run([*MAKE_IN_A_COPY, *job], **run)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    assert (project / "runs/multi-worker/models/multi-worker/metrics.json").is_file(), trained.stdout[-3000:]


# The optional engines: each k8s/engines/<engine>/ with an engine.env but the default's. Deleting one deletes the
# engines built on it (engine.env's ENGINE_REQUIRES); the template's checks below must still pass without them.
OPTIONAL_ENGINES = [name for name in engine_folders.names() if name != engine_folders.DEFAULT]
TEMPLATE_CHECKS = (
    "tests/tools/test_engine_folders.py",
    "tests/tools/test_engine_manifests.py",  # each engine's admission rules and CRDs, from its folder
    "tests/tools/test_submit_engines.py",  # each engine's part of make submit, from its folder
    "tests/tools/test_cluster_scripts.py",  # make k3d-up with the engines that are left
    "tests/tools/test_overlays.py",
    "tests/tools/test_manifests.py",
    "tests/tools/test_run_local_manifest.py",
    "tests/trainer/test_config.py",
    "scripts/node/tests/test_node_scripts.py",  # the local node builds only the engines left (the copy keeps the node)
)


# Training runs the default engine, which these deletions leave as it is: the harness test above trains it once.
@pytest.mark.slow  # copies the project, collects every test and runs the template's checks: make test-slow
@pytest.mark.parametrize("engine", OPTIONAL_ENGINES)
def test_the_template_renders_and_passes_its_checks_without_an_optional_engine(tmp_path, engine):
    project = without_harness_rooms(tmp_path)
    gone = engine_folders.dependents(engine)
    for name in gone:
        shutil.rmtree(project / "k8s" / "engines" / name)
    run = {"cwd": project, "capture_output": True, "text": True, "timeout": 600}

    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"], **run
    )
    assert collected.returncode == 0, collected.stdout[-3000:]
    refused = subprocess.run([*MAKE_IN_A_COPY, "-n", "run-local", f"ENGINE={engine}"], **run)
    assert refused.returncode != 0 and f"ENGINE={engine} is not an engine" in refused.stderr, refused.stderr
    tests = run_quick_tests(project, *TEMPLATE_CHECKS)
    assert tests.returncode == 0, tests.stdout[-5000:]
    assert re.search(r"\d+ passed", tests.stdout) and "error" not in tests.stdout.splitlines()[-1], tests.stdout
