"""`make bench` as its tests run it: `python -m scripts.bench.bench` in a process of its own, at toy size."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The smallest run that still has a warm-up to leave out and timed steps after it.
TINY = ("--steps", "32", "--warmup-steps", "16", "--global-batch-size", "16")
# The async phase's: two epochs, so each run has two evaluations.
TINY_ASYNC = (
    "--async-train-examples",
    "512",
    "--async-epochs",
    "2",
    "--async-test-examples",
    "64",
    "--async-batch",
    "16",
)


def run_bench(*args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "scripts.bench.bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )
