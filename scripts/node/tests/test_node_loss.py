"""A node lost mid-training, as a machine that loses its power: `make agent-down` stops the agent's kubelet, containerd,
containers and link, and the API server keeps its Node and pods. `make status` names the lost node and the one command
that frees its pods (the out-of-service taint); the test runs it as an operator would, the TFJob fails, `make submit`
again resumes from the last checkpoint on the node that remains, and the job ends at the step it planned.

It stops a node the other cluster tests use, so it runs alone, after them (make test-cluster: -m node_loss). It brings
the agent back at its end. The times from the loss to each stage are printed: `-s` shows them (docs/cluster.md)."""

from __future__ import annotations

import json
import time

import pytest

from scripts.node.tests.node import (
    NODES,
    ONE_EPOCH_JOB,
    STEPS_PER_EPOCH,
    clear_model_dir,
    fetch_model,
    kubectl,
    make,
    nodes_of,
    running_past,
    start_make,
    status_on_disk,
    wait_until,
)

pytestmark = [pytest.mark.cluster, pytest.mark.node_loss]

JOB_NAME = "e2e-node-loss"
JOB = ["ENGINE=tfjob", "STRATEGY=sync", f"JOB_NAME={JOB_NAME}"]
PODS = f"training.kubeflow.org/job-name={JOB_NAME}"
AGENT = NODES[1]
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
TAINT = f"kubectl taint nodes {AGENT} {OUT_OF_SERVICE}=nodeshutdown:NoExecute"


def ready(node: str) -> str:
    conditions = json.loads(kubectl("get", "node", node, "-o", "json").stdout)["status"].get("conditions", [])
    return next((c["status"] for c in conditions if c["type"] == "Ready"), "missing")


@pytest.fixture
def agent_comes_back():
    """The agent, up again and Ready after the test, untainted, whatever the test did."""
    yield
    kubectl("taint", "nodes", AGENT, f"{OUT_OF_SERVICE}-", check=False)
    make("cluster-up", "NODES=2", image_as_built=False)
    wait_until(f"{AGENT} to be Ready again", lambda: ready(AGENT) == "True", 300)


def test_a_lost_node_is_named_by_make_status_and_the_job_resumes_on_the_node_that_remains(tmp_path, agent_comes_back):
    make("delete", *JOB, check=False)
    clear_model_dir(JOB_NAME)
    submit_log = tmp_path / "submit.log"
    submitted = start_make("submit", *JOB, *ONE_EPOCH_JOB, log=submit_log)
    times: dict[str, float] = {}
    try:
        before = running_past(restarts=0, step=0, job_name=JOB_NAME)
        assert nodes_of(PODS) == set(NODES), "the job's two workers run on the two nodes"
        lost = time.monotonic()
        make("agent-down")
        wait_until(f"{AGENT} to be not ready", lambda: ready(AGENT) != "True", 300)
        times["node not ready"] = time.monotonic() - lost

        # make status names the lost node, the pods it holds and the command that frees them.
        status = make("status", *JOB).stdout
        assert f"node {AGENT} is not ready" in status and TAINT in status, status
        assert "make submit again resumes from the last checkpoint" in status, status

        # The operator's action, once the node is known to be down: its pods are deleted, and the TFJob fails.
        assert kubectl(*TAINT.split()[1:]).returncode == 0
        assert submitted.wait(timeout=600) != 0, submit_log.read_text()[-3000:]
        times["job failed"] = time.monotonic() - lost
    finally:
        if submitted.poll() is None:
            submitted.kill()
    assert f"TFJob {JOB_NAME} failed" in submit_log.read_text(), submit_log.read_text()[-3000:]
    wait_until(f"the job's pods on {AGENT} to be gone", lambda: AGENT not in nodes_of(PODS), 180)

    # make submit again: both workers on the node that remains, from the last checkpoint, to the planned step.
    again = start_make("submit", *JOB, *ONE_EPOCH_JOB, log=tmp_path / "again.log")
    try:
        wait_until(
            "training again",
            lambda: (
                (s := status_on_disk(JOB_NAME)) and s["state"] == "running" and s["started_at"] > before["started_at"]
            ),
            600,
            poll_s=0.5,
        )
        times["training again"] = time.monotonic() - lost
        assert again.wait(timeout=900) == 0, (tmp_path / "again.log").read_text()[-3000:]
    finally:
        if again.poll() is None:
            again.kill()
    assert nodes_of(PODS) == {NODES[0]}
    metrics = json.loads((fetch_model(tmp_path / "artifacts", JOB_NAME) / "metrics.json").read_text())
    assert metrics["steps"] == STEPS_PER_EPOCH, "the job ends at the step an uninterrupted run plans"
    assert metrics["resumed_from_step"] >= before["checkpoint_step"] > 0
    print("node loss, seconds from the agent's loss: " + ", ".join(f"{k} {v:.0f}" for k, v in times.items()))
    make("delete", *JOB)
