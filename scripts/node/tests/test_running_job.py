"""One job followed while it runs, as a user watches it: `make status` reads the chief's live status (a port-forward
to its pod), a second `make submit` is refused, a worker process SIGKILLed and then one sent SIGTERM inside their
containers are brought back by the training operator's restart rules (SIGTERM: the group checkpoints and exits 143,
which ExitCode retries), the group resumes from its checkpoint, `make logs` follows the chief to the end, and the
job finishes at the step it planned. Under JobSet, a worker pod deleted restarts the group, which resumes and
finishes as planned.

A TFJob worker pod *deleted* fails the TFJob instead: training operator v1.9.4 counts a Running pod with a
deletionTimestamp as a failed replica before the trainer's 143 arrives, whatever the restartPolicy (pkg/core/status.go,
pkg/controller.v1/tensorflow/tfjob_controller.go at v1.9.4; kubeflow/trainer#1560, #2124). What docs/cluster.md tells
the user to do then, `make submit` again, resumes from the checkpoint and finishes as planned: tested here too.

The faults are timed from the chief's status.json, read on the node's disk: `make status` is too slow a clock.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from scripts.node.tests.node import (
    LONG_JOB,
    NAMESPACE,
    ONE_EPOCH_JOB,
    STEPS_PER_EPOCH,
    TOTAL_STEPS,
    chief_status,
    clear_model_dir,
    fetch_model,
    kubectl,
    make,
    pods,
    running_past,
    start_make,
    trainer_host_pid,
    wait_until,
)

pytestmark = pytest.mark.cluster

JOB_NAME = "e2e-faults"
JOB = ["ENGINE=tfjob", "STRATEGY=sync", f"JOB_NAME={JOB_NAME}"]
WORKER_1 = f"training.kubeflow.org/job-name={JOB_NAME},training.kubeflow.org/replica-index=1"


def running_worker_1(selector: str = WORKER_1) -> dict:
    def check() -> dict | None:
        for pod in pods(selector):
            statuses = pod["status"].get("containerStatuses") or [{}]
            if pod["status"].get("phase") == "Running" and statuses[0].get("ready"):
                return pod
        return None

    return wait_until("worker 1 to run", check, 300, poll_s=0.5)


def test_a_running_job_is_watched_refused_a_second_time_survives_a_killed_worker_and_finishes_at_its_planned_step(
    tmp_path,
) -> None:
    make("delete", *JOB, check=False)
    clear_model_dir(JOB_NAME)
    submit_log = tmp_path / "submit.log"
    submitted = start_make("submit", *JOB, *LONG_JOB, log=submit_log)
    try:
        first = running_past(restarts=0, step=0, job_name=JOB_NAME)
        # make status: the chief's live status, through a port-forward to the chief, on either node.
        live = chief_status(*JOB)
        assert live is not None, "make status shows no chief status"
        assert live["state"] == "running" and live["total_steps"] == TOTAL_STEPS and live["workers"] == 2

        # A second submit of the running job is refused (make() takes the image as built: rebuilding it would take
        # longer than the job has left on a fast machine).
        again = make("submit", *JOB, *LONG_JOB, check=False)
        assert again.returncode != 0
        assert f"TFJob {JOB_NAME} is still running" in again.stdout + again.stderr

        # The fault: the worker's process SIGKILLed inside its container (exit 137, which ExitCode retries). The chief
        # loses its peer and restarts too.
        first = running_past(restarts=0, step=first["checkpoint_step"], job_name=JOB_NAME)
        os.kill(trainer_host_pid(running_worker_1()), signal.SIGKILL)
        second = running_past(restarts=first["restarts"] + 1, step=first["checkpoint_step"], job_name=JOB_NAME)

        # SIGTERM, as the kubelet sends it on a deletion (to the container's init, tini, which forwards it): the group
        # checkpoints and every worker exits 143; the pods are Failed, not deleted, so ExitCode recreates them.
        os.kill(trainer_host_pid(running_worker_1()), signal.SIGTERM)
        running_past(restarts=second["restarts"] + 1, step=second["checkpoint_step"], job_name=JOB_NAME)

        logs = start_make("logs", *JOB, log=tmp_path / "logs.log")
        assert submitted.wait(timeout=1200) == 0, submit_log.read_text()[-3000:]
        assert logs.wait(timeout=120) == 0, "make logs did not end with the chief"
    finally:
        if submitted.poll() is None:
            submitted.kill()
    assert "succeeded; the model is on volume" in submit_log.read_text()
    followed = (tmp_path / "logs.log").read_text()
    assert "epoch 3/3 done" in followed, followed[-2000:]

    metrics = json.loads((fetch_model(tmp_path / "artifacts", JOB_NAME) / "metrics.json").read_text())
    assert metrics["steps"] == 3 * metrics["steps_per_epoch"] == TOTAL_STEPS, "the job ends at the step it planned"
    assert metrics["restarts"] >= 2 and metrics["resumed_from_step"] >= second["checkpoint_step"]
    make("delete", *JOB)


def test_a_deleted_worker_pod_restarts_the_jobset_group_which_resumes_and_finishes_at_its_planned_step(tmp_path):
    job_name = "e2e-jobset-faults"
    job = ["ENGINE=jobset", "STRATEGY=sync", f"JOB_NAME={job_name}"]
    make("delete", *job, check=False)
    clear_model_dir(job_name)
    submit_log = tmp_path / "submit.log"
    submitted = start_make("submit", *job, *ONE_EPOCH_JOB, log=submit_log)
    try:
        first = running_past(restarts=0, step=0, job_name=job_name)
        worker_1 = f"jobset.sigs.k8s.io/jobset-name={job_name},batch.kubernetes.io/job-completion-index=1"
        pod = running_worker_1(worker_1)["metadata"]["name"]
        deleted = kubectl("delete", "pod", "-n", NAMESPACE, pod, "--wait=false")
        assert deleted.returncode == 0
        running_past(restarts=first["restarts"] + 1, step=first["checkpoint_step"], job_name=job_name)
        assert submitted.wait(timeout=1200) == 0, submit_log.read_text()[-3000:]
    finally:
        if submitted.poll() is None:
            submitted.kill()
    metrics = json.loads((fetch_model(tmp_path / "artifacts", job_name) / "metrics.json").read_text())
    assert metrics["steps"] == STEPS_PER_EPOCH and metrics["restarts"] >= 1
    assert metrics["resumed_from_step"] >= first["checkpoint_step"]
    make("delete", *job)


def test_a_deleted_tfjob_worker_pod_fails_the_job_and_a_resubmit_resumes_and_finishes_at_its_planned_step(tmp_path):
    job_name = "e2e-tfjob-deleted"
    job = ["ENGINE=tfjob", "STRATEGY=sync", f"JOB_NAME={job_name}"]
    make("delete", *job, check=False)
    clear_model_dir(job_name)
    submit_log = tmp_path / "submit.log"
    submitted = start_make("submit", *job, *ONE_EPOCH_JOB, log=submit_log)
    try:
        first = running_past(restarts=0, step=0, job_name=job_name)
        worker_1 = f"training.kubeflow.org/job-name={job_name},training.kubeflow.org/replica-index=1"
        pod = running_worker_1(worker_1)["metadata"]["name"]
        assert kubectl("delete", "pod", "-n", NAMESPACE, pod, "--wait=false").returncode == 0
        # The operator fails the job (docs/cluster.md); make submit says so and exits non-zero.
        assert submitted.wait(timeout=600) != 0, submit_log.read_text()[-3000:]
    finally:
        if submitted.poll() is None:
            submitted.kill()
    assert f"TFJob {job_name} failed" in submit_log.read_text(), submit_log.read_text()[-3000:]

    # The user's fix: submit the same job again. It replaces the failed one and resumes from its checkpoint.
    again = make("submit", *job, *ONE_EPOCH_JOB)
    assert f"deleting the failed TFJob {job_name}" in again.stdout, again.stdout[-3000:]
    metrics = json.loads((fetch_model(tmp_path / "artifacts", job_name) / "metrics.json").read_text())
    assert metrics["steps"] == STEPS_PER_EPOCH, "the resubmitted job ends at the step the first one planned"
    assert metrics["resumed_from_step"] >= first["checkpoint_step"] > 0
    make("delete", *job)
