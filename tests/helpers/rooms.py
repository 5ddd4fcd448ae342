"""Running the quick tests of a copy of the project (a room deleted), as the room tests do."""

from __future__ import annotations

import pathlib
import subprocess
import sys


def run_quick_tests(project: pathlib.Path, *tests: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """The given test files of the copy, quick ones only, with the copy's own packages first on the path."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not slow and not image", *tests],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
