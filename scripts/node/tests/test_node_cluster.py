"""End to end on the local node's real Kubernetes (make cluster-up; make test-cluster runs this file).

The user's commands run as a user types them: make submit, status, fetch-model and delete with
KUBE_CONTEXT=node-<cluster>, against a real API server, kubelet, containerd and the training operator built
from their pinned modules. Nothing here is emulated: a refusal is the real admission's, a pod is a real container.
"""

from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

from pod_security import pod_templates
from scripts.node.tests.node import (
    NODES,
    ROOT,
    SETTINGS,
    SHORT_JOB,
    clear_model_dir,
    fetch_model,
    kubectl,
    make,
    wait_until,
)

pytestmark = pytest.mark.cluster


def test_clients_read_the_pinned_kubernetes_version() -> None:
    version = json.loads(kubectl("version", "-o", "json").stdout)["serverVersion"]
    assert version["gitVersion"] == SETTINGS["NODE_KUBERNETES_VERSION"]
    node = json.loads(kubectl("get", "node", SETTINGS["CLUSTER_NAME"], "-o", "json").stdout)
    assert node["status"]["nodeInfo"]["kubeletVersion"] == SETTINGS["NODE_KUBERNETES_VERSION"]


def create_pod(namespace: str, pod: dict, *extra: str) -> subprocess.CompletedProcess[str]:
    return kubectl("create", "-n", namespace, "-f", "-", *extra, check=False, stdin=json.dumps(pod))


@pytest.fixture
def restricted_namespace():
    namespace = f"restricted-check-{os.getpid()}"  # this run's own, as in test_network_policy.py
    kubectl("create", "namespace", namespace)
    kubectl("label", "--overwrite", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    # The service-account controller makes the namespace's default account a moment after the namespace.
    kubectl("wait", "-n", namespace, "--for=create", "serviceaccount/default", "--timeout=60s")
    yield namespace
    kubectl("delete", "namespace", namespace, "--wait=false")


def test_the_real_admission_admits_every_overlay_s_pods_and_refuses_one_that_breaks_a_rule(restricted_namespace):
    import yaml

    checked = 0
    for overlay in sorted((ROOT / "k8s" / "engines").glob("*/*sync")):
        rendered = subprocess.run(["kubectl", "kustomize", str(overlay)], capture_output=True, text=True, check=True)
        for obj in yaml.safe_load_all(rendered.stdout):
            for template in pod_templates(obj):
                pod = {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": f"{overlay.parent.name}-{overlay.name}-{checked}"},
                    "spec": template["spec"],
                }
                # A server-side dry run goes through the real admission chain, PodSecurity included, and stores nothing.
                admitted = create_pod(restricted_namespace, pod, "--dry-run=server")
                assert admitted.returncode == 0, (
                    f"{overlay.name} {obj['kind']} {obj['metadata']['name']}: {admitted.stderr}"
                )
                checked += 1
    assert checked >= 12, f"only {checked} pod templates found in the overlays"

    root_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "runs-as-root"},
        "spec": {"containers": [{"name": "c", "image": f"registry.k8s.io/pause:{SETTINGS['NODE_PAUSE_VERSION']}"}]},
    }
    refused = create_pod(restricted_namespace, root_pod)
    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in refused.stderr, refused.stderr
    assert "runAsNonRoot" in refused.stderr


