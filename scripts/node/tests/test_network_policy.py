"""The job's NetworkPolicy, enforced by each node's policy controller (kube-router's firewall): the TF port admits
only the job's own pods, on either node, the status port every pod of the namespace and none of another; and
make status reads a chief's status on either node.

A listener on each node stands in for a worker: a pod with the job's labels, listening on both ports, so that each
probe's answer depends on the policy alone. The probes are connects from pods that are and are not the job's, on the
listener's node and on the other: pod traffic between the nodes is routed, not masqueraded, so the policy sees pods.
"""

from __future__ import annotations

import json
import os
import subprocess

import kubernetes
import pytest
import yaml

from scripts.cluster.job_follower import api_errors, pod_status
from scripts.common import settings as project_settings
from scripts.node.tests.node import (
    CONTEXT,
    NAMESPACE,
    NODES,
    ROOT,
    SETTINGS,
    connects,
    image_built,
    kubectl,
    project_image,
    wait_until,
)

pytestmark = pytest.mark.cluster

JOB = "netcheck"
# A name of this run's own: with Kueue installed, a deleted namespace stays Terminating on the local node (its
# visibility API's discovery goes stale), and the next run must not meet it.
OTHER_NAMESPACE = f"netcheck-other-{os.getpid()}"
TF_PORT, STATUS_PORT = int(SETTINGS["TFJOB_PORT"]), int(SETTINGS["TRAINER_STATUS_PORT"])
LISTENER = f"""
import http.server, json, socket, threading
def accept(port):
    server = socket.create_server(("", port))
    while True:
        server.accept()[0].close()
class Status(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = json.dumps({{"state": "running", "path": self.path}}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
threading.Thread(target=accept, args=({TF_PORT},), daemon=True).start()
http.server.ThreadingHTTPServer(("", {STATUS_PORT}), Status).serve_forever()
"""


