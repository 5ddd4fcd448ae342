"""What the room tests share: the modules a file imports, and running the quick tests of a copy of the project (a
room deleted)."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys


def imported_modules(path: pathlib.Path) -> set[str]:
    """Every module the file imports by absolute name, inside functions too; relative imports stay in their room."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            modules.add(node.module)
            # `from trainer import ps` imports the module trainer.ps too.
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def run_quick_tests(project: pathlib.Path, *tests: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The given test files of the copy, quick ones only, with the copy's own packages first on the path."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow and not image", *tests],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
