"""The end of a run: the summary on the console and status.json next to the logs."""

from __future__ import annotations

import pathlib
import signal
from collections.abc import Mapping

from trainer.artifacts.atomic_file import write_json
from trainer.artifacts.layout import ARTIFACTS

from .console import Console
from .operator_rules import Replica
from .supervisor import JobResult

TAIL_LINES = 20
SUCCESS_CONDITIONS = ("Succeeded", "Completed")  # a TFJob's, a JobSet's


def shown(path: pathlib.Path) -> str:
    """Paths under the current directory are shown relative to it."""
    try:
        return str(path.resolve().relative_to(pathlib.Path.cwd()))
    except ValueError:
        return str(path)


def outcome(result: JobResult) -> tuple[str, int]:
    """The job's state in one word, and the runner's exit code for it."""
    if result.stop_signal is not None:
        return f"Stopped by {signal.Signals(result.stop_signal).name}", 128 + result.stop_signal
    if result.condition is None:
        return "NoOutcome", 1
    return result.condition.type, 0 if result.condition.type in SUCCESS_CONDITIONS else 1


def replica_phase(replica: Replica, result: JobResult) -> str:
    return "Stopped" if replica.name in result.stopped else replica.phase


def summarize(
    kind: str,
    namespace: str,
    job: str,
    result: JobResult,
    replicas: Mapping[str, Replica],
    console: Console,
    model_dir: pathlib.Path | None,
    status_file: pathlib.Path,
) -> int:
    state, exit_code = outcome(result)
    if state == "Failed" and result.failed_replica:
        log = shown(console.log_path(result.failed_replica))
        console.say(f"last {TAIL_LINES} lines of {result.failed_replica}'s log ({log}):")
        for line in console.tail(result.failed_replica, TAIL_LINES):
            console.say(f"  {result.failed_replica} | {line.rstrip()}")
    message = f" ({result.condition.message})" if result.condition is not None else ""
    console.say(f"{kind} {namespace}/{job}: {state} after {result.duration_s:.1f} s{message}")
    rows = [("replica", "phase", "exit code", "restarts", "log")]
    for name, replica in replicas.items():
        last = result.last_exit.get(name)
        rows.append(
            (
                name,
                replica_phase(replica, result),
                "-" if last is None else str(last),
                str(replica.restarts),
                shown(console.log_path(name)),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        console.say("  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    artifacts = []
    if model_dir is not None:
        artifacts = [a + ("/" if (model_dir / a).is_dir() else "") for a in ARTIFACTS if (model_dir / a).exists()]
        console.say(
            f"model: {shown(model_dir)} ({', '.join(artifacts)})" if artifacts else f"model: none at {shown(model_dir)}"
        )
    status = {
        "kind": kind,
        "namespace": namespace,
        "name": job,
        "state": state,
        "exit_code": exit_code,
        "condition": None
        if result.condition is None
        else {"type": result.condition.type, "reason": result.condition.reason, "message": result.condition.message},
        "duration_s": round(result.duration_s, 3),
        "failed_replica": result.failed_replica,
        "replicas": {
            name: {
                "phase": replica_phase(r, result),
                "exit_codes": r.exit_codes,
                "last_exit": result.last_exit.get(name),
                "restarts": r.restarts,
                "in_place_restarts": r.in_place_restarts,
                "recreations": r.recreations,
                "log": str(console.log_path(name)),
            }
            for name, r in replicas.items()
        },
        "model_dir": None if model_dir is None else str(model_dir),
        "model_artifacts": artifacts,
    }
    write_json(str(status_file), status, sort_keys=False)
    return exit_code