def rendered_job(job_name: str) -> list[dict]:
    environment = {**os.environ, "JOB_NAME": job_name}
    with project_settings.kustomization(ROOT / "k8s/engines/tfjob/sync", environment) as overlay:
        rendered = subprocess.run(["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, check=True)
    return list(yaml.safe_load_all(rendered.stdout))


def pod(name: str, namespace: str, labels: dict, command: str, template: dict, node: str = NODES[0]) -> dict:
    """A pod on NODE as restricted as the job's own (its pod and container security contexts), running COMMAND."""
    container = template["spec"]["containers"][0]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "nodeName": node,
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
    image_built()  # a module's fixture runs before the autouse one that builds and imports it
    objects = rendered_job(JOB)
    policy = next(o for o in objects if o["kind"] == "NetworkPolicy" and o["metadata"]["name"] == f"{JOB}-training")
    template = objects[[o["kind"] for o in objects].index("TFJob")]["spec"]["tfReplicaSpecs"]["Worker"]["template"]
    job_labels = policy["spec"]["podSelector"]["matchLabels"]
    idle = "import time; time.sleep(3600)"
    nodes = kubectl("get", "nodes", "-o", "jsonpath={.items[*].metadata.name}").stdout.split()
    assert sorted(nodes) == sorted(NODES), f"the cluster suite runs on two nodes: make cluster-up NODES=2 ({nodes})"
    kubectl("create", "namespace", OTHER_NAMESPACE)
    kubectl("wait", "-n", OTHER_NAMESPACE, "--for=create", "serviceaccount/default", "--timeout=60s")
    created = [{**policy, "metadata": {**policy["metadata"], "namespace": NAMESPACE}}]
    for index, node in enumerate(NODES):
        created += [
            pod(f"{JOB}-listener-{index}", NAMESPACE, job_labels, LISTENER, template, node),
            pod(f"{JOB}-peer-{index}", NAMESPACE, job_labels, idle, template, node),
            pod(f"{JOB}-outsider-{index}", NAMESPACE, {"app.kubernetes.io/component": "probe"}, idle, template, node),
        ]
    created.append(pod(f"{JOB}-stranger", OTHER_NAMESPACE, job_labels, idle, template))
    kubectl("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "List", "items": created}))
    for item in created[1:]:
        namespace = item["metadata"]["namespace"]
        kubectl("wait", "-n", namespace, "--for=condition=Ready", f"pod/{item['metadata']['name']}", "--timeout=180s")
    listeners = []
    for index in range(len(NODES)):
        listener = json.loads(kubectl("get", "-n", NAMESPACE, "pod", f"{JOB}-listener-{index}", "-o", "json").stdout)
        listeners.append(listener["status"]["podIP"])
    yield listeners
    kubectl("delete", "-n", NAMESPACE, "networkpolicy", f"{JOB}-training", "--wait=false", check=False)
    for item in created[1:-1]:
        kubectl("delete", "-n", NAMESPACE, "pod", item["metadata"]["name"], "--wait=false", check=False)
    kubectl("delete", "namespace", OTHER_NAMESPACE, "--wait=false", check=False)


@pytest.mark.parametrize("listener_node", [0, 1], ids=["on-the-host-node", "on-the-agent"])
def test_the_tf_port_admits_only_the_job_s_pods_from_either_node_and_the_status_port_only_the_namespace_s(
    listener_and_probes, listener_node
):
    listener = listener_and_probes[listener_node]
    other_node = 1 - listener_node
    peer, outsider, stranger = f"{JOB}-peer-{listener_node}", f"{JOB}-outsider-{listener_node}", f"{JOB}-stranger"
    remote_peer, remote_outsider = f"{JOB}-peer-{other_node}", f"{JOB}-outsider-{other_node}"
    # The listener answers: a pod of the job reaches both ports, from its node and from the other.
    assert wait_until("the job's peer to reach the TF port", lambda: connects(peer, NAMESPACE, listener, TF_PORT), 60)
    assert connects(peer, NAMESPACE, listener, STATUS_PORT)
    assert connects(remote_peer, NAMESPACE, listener, TF_PORT), "the job's pod on the other node is refused"
    # The policy controller applies the policy within its sync; from then on the outsiders stay out, on either node.
    wait_until(
        "the policy controller to refuse a pod outside the job on the TF port",
        lambda: not connects(outsider, NAMESPACE, listener, TF_PORT),
        90,
    )
    assert [connects(outsider, NAMESPACE, listener, TF_PORT) for _ in range(3)] == [False] * 3
    assert [connects(remote_outsider, NAMESPACE, listener, TF_PORT) for _ in range(3)] == [False] * 3
    assert connects(outsider, NAMESPACE, listener, STATUS_PORT), "the namespace's pods may read the status"
    assert connects(remote_outsider, NAMESPACE, listener, STATUS_PORT)
    # Another namespace's pod with the job's own labels is not the job's: both ports are closed to it.
    assert not connects(stranger, OTHER_NAMESPACE, listener, TF_PORT)
    assert not connects(stranger, OTHER_NAMESPACE, listener, STATUS_PORT)
    # And the job's peers are still admitted under the enforced policy, across the nodes too.
    assert connects(peer, NAMESPACE, listener, TF_PORT)
    assert connects(remote_peer, NAMESPACE, listener, TF_PORT)


@pytest.mark.parametrize("listener_node", [0, 1], ids=["on-the-host-node", "on-the-agent"])
def test_make_status_reads_a_chief_on_either_node_under_the_policy_which_refuses_the_service_proxy_on_the_agent(
    listener_and_probes, listener_node
):
    listener = f"{JOB}-listener-{listener_node}"
    outsider = f"{JOB}-outsider-{listener_node}"
    kubernetes.config.load_kube_config(context=CONTEXT)
    core = kubernetes.client.CoreV1Api()
    wait_until(
        "the policy controller to refuse a pod outside the job on the TF port",
        lambda: not connects(outsider, NAMESPACE, listener_and_probes[listener_node], TF_PORT),
        90,
    )
    # make status's read: a port-forward, which the chief's kubelet opens inside the pod, on either node.
    assert pod_status(core, NAMESPACE, listener, STATUS_PORT) == {"state": "running", "path": "/status"}
    # What make status read through before: the API server's proxy, whose connection to the agent's pods comes from
    # the host's address on the agent's link, which the status rule (the namespace's pods) does not admit.
    try:
        through_proxy = core.connect_get_namespaced_pod_proxy_with_path(
            f"{listener}:{STATUS_PORT}", NAMESPACE, "status", _request_timeout=30
        )
    except api_errors() as error:  # the API server's dial timed out (an error answer), or the call did
        through_proxy = error
    if listener_node == 0:
        assert "running" in str(through_proxy), through_proxy
    else:
        assert isinstance(through_proxy, api_errors()), through_proxy
