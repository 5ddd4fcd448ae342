"""The rendered k8s/ kustomization: what the cluster runs, and what submit.py creates from it.

`render()` runs the real renderer (`kubectl kustomize k8s`); `customize()` applies the
command line (image, worker count, dataset, trainer flags) to the rendered objects;
`to_tfjob()` turns the TFJob document into the Kubeflow SDK's model and `request_body()`
gives the exact JSON the SDK sends; `webhook_problems()` applies the training
operator's admission rules before anything reaches a cluster.
"""

from __future__ import annotations

import copy
import json
import pathlib
import re
import shutil
import subprocess
from typing import Any, Iterable

import yaml

import project_settings

ROOT = pathlib.Path(__file__).resolve().parent.parent
K8S_DIR = ROOT / "k8s"
TFJOB_CONTAINER = "tensorflow"
# The operator's DNS-1035 label rule for job names (apimachinery NameIsDNS1035Label).
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX = 63
# The tfReplicaSpecs keys the operator knows, in the order run-local starts them (a chief first).
REPLICA_TYPES = ("Chief", "Master", "PS", "Worker", "Evaluator")
CHIEF_TYPES = ("Chief", "Master")

Manifest = dict[str, Any]


class ManifestError(RuntimeError):
    """The kustomization cannot be rendered or does not hold what submit.py needs."""


def render_text(k8s_dir: pathlib.Path = K8S_DIR) -> str:
    """The YAML `kubectl kustomize k8s_dir` prints, the renderer `kubectl apply -k` uses."""
    if shutil.which("kubectl") is None:
        raise ManifestError(
            "kubectl is not on PATH; install it (https://kubernetes.io/docs/tasks/tools/) "
            "to render k8s/ and talk to the cluster")
    # settings.env overridden from the environment (make exports its values): a copy holds the overrides.
    with project_settings.kustomization(k8s_dir) as effective_dir:
        result = subprocess.run(["kubectl", "kustomize", str(effective_dir)], capture_output=True, text=True)
    if result.returncode != 0:
        raise ManifestError(f"kubectl kustomize {k8s_dir} failed:\n{result.stderr.strip()}")
    return result.stdout


def render(k8s_dir: pathlib.Path = K8S_DIR) -> list[Manifest]:
    """Every object `kubectl kustomize k8s_dir` renders, in its order."""
    return [doc for doc in yaml.safe_load_all(render_text(k8s_dir)) if doc]


def of_kind(objects: Iterable[Manifest], kind: str) -> list[Manifest]:
    return [obj for obj in objects if obj.get("kind") == kind]


