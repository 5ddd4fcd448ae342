"""The trainer and the tools import one way: no module of trainer/ or scripts/ reaches itself again through its
imports, counting imports inside functions, under TYPE_CHECKING, and importlib.import_module of literal names."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = ("trainer", "scripts")


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: pathlib.Path, package: str | None = None) -> set[str]:
    """Every module name the file imports, relative imports resolved against its package; `from a import b` counts
    as a.b too."""
    if package is None:
        package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.add(node.args[0].value)
    return names


def import_graph() -> dict[str, set[str]]:
    files = {module_name(path): path for package in PACKAGES for path in (ROOT / package).rglob("*.py")}
    graph = {}
    for name, path in files.items():
        targets = {target for target in imported_names(path) if target in files and target != name}
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_through_others():
    found = circles(import_graph())
    assert not found, "import circles (each group imports itself through the others): " + "; ".join(
        " <-> ".join(group) for group in found
    )


def test_the_graph_sees_imports_inside_functions_and_by_literal_name(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import importlib\n\ndef later():\n    from trainer import loop\n    from . import links\n"
        "    importlib.import_module('trainer.tasks')\n"
    )
    assert {"trainer.loop", "trainer.tasks", "scripts.bench.links"} <= imported_names(probe, "scripts.bench")
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
