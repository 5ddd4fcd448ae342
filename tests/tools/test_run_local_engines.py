"""run-local end to end under JobSet and Kubeflow Trainer v2: the project's overlays, the real trainer, real
processes on 127.0.0.1. Each run is small (synthetic data, one epoch of a few steps)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

import engines_here
from local_runner import job_model_dir, runner_status, wait_for_runner

ROOT = pathlib.Path(__file__).resolve().parents[2]
SMALL = ["--train-examples", "1024", "--test-examples", "256", "--threads", "1"]


def start(job_dir: pathlib.Path, console: pathlib.Path, overlay: str, *trainer_flags: str) -> subprocess.Popen:
    with console.open("w") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "scripts.localrun.run_local", "--kustomize", f"k8s/engines/{overlay}"]
            + ["--job-dir", str(job_dir), "--workers", "2", "--dataset", "synthetic", "--epochs", "1", "--"]
            + list(trainer_flags),
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
        )


def metrics(job_dir: pathlib.Path) -> dict:
    return json.loads((job_model_dir(job_dir) / "metrics.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["jobset", "trainjob"])
@pytest.mark.parametrize("strategy", ["sync", "async"])
def test_each_shape_completes_and_sync_workers_end_with_identical_weights(tmp_path, engine, strategy):
    job_dir, console = tmp_path / "job", tmp_path / "console.txt"
    proc = start(job_dir, console, f"{engine}/{strategy}", *SMALL)
    assert wait_for_runner(proc, console) == 0, console.read_text()[-5000:]
    result = runner_status(job_dir)
    assert (result["kind"], result["state"]) == ("JobSet", "Completed")
    assert result["condition"]["reason"] == "AllJobsCompleted"
    workers = "node" if engine == "trainjob" else "worker"
    text = console.read_text()
    if engine == "trainjob":
        assert "TrainJob default/multi-worker: runs as the JobSet multi-worker" in text
    if strategy == "sync":
        assert {name: r["exit_codes"] for name, r in result["replicas"].items()} == {
            f"{workers}-0": [0],
            f"{workers}-1": [0],
        }
        digests = dict(re.findall(rf"^({workers}-\d) +\| .* finished: .*weights sha256 (\w+)", text, re.M))
        assert set(digests) == {f"{workers}-0", f"{workers}-1"}, text[-3000:]
        assert len(set(digests.values())) == 1
        assert metrics(job_dir)["weights_sha256"] in digests.values()
    else:
        assert result["replicas"]["chief-0"]["exit_codes"] == [0]
        assert set(result["replicas"]) == {"chief-0", "ps-0", f"{workers}-0", f"{workers}-1", "evaluator-0"}
        assert metrics(job_dir)["strategy"] == "async"
    assert all(r["restarts"] == 0 for r in result["replicas"].values())


def live_pod(runner: subprocess.Popen, replicated_job: str, index: int) -> psutil.Process:
    """The process of a JobSet pod, found by the variables run-local gave it."""
    for child in psutil.Process(runner.pid).children():
        try:
            env = child.environ()
        except psutil.Error:
            continue
        if env.get("HOSTNAME", "").startswith(f"multi-worker-{replicated_job}-0-") and env.get(
            "JOB_COMPLETION_INDEX"
        ) == str(index):
            return child
    raise AssertionError(f"no live process for {replicated_job} {index}")


@pytest.mark.slow
def test_a_sigkilled_worker_restarts_the_group_which_resumes_and_completes_every_step(tmp_path):
    job_dir, console = tmp_path / "job", tmp_path / "console.txt"
    flags = ["--train-examples", "8192", "--test-examples", "256", "--checkpoint-every", "16", "--log-every", "16"]
    proc = start(job_dir, console, "jobset/sync", *flags)
    chief_log = job_dir / "run-local" / "logs" / "worker-0.log"
    deadline = time.monotonic() + 180
    while not (chief_log.exists() and "step 32/" in chief_log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, console.read_text()[-5000:]
        time.sleep(0.2)
    os.kill(live_pod(proc, "worker", 1).pid, signal.SIGKILL)
    assert wait_for_runner(proc, console) == 0, console.read_text()[-5000:]
    text = console.read_text()
    assert "no rule matched, the default: RestartJobSet, restart 1 (1 of maxRestarts 3)" in text
    assert "every replica has stopped; JobSet multi-worker starts them all again" in text
    result = runner_status(job_dir)
    assert result["state"] == "Completed"
    assert result["replicas"]["worker-1"]["exit_codes"][0] == 137
    # The group restarted as one: both pods were created again, once.
    assert {name: r["recreations"] for name, r in result["replicas"].items()} == {"worker-0": 1, "worker-1": 1}
    run = metrics(job_dir)
    assert run["resumed_from_step"] >= 32 and run["steps"] == run["steps_per_epoch"] == 64
    assert "resumed from" in chief_log.read_text()
    digests = set(re.findall(r"^worker-\d +\| .* finished: .*weights sha256 (\w+)", text, re.M))
    assert len(digests) == 1


@engines_here.needs("jobset")
def test_a_bad_model_flag_is_refused_before_any_pod_starts(tmp_path):
    job_dir, console = tmp_path / "job", tmp_path / "console.txt"
    proc = start(job_dir, console, "jobset/sync", *SMALL, "--model", "no-such-model")
    assert wait_for_runner(proc, console, timeout=120) == 2, console.read_text()[-5000:]
    assert "--model: unknown model 'no-such-model'" in console.read_text()
    assert not list(job_dir.glob("run-local/logs/*.log"))  # no replica started


@pytest.mark.slow
def test_a_permanent_error_in_the_trainer_fails_the_jobset_at_once_without_a_restart(tmp_path):
    # The runner's flag check passes --download; the trainer refuses it in a group of workers (exit 2).
    job_dir, console = tmp_path / "job", tmp_path / "console.txt"
    proc = start(job_dir, console, "jobset/sync", *SMALL, "--download")
    assert wait_for_runner(proc, console, timeout=120) == 1, console.read_text()[-5000:]
    result = runner_status(job_dir)
    assert result["state"] == "Failed"
    assert result["condition"]["reason"] == "FailJobSetFailurePolicyAction"
    assert result["condition"]["message"] == (
        "applying FailJobSet failure policy action (first failed job: multi-worker-worker-0)"
    )
    codes = {name: r["exit_codes"] for name, r in result["replicas"].items()}
    assert [2] in codes.values(), codes
    assert all(len(exits) <= 1 for exits in codes.values()), codes  # nothing ran twice (a stopped pod: none)
    assert all(r["recreations"] == 0 and r["restarts"] == 0 for r in result["replicas"].values())
    assert "--download in a group of workers" in console.read_text() and "RestartJobSet" not in console.read_text()
