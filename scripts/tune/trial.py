"""One trial: the real job, run by run-local as `make run-local` runs it, under its own JOB_NAME (so its own volume,
model dir and ports), its output in a log file. While it runs, the test figure the chief reports at each epoch's end
(status.json) goes to the pruner; a pruned or interrupted trial's job is stopped as Ctrl-C stops run-local.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence

from scripts.common.processes import spawn
from scripts.common.settings import LOCAL_RUNS, ROOT, local_model_dir

POLL_SECONDS = 1.0
STOP_GRACE_SECONDS = 60  # run-local stops its replicas within their own grace period


@dataclasses.dataclass(frozen=True)
class TrialJob:
    job_name: str
    job_dir: pathlib.Path  # run-local's volume for the job
    model_dir: pathlib.Path
    log: pathlib.Path

    @classmethod
    def named(cls, job_name: str, settings: dict[str, str], log_dir: pathlib.Path) -> TrialJob:
        model_dir = local_model_dir(job_name, settings)
        return cls(job_name, LOCAL_RUNS / job_name, model_dir, log_dir / f"{job_name}.log")


@dataclasses.dataclass
class Ending:
    """How a trial's job ended: its objective value (it succeeded), pruned, or failed with the reason."""

    value: float | None = None
    pruned: bool = False
    reason: str = ""


def run(
    job: TrialJob,
    run_local_args: Sequence[str],
    trainer_args: Sequence[str],
    objective_key: str,
    epoch_done: Callable[[int, float], bool],
    stop: threading.Event,
) -> Ending:
    """Runs the job to its end. epoch_done(epoch, test value) says whether to prune it now; stop set: interrupted."""
    argv = [sys.executable, "-m", "scripts.localrun.run_local", *run_local_args, "--clean", "--", *trainer_args]
    env = {**os.environ, "JOB_NAME": job.job_name}
    job.log.parent.mkdir(parents=True, exist_ok=True)
    status_path = job.model_dir / "status.json"
    reported = 0
    with open(job.log, "w") as log:
        process = spawn(argv, env, str(ROOT), output=log)
        while process.poll() is None:
            time.sleep(POLL_SECONDS)
            status = _read(status_path)
            epoch, value = status.get("tested_epoch"), status.get(objective_key)
            if isinstance(epoch, int) and epoch > reported and isinstance(value, int | float):
                reported = epoch
                # The last epoch's figure is the trial's result: stopping it then would only lose its model.
                last = isinstance(status.get("epochs"), int) and epoch >= status["epochs"]
                if epoch_done(epoch, float(value)) and not last:
                    _stop(process)
                    return Ending(pruned=True, reason=f"pruned after epoch {epoch} ({objective_key} {value:.4g})")
            if stop.is_set():
                _stop(process)
                return Ending(reason="interrupted: the tuner was stopped during this trial")
    if process.returncode == 0:
        value = _read(job.model_dir / "metrics.json").get(objective_key)
        if isinstance(value, int | float):
            return Ending(value=float(value))
        return Ending(reason=f"the job succeeded but its metrics.json has no {objective_key}")
    return Ending(reason=failure_reason(job, process.returncode))


def failure_reason(job: TrialJob, code: int) -> str:
    """What the chief recorded (its state, error and exit code), else the failed replica's error line (the data
    check's or the trainer's, from the log run-local's status names), else run-local's last line."""
    status = _read(job.model_dir / "status.json")
    if status.get("error"):
        return f"{status.get('state', 'failed')}, exit {status.get('exit_code')}: {status['error']}"
    for ended in sorted((job.job_dir / "run-local").glob("*.status.json")):  # the data Job's and the group's
        record = _read(ended)
        replica = (record.get("replicas") or {}).get(record.get("failed_replica"))
        try:
            line = error_line(pathlib.Path(replica["log"]).read_text(errors="replace"))
        except (OSError, KeyError, TypeError):
            continue  # no failed replica in this job, or its log is gone
        if line:
            return f"{record['failed_replica']} exit {replica.get('last_exit')}: {line} (log: {shown(job.log)})"
    lines = [line for line in job.log.read_text(errors="replace").splitlines() if line.strip()]
    last = lines[-1] if lines else "(no output)"
    return f"run-local exit {code}: {last} (log: {shown(job.log)})"


def error_line(text: str) -> str:
    """Why a replica failed, from its output or termination message: its own last `error: ...` line (the trainer
    and the data check print one, and the trainer writes it as its termination message), else the last line that
    names an error; empty when none does."""
    lines = [line.strip() for line in text.splitlines() if "error" in line.lower()]
    own = [line for line in lines if line.startswith("error:")]
    return (own or lines or [""])[-1]


def shown(path: pathlib.Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM to run-local, which stops the job's replicas as Ctrl-C does; SIGKILL if it does not end."""
    process.terminate()
    try:
        process.wait(STOP_GRACE_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _read(path: pathlib.Path) -> dict:
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}  # not written yet (the chief writes it atomically)
    return record if isinstance(record, dict) else {}
