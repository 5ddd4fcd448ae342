"""The end of a run: the summary on the console and status.json next to the logs."""

from __future__ import annotations

import pathlib
import signal
import time
from collections.abc import Mapping

from trainer.artifacts.layout import ARTIFACTS
from trainer.base.atomic_file import write_json

from .console import Console
from .operator_rules import Replica
from .supervisor import JobResult

TAIL_LINES = 20
# The trainer's refusal to resume checkpoints whose steps meant something else (trainer/artifacts/checkpoint.py).
REFUSED_CHECKPOINTS = "come from a different run setup"
SUCCESS_CONDITIONS = ("Succeeded", "Completed")  # a TFJob's, a JobSet's


def shown(path: pathlib.Path) -> str:
    """Paths under the current directory are shown relative to it."""
    try:
        return str(path.resolve().relative_to(pathlib.Path.cwd()))
    except ValueError:
        return str(path)


def leftovers(model_dir: pathlib.Path, artifacts: list[str], result: JobResult) -> str:
    """Whose the artifacts of a failed run are: written during this run (its unfinished work, from which the next run
    resumes), or before it (an earlier run's), by the newest time anything in each was written."""
    started = time.time() - result.duration_s
    earlier = [a for a in artifacts if newest_write(model_dir / a.rstrip("/")) < started]
    ours = [a for a in artifacts if a not in earlier]
    parts = [f"this run's unfinished work ({', '.join(ours)})"] if ours else []
    parts += [f"an earlier run's ({', '.join(earlier)})"] if earlier else []
    return " and ".join(parts)


def newest_write(path: pathlib.Path) -> float:
    """The newest modification time of a file, or of anything in a folder."""
    if not path.is_dir():
        return path.stat().st_mtime
    return max([path.stat().st_mtime, *(entry.stat().st_mtime for entry in path.rglob("*"))])


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
        tail = console.tail(result.failed_replica, TAIL_LINES)
        for line in tail:
            console.say(f"  {result.failed_replica} | {line.rstrip()}")
        if model_dir is not None and any(REFUSED_CHECKPOINTS in line for line in tail):
            console.say(
                f"the volume ({shown(model_dir.parent)}) holds checkpoints of another setup: start afresh with "
                f"`make run-local ... CLEAN=1` (--clean), or keep them and run under another JOB_NAME"
            )
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
        if not artifacts:
            console.say(f"model: none at {shown(model_dir)}")
        elif exit_code == 0:
            console.say(f"model: {shown(model_dir)} ({', '.join(artifacts)})")
        else:  # a failed run: what is there is its own unfinished work, or an earlier run's, never its model
            whose = leftovers(model_dir, artifacts, result)
            console.say(f"model: this run made none; {shown(model_dir)} holds {whose}")
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
