"""Gang admission on the local node's real Kueue: a JobSet, and a TrainJob, in the LocalQueue waits, suspended and
without a pod, while another workload holds the quota it needs, and runs to Succeeded once that quota frees.
The queues are the shipped example's (k8s/engines/kueue/queues.yaml), each job its shipped Kueue example's
(k8s/engines/jobset/sync-kueue, k8s/engines/trainjob/sync-kueue).
"""

from __future__ import annotations

import json
import time

import pytest

from scripts.node.tests.node import (
    NAMESPACE,
    ROOT,
    SETTINGS,
    SHORT_JOB,
    clear_model_dir,
    kubectl,
    make,
    pods,
    start_make,
    wait_until,
)

pytestmark = pytest.mark.cluster

JOB_NAME = "e2e-kueue"
# Each engine Kueue admits as one workload, and its job's resource; a TrainJob makes a JobSet of its own name, so
# the pods of both carry the JobSet's label.
QUEUED = {"jobset": "jobsets.jobset.x-k8s.io", "trainjob": "trainjobs.trainer.kubeflow.org"}
PODS = f"jobset.sigs.k8s.io/jobset-name={JOB_NAME}"
# The example ClusterQueue's memory quota is 12Gi and the job's two workers request 2Gi each: a workload holding
# 10Gi leaves it short.
HOLDER = {
    "apiVersion": "batch/v1",
    "kind": "Job",
    "metadata": {
        "name": "e2e-quota-holder",
        "namespace": NAMESPACE,
        "labels": {"kueue.x-k8s.io/queue-name": "training"},
    },
    "spec": {
        "suspend": True,  # Kueue unsuspends what it admits
        "template": {
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {
                    "runAsNonRoot": True,
                    "runAsUser": 65535,
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [
                    {
                        "name": "hold",
                        "image": f"registry.k8s.io/pause:{SETTINGS['NODE_PAUSE_VERSION']}",
                        "resources": {"requests": {"cpu": "10m", "memory": "10Gi"}},
                        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    }
                ],
            }
        },
    },
}


def workload_of_the_job() -> dict | None:
    listed = json.loads(kubectl("get", "workloads.kueue.x-k8s.io", "-n", NAMESPACE, "-o", "json").stdout)["items"]
    owned = [w for w in listed if any(o["name"] == JOB_NAME for o in w["metadata"].get("ownerReferences", []))]
    return owned[0] if owned else None


def condition(obj: dict, kind: str) -> dict:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == kind), {})


def holder_admitted() -> bool:
    holder = json.loads(kubectl("get", "job", "-n", NAMESPACE, HOLDER["metadata"]["name"], "-o", "json").stdout)
    return holder["spec"].get("suspend") is False


@pytest.fixture
def queues():
    kubectl("apply", "--server-side", "-f", str(ROOT / "k8s/engines/kueue/queues.yaml"))
    yield
    kubectl("delete", "job", "-n", NAMESPACE, HOLDER["metadata"]["name"], "--ignore-not-found", check=False)


def ended(submitted, log) -> None:
    """Fails at once when make submit ended before its job was queued (a refusal), rather than at the wait's end."""
    if submitted.poll() is not None:
        pytest.fail(f"make submit exited {submitted.returncode} before its job was queued:\n{log.read_text()[-3000:]}")


@pytest.mark.parametrize("engine", sorted(QUEUED))
def test_a_job_waits_in_its_queue_while_quota_is_short_and_runs_once_it_frees(engine, queues, tmp_path) -> None:
    job = [f"ENGINE={engine}", f"KUSTOMIZATION=k8s/engines/{engine}/sync-kueue", f"JOB_NAME={JOB_NAME}"]
    make("delete", *job, check=False)
    clear_model_dir(JOB_NAME)
    kubectl("apply", "-f", "-", stdin=json.dumps(HOLDER))
    wait_until("Kueue to admit the quota holder", holder_admitted, 120)

    log = tmp_path / "submit.log"
    submitted = start_make("submit", *job, *SHORT_JOB, log=log)
    try:
        workload = wait_until(f"the {engine}'s Workload", lambda: workload_of_the_job() or ended(submitted, log), 600)
        time.sleep(10)  # long enough for Kueue to have admitted it, were there quota
        workload = workload_of_the_job()
        assert condition(workload, "QuotaReserved").get("status") != "True", workload["status"]
        held = json.loads(kubectl("get", QUEUED[engine], "-n", NAMESPACE, JOB_NAME, "-o", "json").stdout)
        assert held["spec"].get("suspend") is True
        assert pods(PODS) == []

        kubectl("delete", "job", "-n", NAMESPACE, HOLDER["metadata"]["name"])
        assert submitted.wait(timeout=1200) == 0, log.read_text()[-3000:]
    finally:
        if submitted.poll() is None:
            submitted.kill()
    assert "succeeded; the model is on volume" in log.read_text()
    assert condition(workload_of_the_job(), "Admitted").get("status") == "True"
    make("delete", *job)


def test_a_namespace_deleted_with_kueue_installed_is_gone_and_kueues_aggregated_api_answers():
    # Kueue's visibility API is aggregated: while its discovery went stale (the API server reached it through the
    # Service's ClusterIP), every namespace deletion hung in Terminating (NamespaceDeletionDiscoveryFailure).
    assert kubectl("get", "deployment", "-n", "kueue-system", "kueue-controller-manager").returncode == 0
    listed = json.loads(kubectl("get", "--raw", "/apis/visibility.kueue.x-k8s.io/v1beta1").stdout)
    assert listed["groupVersion"] == "visibility.kueue.x-k8s.io/v1beta1"
    name = f"e2e-kueue-gone-{time.monotonic_ns()}"
    kubectl("create", "namespace", name)
    kubectl("wait", "-n", name, "--for=create", "serviceaccount/default", "--timeout=60s")
    deleted = kubectl("delete", "namespace", name, "--timeout=120s", check=False)
    assert deleted.returncode == 0, deleted.stderr
    assert kubectl("get", "namespace", name, check=False).returncode != 0
