"""Each engine and shape the card offers, submitted with the user's command on the local node's real controllers:
JobSet's and Kubeflow Trainer's (with their webhooks), and the training operator's parameter-server shape.
The TFJob sync shape, with the model checked against the trained one, is test_node_cluster.py's.
"""

from __future__ import annotations

import json

import pytest

from scripts.node.tests.node import NODES, SHORT_JOB, clear_model_dir, fetch_model, make, nodes_of, pods

pytestmark = pytest.mark.cluster

SHAPES = [
    # (ENGINE, STRATEGY, the label every pod of the job carries)
    ("jobset", "sync", "jobset.sigs.k8s.io/jobset-name"),
    ("trainjob", "sync", "jobset.sigs.k8s.io/jobset-name"),  # Trainer names its JobSet after the TrainJob
    ("tfjob", "async", "training.kubeflow.org/job-name"),
    # Their pod templates write TF_CONFIG, each replicated job its own task type (k8s/engines/jobset/async).
    ("jobset", "async", "jobset.sigs.k8s.io/jobset-name"),
    ("trainjob", "async", "jobset.sigs.k8s.io/jobset-name"),
]


@pytest.mark.parametrize(("engine", "strategy", "job_label"), SHAPES, ids=[f"{e}-{s}" for e, s, _ in SHAPES])
def test_each_engine_and_shape_trains_to_succeeded_and_leaves_its_model_on_the_volume(
    engine: str, strategy: str, job_label: str, tmp_path
) -> None:
    job_name = f"e2e-{engine}-{strategy}"
    job = [f"ENGINE={engine}", f"STRATEGY={strategy}", f"JOB_NAME={job_name}"]
    make("delete", *job, check=False)
    clear_model_dir(job_name)
    submitted = make("submit", *job, *SHORT_JOB)
    assert "succeeded; the model is on volume" in submitted.stdout, submitted.stdout[-3000:]
    assert "Succeeded" in make("status", *job).stdout
    # Spread over the suite's two nodes (k8s/base/trainer-pod.yaml), on a ReadWriteMany volume both mount. (The async
    # shape's ps and evaluator pods are deleted at its end, so what is left may be on one node.)
    if strategy == "sync":
        assert nodes_of(f"{job_label}={job_name}") == set(NODES)

    model_dir = fetch_model(tmp_path / "artifacts", job_name)
    metrics = json.loads((model_dir / "metrics.json").read_text())
    # Every planned step ran once: one epoch of the split, at the global batch of the whole group.
    assert metrics["steps"] == metrics["steps_per_epoch"] >= 1
    assert metrics["workers"] == 2
    if strategy == "async":
        assert metrics["strategy"] == "async" and metrics["ps_tasks"] >= 1
    assert any((model_dir / "serving").iterdir())

    make("delete", *job)
    assert pods(f"{job_label}={job_name}") == []
