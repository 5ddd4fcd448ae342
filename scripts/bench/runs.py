"""What every bench phase shares: the error that stops a bench, the runs' environment, the CPU meter, spreads."""

from __future__ import annotations

import os
import pathlib
import statistics
from typing import Any

from scripts.common.processes import inherited_environment
from scripts.common.settings import ROOT


class BenchError(RuntimeError):
    """A run failed or the settings cannot work; the message says which and where its logs are."""


def clean_environment() -> dict[str, str]:
    """This shell's environment minus anything that would change what a run does."""
    env = inherited_environment()
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def busy_cpu_seconds() -> float:
    """CPU time the whole machine has spent busy since boot (every process, every core)."""
    import psutil

    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def log_tail(path: pathlib.Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def spread(values: list[float]) -> dict[str, Any]:
    median = statistics.median(values)
    return {
        "median": median,
        "min": min(values),
        "max": max(values),
        "spread_percent": 100 * (max(values) - min(values)) / median if median else None,
        "values": values,
    }
