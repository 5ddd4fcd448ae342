"""The job's NetworkPolicy, enforced by the local node's policy controller (kube-router's firewall): the TF port
admits only the job's own pods, the status port every pod of the namespace and none of another.

A listener stands in for a worker: a pod with the job's labels, listening on both ports, so that each probe's
answer depends on the policy alone. The probes are connects from pods that are and are not the job's.
"""

from __future__ import annotations

import json
import os
import subprocess

import pytest
import yaml

from scripts.common import settings as project_settings
from scripts.node.tests.node import NAMESPACE, ROOT, SETTINGS, connects, kubectl, project_image, wait_until

pytestmark = pytest.mark.cluster

JOB = "netcheck"
# A name of this run's own: with Kueue installed, a deleted namespace stays Terminating on the local node (its
# visibility API's discovery goes stale), and the next run must not meet it.
OTHER_NAMESPACE = f"netcheck-other-{os.getpid()}"
TF_PORT, STATUS_PORT = int(SETTINGS["TFJOB_PORT"]), int(SETTINGS["TRAINER_STATUS_PORT"])
LISTENER = f"""
import socket, threading
def serve(port):
    server = socket.create_server(("", port))
    while True:
        server.accept()[0].close()
threading.Thread(target=serve, args=({TF_PORT},), daemon=True).start()
serve({STATUS_PORT})
"""


def rendered_job(job_name: str) -> list[dict]:
    environment = {**os.environ, "JOB_NAME": job_name}
    with project_settings.kustomization(ROOT / "k8s/engines/tfjob/sync", environment) as overlay:
        rendered = subprocess.run(["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, check=True)
    return list(yaml.safe_load_all(rendered.stdout))


def pod(name: str, namespace: str, labels: dict, command: str, template: dict) -> dict:
    """A pod as restricted as the job's own (its pod and container security contexts), running COMMAND."""
    container = template["spec"]["containers"][0]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "securityContext": template["spec"].get("securityContext", {}),
            "containers": [
                {
                    "name": "probe",
                    "image": project_image(),
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python3", "-c", command],
                    "securityContext": container.get("securityContext", {}),
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def listener_and_probes():
    objects = rendered_job(JOB)
    policy = next(o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == f"{JOB}-training")
    template = objects[[o["kind"] for o in objects].index("TFJob")]["spec"]["tfReplicaSpecs"]["Worker"]["template"]
    job_labels = policy["spec"]["podSelector"]["matchLabels"]
    idle = "import time; time.sleep(3600)"
    kubectl("create", "namespace", OTHER_NAMESPACE)
    kubectl("wait", "-n", OTHER_NAMESPACE, "--for=create", "serviceaccount/default", "--timeout=60s")
    created = [
        {**policy, "metadata": {**policy["metadata"], "namespace": NAMESPACE}},
        pod(f"{JOB}-listener", NAMESPACE, job_labels, LISTENER, template),
        pod(f"{JOB}-peer", NAMESPACE, job_labels, idle, template),
        pod(f"{JOB}-outsider", NAMESPACE, {"app.kubernetes.io/component": "probe"}, idle, template),
        pod(f"{JOB}-stranger", OTHER_NAMESPACE, job_labels, idle, template),
    ]
    kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": created}))
    for item in created[1:]:
        namespace = item["metadata"]["namespace"]
        kubectl("wait", "-n", namespace, "--for=condition=Ready", f"pod/{item['metadata']['name']}", "--timeout=180s")
    listener_ip = json.loads(kubectl("get", "-n", NAMESPACE, "pod", f"{JOB}-listener", "-o", "json").stdout)["status"][
        "podIP"
    ]
    yield listener_ip
    kubectl("delete", "-n", NAMESPACE, "networkpolicy", f"{JOB}-training", "--wait=false", check=False)
    for name in ("listener", "peer", "outsider"):
        kubectl("delete", "-n", NAMESPACE, "pod", f"{JOB}-{name}", "--wait=false", check=False)
    kubectl("delete", "namespace", OTHER_NAMESPACE, "--wait=false", check=False)


def test_the_tf_port_admits_only_the_job_s_pods_and_the_status_port_only_the_namespace_s(listener_and_probes):
    listener = listener_and_probes
    peer, outsider, stranger = f"{JOB}-peer", f"{JOB}-outsider", f"{JOB}-stranger"
    # The listener answers: a pod of the job reaches both ports.
    assert wait_until("the job's peer to reach the TF port", lambda: connects(peer, NAMESPACE, listener, TF_PORT), 60)
    assert connects(peer, NAMESPACE, listener, STATUS_PORT)
    # The policy controller applies the policy within its sync; from then on the outsider stays out.
    wait_until(
        "the policy controller to refuse a pod outside the job on the TF port",
        lambda: not connects(outsider, NAMESPACE, listener, TF_PORT),
        90,
    )
    assert [connects(outsider, NAMESPACE, listener, TF_PORT) for _ in range(3)] == [False] * 3
    assert connects(outsider, NAMESPACE, listener, STATUS_PORT), "the namespace's pods may read the status"
    # Another namespace's pod with the job's own labels is not the job's: both ports are closed to it.
    assert not connects(stranger, OTHER_NAMESPACE, listener, TF_PORT)
    assert not connects(stranger, OTHER_NAMESPACE, listener, STATUS_PORT)
    # And the job's peer is still admitted under the enforced policy.
    assert connects(peer, NAMESPACE, listener, TF_PORT)