def test_submit_trains_on_the_cluster_and_the_fetched_model_answers_like_the_trained_one(tmp_path) -> None:
    make("delete", check=False)
    clear_model_dir(SETTINGS["JOB_NAME"])
    submitted = make("submit", "ENGINE=tfjob", "STRATEGY=sync", *SHORT_JOB)
    assert "Succeeded" in submitted.stdout, submitted.stdout[-3000:]

    status = make("status", "ENGINE=tfjob", "STRATEGY=sync")
    assert "Succeeded" in status.stdout, status.stdout

    # Both workers ran: the operator made one pod per replica and each exited 0.
    pods = json.loads(
        kubectl("get", "pods", "-l", f"training.kubeflow.org/job-name={SETTINGS['JOB_NAME']}", "-o", "json").stdout
    )["items"]
    assert len(pods) == int(SETTINGS["WORKERS"])
    assert all(pod["status"]["phase"] == "Succeeded" for pod in pods)
    # One worker on each node: their TF_CONFIG addresses, the all-reduce and the chief's writes crossed nodes.
    assert {pod["spec"]["nodeName"] for pod in pods} == set(NODES)

    model_dir = fetch_model(tmp_path / "artifacts")
    versions = sorted((model_dir / "serving").iterdir())
    assert versions, f"no SavedModel version under {model_dir / 'serving'}"

    import keras
    import tensorflow as tf

    trained = keras.saving.load_model(model_dir / "model.keras")
    served = tf.saved_model.load(str(versions[-1]))
    serve = served.signatures["serving_default"]
    # The served signature takes raw uint8 images; the reference is the model in memory, called as evaluation calls it.
    rows = np.random.default_rng(0).integers(0, 256, (8, *trained.input_shape[1:]), dtype=np.uint8)
    answer = serve(images=tf.constant(rows))["probabilities"].numpy()
    expected = tf.nn.softmax(tf.cast(trained(rows, training=False), tf.float32)).numpy()
    np.testing.assert_allclose(answer, expected, rtol=1e-5, atol=1e-5)

    make("delete", "ENGINE=tfjob", "STRATEGY=sync")
    # The pods go before make delete returns; the Services go with the garbage collector soon after (seen left once).
    selector = f"training.kubeflow.org/job-name={SETTINGS['JOB_NAME']}"
    assert kubectl("get", "pods", "-l", selector, "-o", "name").stdout.strip() == ""
    wait_until(
        "the job's Services to go",
        lambda: not kubectl("get", "services", "-l", selector, "-o", "name").stdout.strip(),
        60,
    )


def test_a_pods_sandbox_is_removed_after_the_host_ran_ip_netns(restricted_namespace) -> None:
    # The first `ip netns add` on a host makes /run/netns a recursive bind of itself (the slow suite's bench runs it,
    # as may anything on the host): a pod network namespace mounted there before is then mounted twice, and removing
    # its sandbox failed with "device or resource busy", its pod's status unknown (Argo's steps then never ended).
    security = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": True,
                "runAsUser": 65534, "seccompProfile": {"type": "RuntimeDefault"}}  # fmt: skip
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sandbox-probe", "namespace": restricted_namespace},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:" + SETTINGS["NODE_PAUSE_VERSION"],
                            "imagePullPolicy": "Never", "securityContext": security}],
        },
    }  # fmt: skip
    kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    kubectl("wait", "-n", restricted_namespace, "--for=condition=Ready", "pod/sandbox-probe", "--timeout=120s")
    probe = f"distml-probe-{os.getpid()}"
    subprocess.run(["ip", "netns", "add", probe], check=True)
    subprocess.run(["ip", "netns", "del", probe], check=True)
    deleted = kubectl("delete", "pod", "-n", restricted_namespace, "sandbox-probe", "--timeout=90s", check=False)
    assert deleted.returncode == 0, deleted.stderr
    events = kubectl("get", "events", "-n", restricted_namespace, "--field-selector",
                     "involvedObject.name=sandbox-probe", "-o", "jsonpath={.items[*].reason}").stdout  # fmt: skip
    assert "FailedKillPod" not in events, events


def test_a_read_write_once_claim_across_two_nodes_is_refused_before_anything_is_created() -> None:
    job_name, claim = "e2e-rwo-refused", "e2e-rwo-volume"
    job = [f"JOB_NAME={job_name}", f"VOLUME_CLAIM={claim}", "VOLUME_ACCESS_MODE=ReadWriteOnce"]
    refused = make("submit", *job, "VOLUME_STORAGE_CLASS=local-path", *SHORT_JOB, check=False)
    assert refused.returncode != 0
    said = refused.stdout + refused.stderr
    assert f"the claim {claim} is ReadWriteOnce, and the job spreads its pods over this cluster's 2 nodes" in said, said
    assert "VOLUME_ACCESS_MODE=ReadWriteMany" in said and "SPREAD_OVER_NODES=0" in said
    # Nothing was created: no claim waiting to bind, no job, no policy.
    assert kubectl("get", "pvc", claim, "--ignore-not-found", "-o", "name").stdout.strip() == ""
    assert (
        kubectl("get", "tfjob,networkpolicy", "-l", f"app.kubernetes.io/instance={job_name}", "-o", "name").stdout == ""
    )
