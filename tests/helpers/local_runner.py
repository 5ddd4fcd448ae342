"""The project's local TFJob runner (python -m scripts.localrun.run_local) as a test drives it: start a job, find a
replica's process to kill, wait for the job to succeed, read what each replica printed last."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
from collections.abc import Sequence

import psutil

from multiworker import ROOT
from scripts.common import settings as project_settings


def job_model_dir(job_dir: pathlib.Path) -> pathlib.Path:
    """Where the project's manifests put the job's model in run-local's stand-in for the volume: MODEL_ROOT/JOB_NAME
    (k8s/base/trainer-pod.yaml) under the mount path."""
    settings = project_settings.load()
    model_dir = pathlib.PurePosixPath(settings["MODEL_ROOT"], settings["JOB_NAME"])
    return job_dir / model_dir.relative_to(settings["MOUNT_PATH"])


def pod_scratch_dirs(job_dir: pathlib.Path) -> list[pathlib.Path]:
    """Each pod's scratch emptyDir (its TMPDIR) as run-local keeps it."""
    return sorted((job_dir / "run-local" / "pods").glob("*/scratch"))


def start_runner(
    job_dir: pathlib.Path, scratch: pathlib.Path, runner_args: Sequence[str], trainer_args: Sequence[str]
) -> subprocess.Popen:
    """Starts run_local on the project manifest with `runner_args`, the trainer's flags after `--`, and TMPDIR in
    `scratch` (created here) so a test can see the scratch directories removed."""
    scratch.mkdir()
    runner = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "scripts.localrun.run_local",
            *runner_args,
            "--job-dir",
            str(job_dir),
            "--",
            *trainer_args,
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "TMPDIR": str(scratch)},
    )
    runner.job_dir = job_dir  # type: ignore[attr-defined]  # where finish() finds the pods' scratch dirs
    return runner


def replica(runner: subprocess.Popen, name: str) -> psutil.Process:
    """The live process of replica `name` (e.g. worker-1), found by the TF_CONFIG the runner gave it."""
    kind, index = name.rsplit("-", 1)
    for child in psutil.Process(runner.pid).children(recursive=True):
        try:
            config = json.loads(child.environ().get("TF_CONFIG", "null") or "null")
        except (psutil.Error, json.JSONDecodeError):
            continue
        if config and config["task"] == {"type": kind, "index": int(index)}:
            return child
    raise AssertionError(f"no live process for {name}")


def finish(runner: subprocess.Popen, scratch: pathlib.Path) -> str:
    output, _ = runner.communicate(timeout=300)
    assert runner.returncode == 0, output[-4000:]
    assert "Succeeded" in output
    # The pods' TMPDIR is their scratch emptyDir (the manifests'); the runner's own TMPDIR is the test's scratch.
    scratch_dirs = [scratch, *pod_scratch_dirs(getattr(runner, "job_dir", scratch))]
    left = [path / name for path in scratch_dirs for name in os.listdir(path) if name.startswith("trainer-worker-")]
    assert not left  # every worker's throw-away saves removed
    return output


def digests(output: str) -> set[str]:
    """The weights fingerprint each replica printed last."""
    found = dict(re.findall(r"(worker-\d) finished: .*weights sha256 (\w+)", output))
    assert set(found) == {"worker-0", "worker-1"}, output[-3000:]
    return set(found.values())


def wait_for_runner(proc: subprocess.Popen, console: pathlib.Path, timeout: float = 300) -> int:
    """The runner's exit code once it ends; past `timeout` it is interrupted and the test fails with its console."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=60)
        raise AssertionError(f"run-local did not finish in {timeout} s:\n{console.read_text()[-5000:]}") from None


def runner_status(job_dir: pathlib.Path) -> dict:
    """The job's final status file, as run-local writes it under the job directory."""
    return json.loads((job_dir / "run-local" / "multi-worker.status.json").read_text())
