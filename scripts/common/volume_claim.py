"""Whether the job's volume can serve the pods where they will run, asked of the cluster before anything is created:
the claim's StorageClass exists, a claim that exists already is the one the settings ask for (a claim's mode and class
cannot change), and a ReadWriteOnce claim is never asked to serve pods spread over several nodes, which would pin
every pod to the node that holds it or leave the others waiting on a Multi-Attach error (docs/cluster.md). Each
command that creates the claim asks first: make submit, make upload-images, make tune-cluster, make submit-pipeline.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

from scripts.common import kubectl as project_kubectl
from scripts.common import manifest

Manifest = dict[str, Any]
# kubectl ARGS... -> its stdout (the caller's kubectl, on the project's context)
Kubectl = Callable[..., str]
HOSTNAME = "kubernetes.io/hostname"
STORAGE_DOCS = "docs/cluster.md#storage-across-nodes"


class VolumeClaimError(ValueError):
    """The claim cannot serve this job on this cluster; the message names why and the fix."""


def spreads_over_nodes(objects: Iterable[Manifest]) -> bool:
    """Whether any pod of the rendered job must be placed apart from the others, node by node."""
    return any(
        constraint.get("topologyKey") == HOSTNAME and constraint.get("whenUnsatisfiable") == "DoNotSchedule"
        for obj in objects
        for template in manifest.pod_templates(obj)
        for constraint in template["spec"].get("topologySpreadConstraints") or []
    )


def schedulable_nodes(nodes: Manifest) -> list[str]:
    """The names of the nodes (kubectl get nodes -o json) that are Ready and not cordoned."""
    names = []
    for node in nodes.get("items", []):
        ready = any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))
        if ready and not node["spec"].get("unschedulable"):
            names.append(node["metadata"]["name"])
    return names


def ask(*args: str) -> str:
    """The project's kubectl (scripts/common/kubectl.py), as the tools outside the cluster room call it."""
    return project_kubectl.kubectl(*args).stdout


def check(objects: list[Manifest], namespace: str, kubectl: Kubectl = ask) -> None:
    """VolumeClaimError unless the rendered job's claim can serve its pods on the cluster KUBECTL reaches."""
    claims = manifest.of_kind(objects, "PersistentVolumeClaim")
    if not claims:
        return
    claim = claims[0]
    name, spec = claim["metadata"]["name"], claim["spec"]
    wanted_class, wanted_modes = spec.get("storageClassName"), spec.get("accessModes") or []
    existing = json.loads(kubectl("get", "pvc", name, "-n", namespace, "-o", "json", "--ignore-not-found") or "null")
    if existing is None and wanted_class:
        classes = json.loads(kubectl("get", "storageclass", "-o", "json"))
        names = sorted(item["metadata"]["name"] for item in classes.get("items", []))
        if wanted_class not in names:
            raise VolumeClaimError(
                f"VOLUME_STORAGE_CLASS={wanted_class}: this cluster has no such StorageClass (it has: "
                f"{', '.join(names) or 'none'}); set VOLUME_STORAGE_CLASS in k8s/base/settings.env to one of them"
            )
    if existing is not None:
        held_class, held_modes = existing["spec"].get("storageClassName"), existing["spec"].get("accessModes") or []
        if (held_class, sorted(held_modes)) != (wanted_class, sorted(wanted_modes)):
            raise VolumeClaimError(
                f"the claim {name} exists as {'/'.join(held_modes)} on class {held_class}, and the settings ask for "
                f"{'/'.join(wanted_modes)} on {wanted_class}: a claim's mode and class cannot change. Use a new claim "
                f"(VOLUME_CLAIM=another-name; {name} keeps its data), or delete it with its data "
                f"(kubectl delete pvc {name} -n {namespace}), or ask for what it is"
            )
    if "ReadWriteMany" in wanted_modes or not spreads_over_nodes(objects):
        return
    nodes = schedulable_nodes(json.loads(kubectl("get", "nodes", "-o", "json")))
    if len(nodes) > 1:
        raise VolumeClaimError(
            f"the claim {name} is {'/'.join(wanted_modes)}, and the job spreads its pods over this cluster's "
            f"{len(nodes)} nodes ({', '.join(nodes)}): a ReadWriteOnce volume would pin every pod to one node, or "
            f"leave the others waiting on a Multi-Attach error. Set VOLUME_ACCESS_MODE=ReadWriteMany with a "
            f"VOLUME_STORAGE_CLASS that offers it (make k3d-up NODES=2 and make cluster-up NODES=2 have "
            f"local-path-shared; on a cloud, a file store: {STORAGE_DOCS}), or SPREAD_OVER_NODES=0 to train on one "
            f"node on purpose"
        )
