"""`python -m MODULE ARGS` run to its end from the project root, its output captured as text: how a test runs one of
the project's commands as a user would."""

from __future__ import annotations

import pathlib
import subprocess
import sys
from collections.abc import Mapping

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run_module(module: str, *args: str, env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(env),
    )