def the_one(objects: Iterable[Manifest], kind: str, component: str | None = None) -> Manifest:
    """The single object of `kind` (and app.kubernetes.io/component label, if given)."""
    found = [obj for obj in of_kind(objects, kind)
             if component is None or obj["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component]
    if len(found) != 1:
        which = f"{kind}" + (f" with component {component}" if component else "")
        raise ManifestError(f"k8s/ must render exactly one {which}, found {len(found)}")
    return found[0]


def pod_templates(obj: Manifest) -> list[Manifest]:
    """The pod templates inside a Job, Deployment or TFJob."""
    if obj["kind"] == "TFJob":
        return [spec["template"] for spec in obj["spec"]["tfReplicaSpecs"].values()]
    if obj["kind"] in ("Job", "Deployment"):
        return [obj["spec"]["template"]]
    return []


def _set_env(container: Manifest, name: str, value: str) -> None:
    for entry in container.setdefault("env", []):
        if entry["name"] == name:
            entry["value"] = value
            return
    container["env"].append({"name": name, "value": value})


def customize(objects: list[Manifest], image: str, workers: int, dataset: str,
              trainer_args: list[str]) -> list[Manifest]:
    """A copy of the rendered objects with the command line applied.

    The image goes into every container; the dataset into every container that reads
    TRAINER_DATASET (the data-preparation Job and the trainer), so both always agree.
    """
    if workers < 1:
        raise ManifestError(f"--workers must be at least 1, got {workers}")
    if not image:
        raise ManifestError("--image is empty; pass the image `make image` built, e.g. --image name:tag")
    result = copy.deepcopy(objects)
    for obj in result:
        for template in pod_templates(obj):
            for container in template["spec"]["containers"]:
                container["image"] = image
                if any(entry["name"] == "TRAINER_DATASET" for entry in container.get("env", [])):
                    _set_env(container, "TRAINER_DATASET", dataset)
    tfjob = the_one(result, "TFJob")
    worker = tfjob["spec"]["tfReplicaSpecs"]["Worker"]
    worker["replicas"] = workers
    trainer = tensorflow_container(worker["template"])
    trainer["args"] = list(trainer.get("args") or []) + list(trainer_args)
    return result


def tensorflow_container(template: Manifest) -> Manifest:
    """The `tensorflow` container of a replica's pod template: the one the operator gives TF_CONFIG."""
    for container in template["spec"]["containers"]:
        if container.get("name") == TFJOB_CONTAINER:
            return container
    raise ManifestError(f"pod template has no container named {TFJOB_CONTAINER!r}")


def trainer_container(tfjob: Manifest) -> Manifest:
    """The `tensorflow` container of the TFJob's Worker replicas."""
    return tensorflow_container(tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"])


def to_tfjob(document: Manifest):
    """The TFJob document as the SDK's KubeflowOrgV1TFJob (unknown fields would be dropped)."""
    from kubeflow.training import ApiClient
    from kubeflow.training.utils.utils import FakeResponse

    if document.get("apiVersion") != "kubeflow.org/v1" or document.get("kind") != "TFJob":
        raise ManifestError(f"expected a kubeflow.org/v1 TFJob, got {document.get('apiVersion')} {document.get('kind')}")
    return ApiClient().deserialize(FakeResponse(document), "KubeflowOrgV1TFJob")


def request_body(tfjob_model) -> Manifest:
    """The JSON body TrainingClient.create_job sends (the kubernetes client's serializer)."""
    import kubernetes.client

    return json.loads(json.dumps(kubernetes.client.ApiClient().sanitize_for_serialization(tfjob_model)))


def webhook_problems(document: Manifest) -> list[str]:
    """Why the training operator's TFJob admission webhook (v1.9) would reject this, if it would.

    Its rules: the name is a DNS-1035 label; tfReplicaSpecs exists; every replica type has
    containers, each with an image, one of them named `tensorflow`; at most one of Chief and
    Master. One more rule of ours: pod and service names `<job>-<type>-<index>` are DNS labels too.
    """
    problems = []
    name = document.get("metadata", {}).get("name", "")
    if not DNS_1035_LABEL.match(name) or len(name) > DNS_LABEL_MAX:
        problems.append(f"metadata.name {name!r} is not a DNS-1035 label (a-z, 0-9, '-', starts with a letter, "
                        f"at most {DNS_LABEL_MAX} characters): set JOB_NAME in k8s/settings.env")
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
        if not any(container.get("name") == TFJOB_CONTAINER for container in containers):
            problems.append(f"{path}.template.spec.containers: no container named {TFJOB_CONTAINER!r}; "
                            f"the operator requires one (it is the container that gets TF_CONFIG)")
        longest = f"{name}-{replica_type.lower()}-{max(0, int((spec or {}).get('replicas') or 1) - 1)}"
        if len(longest) > DNS_LABEL_MAX:
            problems.append(f"pod name {longest!r} is longer than {DNS_LABEL_MAX} characters: shorten JOB_NAME")
    if sum(rtype in specs for rtype in CHIEF_TYPES) > 1:
        problems.append("spec.tfReplicaSpecs must not have more than 1 Chief or Master role")
    return problems
