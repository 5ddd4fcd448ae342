"""The trainer's rooms stand in layers, and imports only run down them: file by file and folder by folder, counting
imports inside functions and under TYPE_CHECKING (test_import_graph's reading). A room is a folder of trainer/ or a
file at its top; an entry point (a `__main__`) is assembly and stands above them all. docs/design.md says why each
room stands where it does.

`python tests/tools/test_layers.py [ROOT]` prints the imports that run back up, per file and per folder, for a
checkout at ROOT (this one by default): the figures the test holds at zero.
"""

from __future__ import annotations

import pathlib
import sys

from test_import_graph import ROOT, imported_names

# Bottom to top; a room may import rooms on its own layer or below it.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("trainer", "trainer.moved", "trainer.base"),  # the package, the old import paths, the ground floor
    ("trainer.settings",),  # the option mechanism and the core knobs
    ("trainer.data",),  # what an example is and how a worker reads its part
    ("trainer.task",),  # what is learned, built for the data
    ("trainer.api",),  # what a fork imports
    ("trainer.tasks",),  # the built-in task
    ("trainer.step",),  # one step of a task on a batch
    ("trainer.artifacts",),  # what a run persists
    ("trainer.reporting",),  # what a run tells its operator
    ("trainer.distribution",),  # the group, and how calls of steps run on it
    ("trainer.optimizer",),
    ("trainer.context",),  # the run's settings, resolved once
    ("trainer.ps",),  # the optional parameter-server room
    ("trainer.evaluator",),
    ("trainer.loop",),
    ("trainer.serving",),  # the optional serving room
)
ENTRY_POINT = len(LAYERS)  # every __main__: assembly, above every room


def room(module: str) -> str:
    """The room a module of trainer/ stands in: its folder, or itself at the top of trainer/."""
    return ".".join(module.split(".")[:2])


def layer(module: str) -> int:
    if module.rpartition(".")[2] == "__main__":
        return ENTRY_POINT
    for index, rooms in enumerate(LAYERS):
        if room(module) in rooms:
            return index
    raise LookupError(f"{module} stands in no layer: add its room to LAYERS in {__file__} and to docs/design.md")


def trainer_graph(root: pathlib.Path = ROOT) -> dict[str, set[str]]:
    """Every module of root/trainer and the modules of trainer/ it imports."""
    files = {}
    for path in (root / "trainer").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = {target for target in imported_names(path, package) if target in files and target != name}
    return graph


def back_up_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) for each file's import of a module on a higher layer than its own."""
    return sorted(
        (source, target) for source, targets in graph.items() for target in targets if layer(target) > layer(source)
    )


def back_up_rooms(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(room, room) for each room that imports a room above it, through any of its files."""
    return sorted({(room(source), room(target)) for source, target in back_up_imports(graph)})


def test_no_file_imports_one_on_a_higher_layer():
    found = back_up_imports(trainer_graph())
    assert not found, "imports that run back up a layer (move the code down, or hand it in from above): " + "; ".join(
        f"{source} -> {target}" for source, target in found
    )


def test_no_room_imports_one_above_it():
    found = back_up_rooms(trainer_graph())
    assert not found, "rooms importing a room above them: " + "; ".join(f"{a} -> {b}" for a, b in found)


def test_every_module_of_the_trainer_stands_in_a_layer():
    for module in trainer_graph():
        layer(module)


def test_an_import_back_up_is_seen_by_file_and_by_room():
    graph = {
        "trainer.data.inputs": {"trainer.distribution.collectives", "trainer.base.errors"},
        "trainer.data.images": {"trainer.distribution.cluster"},
        "trainer.data.__main__": {"trainer.reporting.report"},  # an entry point may import any room
        "trainer.distribution.collectives": {"trainer.data.datasets"},
    }
    assert back_up_imports(graph) == [
        ("trainer.data.images", "trainer.distribution.cluster"),
        ("trainer.data.inputs", "trainer.distribution.collectives"),
    ]
    assert back_up_rooms(graph) == [("trainer.data", "trainer.distribution")]


if __name__ == "__main__":
    graph = trainer_graph(pathlib.Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT)
    files, rooms = back_up_imports(graph), back_up_rooms(graph)
    print(f"{len(files)} imports back up a layer, file by file:", *(f"  {a} -> {b}" for a, b in files), sep="\n")
    print(f"{len(rooms)} rooms import one above them:", *(f"  {a} -> {b}" for a, b in rooms), sep="\n")
