"""One job followed while it runs, as a user watches it: `make status` reads the chief's live status through the
API server, a second `make submit` is refused, a worker pod deleted and a worker process SIGKILLed are each
brought back by the training operator's restart rules, the group resumes from its checkpoint, `make logs`
follows the chief to the end, and the job finishes at the step it planned.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from tests.cluster.node import (
    NAMESPACE,
    clear_model_dir,
    fetch_model,
    kubectl,
    make,
    pods,
    start_make,
    trainer_host_pid,
    wait_until,
)

pytestmark = pytest.mark.cluster

JOB = ["ENGINE=tfjob", "STRATEGY=sync", "JOB_NAME=e2e-faults"]
CHECKPOINT_EVERY = 50
# Long enough to be hit twice, with a recovery after each: three epochs of 512 steps at the group's batch of 2 x 64.
LONG_JOB = [
    "DATASET=synthetic",
    "EPOCHS=3",
    f"ARGS=--train-examples 65536 --test-examples 512 --checkpoint-every {CHECKPOINT_EVERY}",
]
TOTAL_STEPS = 3 * 512
WORKER_1 = "training.kubeflow.org/job-name=e2e-faults,training.kubeflow.org/replica-index=1"


def live_status() -> dict:
    return wait_until("the chief's live status through the API server", lambda: chief_status_now(), 600)


def chief_status_now() -> dict | None:
    printed = make("status", *JOB, check=False).stdout
    for line in printed.splitlines():
        if line.startswith("chief status: {"):
            status = json.loads(line.removeprefix("chief status: "))
            return status if status.get("state") == "running" and status.get("global_step", 0) > 0 else None
    return None


def past_a_checkpoint(restarts: int, step: int = 0) -> dict:
    """The chief's status once it runs after RESTARTS restarts and has saved a checkpoint beyond STEP."""

    def check() -> dict | None:
        status = chief_status_now()
        if status and status["restarts"] >= restarts and status["global_step"] >= step + CHECKPOINT_EVERY:
            return status
        return None

    return wait_until(f"the chief to run past a checkpoint after {restarts} restart(s)", check, 600, poll_s=3)


def running_worker_1() -> dict:
    def check() -> dict | None:
        found = [pod for pod in pods(WORKER_1) if pod["status"].get("phase") == "Running"]
        return found[0] if found and found[0]["status"].get("containerStatuses", [{}])[0].get("ready") else None

    return wait_until("worker 1 to run", check, 300)


def test_a_running_job_is_watched_refused_a_second_time_survives_two_faults_and_finishes_at_its_planned_step(
    tmp_path,
) -> None:
    make("delete", *JOB, check=False)
    clear_model_dir("e2e-faults")
    submit_log = tmp_path / "submit.log"
    submitted = start_make("submit", *JOB, *LONG_JOB, log=submit_log)
    try:
        status = live_status()
        assert status["workers"] == 2 and status["total_steps"] == TOTAL_STEPS

        again = make("submit", *JOB, *LONG_JOB, check=False)
        assert again.returncode != 0
        assert "TFJob e2e-faults is still running" in again.stdout + again.stderr

        # Fault 1: a worker pod deleted. The operator makes it again; the chief loses its peer and restarts.
        before = past_a_checkpoint(restarts=0)
        kubectl("delete", "pod", "-n", NAMESPACE, running_worker_1()["metadata"]["name"], "--wait=false")
        after_delete = past_a_checkpoint(restarts=1, step=before["global_step"])

        # Fault 2: the worker's process SIGKILLed inside its container (exit 137, which ExitCode retries).
        os.kill(trainer_host_pid(running_worker_1()), signal.SIGKILL)
        past_a_checkpoint(restarts=after_delete["restarts"] + 1, step=after_delete["global_step"])

        logs = start_make("logs", *JOB, log=tmp_path / "logs.log")
        assert submitted.wait(timeout=1200) == 0, submit_log.read_text()[-3000:]
        assert logs.wait(timeout=120) == 0, "make logs did not end with the chief"
    finally:
        if submitted.poll() is None:
            submitted.kill()
    assert "succeeded; the model is on volume" in submit_log.read_text()
    followed = (tmp_path / "logs.log").read_text()
    assert "epoch 3/3 done" in followed, followed[-2000:]

    metrics = json.loads((fetch_model(tmp_path / "artifacts", "e2e-faults") / "metrics.json").read_text())
    assert metrics["steps"] == 3 * metrics["steps_per_epoch"] == TOTAL_STEPS, "the job ends at the step it planned"
    assert metrics["restarts"] >= 2 and metrics["resumed_from_step"] >= CHECKPOINT_EVERY
    make("delete", *JOB)
