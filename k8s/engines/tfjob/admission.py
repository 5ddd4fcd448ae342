"""What the training operator's TFJob admission webhook (v1.9) rejects, applied before anything reaches a cluster
(make submit, run-local, and the offline tests); and the `tensorflow` container it requires, the one the operator
gives TF_CONFIG."""

from __future__ import annotations

import re

from k8s.engines.tfjob.customize import TRAINER_CONTAINER
from scripts.common.manifest import CHIEF_TYPES, Manifest, ManifestError

# The operator's DNS-1035 label rule for job names (apimachinery NameIsDNS1035Label).
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63
# The tfReplicaSpecs keys the operator knows, in the order run-local starts them (a chief first).
REPLICA_TYPES = ("Chief", "Master", "PS", "Worker", "Evaluator")


def tensorflow_container(template: Manifest) -> Manifest:
    """The `tensorflow` container of a replica's pod template: the one the operator gives TF_CONFIG."""
    for container in template["spec"]["containers"]:
        if container.get("name") == TRAINER_CONTAINER:
            return container
    raise ManifestError(f"pod template has no container named {TRAINER_CONTAINER!r}")


def trainer_container(tfjob: Manifest) -> Manifest:
    """The `tensorflow` container of the TFJob's Worker replicas."""
    return tensorflow_container(tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"])


def webhook_problems(document: Manifest) -> list[str]:
    """Why the training operator's TFJob admission webhook (v1.9) would reject this, if it would.

    Its rules: the name is a DNS-1035 label; tfReplicaSpecs exists; every replica type has
    containers, each with an image, one of them named `tensorflow`; at most one of Chief and
    Master. One more rule of ours: pod and service names `<job>-<type>-<index>` are DNS labels too.
    """
    problems = []
    name = document.get("metadata", {}).get("name", "")
    if not DNS_1035_LABEL.match(name) or len(name) > DNS_LABEL_MAX:
        problems.append(
            f"metadata.name {name!r} is not a DNS-1035 label (a-z, 0-9, '-', starts with a letter, "
            f"at most {DNS_LABEL_MAX} characters): set JOB_NAME in k8s/base/settings.env"
        )
    specs = document.get("spec", {}).get("tfReplicaSpecs")
    if not specs:
        return problems + ["spec.tfReplicaSpecs is required"]
    for replica_type, spec in specs.items():
        path = f"spec.tfReplicaSpecs.{replica_type}"
        if replica_type not in REPLICA_TYPES:
            problems.append(f"{path}: unknown replica type; use one of {', '.join(REPLICA_TYPES)}")
        containers = (spec or {}).get("template", {}).get("spec", {}).get("containers") or []
        if not containers:
            problems.append(f"{path}.template.spec.containers must be specified")
        for index, container in enumerate(containers):
            if not container.get("image"):
                problems.append(f"{path}.template.spec.containers[{index}].image is required")
        if not any(container.get("name") == TRAINER_CONTAINER for container in containers):
            problems.append(
                f"{path}.template.spec.containers: no container named {TRAINER_CONTAINER!r}; "
                f"the operator requires one (it is the container that gets TF_CONFIG)"
            )
        longest = f"{name}-{replica_type.lower()}-{max(0, int((spec or {}).get('replicas') or 1) - 1)}"
        if len(longest) > DNS_LABEL_MAX:
            problems.append(f"pod name {longest!r} is longer than {DNS_LABEL_MAX} characters: shorten JOB_NAME")
    if sum(rtype in specs for rtype in CHIEF_TYPES) > 1:
        problems.append("spec.tfReplicaSpecs must not have more than 1 Chief or Master role")
    return problems
