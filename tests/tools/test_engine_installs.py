"""What `make k3d-up` applies from k8s/engines, rendered with kubectl's kustomize: each upstream source (a GitHub
kustomization at a pinned commit) is replaced by a small local stand-in that holds what the real one brings and
these kustomizations change: its Namespace, its controller Deployment and that Deployment's image as the source at
the tag names it. The real sources were rendered the same way at their commits when the pins were recorded
(docs/security.md); CI has no network to fetch them.
"""

from __future__ import annotations

import copy
import os
import pathlib
import re
import shutil
import subprocess

import pytest
import yaml

import engines_here
from scripts.common import settings as project_settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
SETTINGS = project_settings.load_file()

# Each upstream source: its namespace (None: the kustomization above sets it) and controller image at the tag.
UPSTREAM = {
    "github.com/kubernetes-sigs/jobset.git/config/default": (
        "jobset-system",
        "us-central1-docker.pkg.dev/k8s-staging-images/jobset/jobset:v0.12.0",
    ),
    "github.com/kubernetes-sigs/kueue.git/config/default": (
        "kueue-system",
        "us-central1-docker.pkg.dev/k8s-staging-images/kueue/kueue:main",
    ),
    "github.com/argoproj/argo-workflows.git/manifests/cluster-install": (
        "argo",
        "quay.io/argoproj/workflow-controller:latest",
    ),
    "github.com/kubeflow/trainer.git/manifests/base/manager": (
        None,
        "ghcr.io/kubeflow/trainer/trainer-controller-manager:latest",
    ),
}


def stand_in(directory: pathlib.Path, source: str) -> None:
    """A kustomization in `directory` for `source`: a ConfigMap named after it (e.g. default-jobset), and the
    Namespace and controller Deployment UPSTREAM lists for it."""
    name = source.rstrip("/").split("/")[-1] + "-" + source.split("/")[2].split(".")[0]
    namespace, image = UPSTREAM.get(source, (None, None))
    objects: list[dict] = [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}}]
    if namespace:
        objects.insert(0, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        objects[1]["metadata"]["namespace"] = namespace
    if image:
        labels = {"app": name}
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name, **({"namespace": namespace} if namespace else {})},
            "spec": {
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {"containers": [{"name": "manager", "image": image}]},
                },
            },
        }
        objects.append(deployment)
        if source.endswith("cluster-install"):  # Argo's second :latest image, its server
            server = copy.deepcopy(deployment)
            server["metadata"]["name"] = "argo-server"
            server["spec"]["template"]["spec"]["containers"][0]["image"] = "quay.io/argoproj/argocli:latest"
            objects.append(server)
    directory.mkdir(parents=True)
    (directory / "objects.yaml").write_text(yaml.safe_dump_all(objects))
    (directory / "kustomization.yaml").write_text("resources:\n  - objects.yaml\n")


@pytest.fixture(scope="module")
def engines(tmp_path_factory) -> pathlib.Path:
    """A copy of k8s/engines whose remote sources are local stand-ins."""
    root = tmp_path_factory.mktemp("engines")
    shutil.copytree(ROOT / "k8s" / "engines", root / "engines")
    for kustomization in (root / "engines").rglob("kustomization.yaml"):
        text = kustomization.read_text()
        for remote, placeholder in re.findall(r"(github\.com/\S+)\?ref=(\S+)", text):
            local = root / "upstream" / remote.replace("/", "_")
            if not local.exists():
                stand_in(local, remote)
            text = text.replace(f"{remote}?ref={placeholder}", os.path.relpath(local, kustomization.parent))
        kustomization.write_text(text)
    return root / "engines"


def render(engines: pathlib.Path, name: str) -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.fail("kubectl is not installed; it renders k8s/ (https://kubernetes.io/docs/tasks/tools/)")
    result = subprocess.run(["kubectl", "kustomize", str(engines / name)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def images(objects: list[dict]) -> dict[str, str]:
    return {
        obj["metadata"]["name"]: obj["spec"]["template"]["spec"]["containers"][0]["image"]
        for obj in objects
        if obj["kind"] == "Deployment"
    }


def namespaces(objects: list[dict]) -> list[str]:
    return sorted(obj["metadata"]["name"] for obj in objects if obj["kind"] == "Namespace")


@engines_here.needs("jobset", "trainjob")
def test_trainer_keeps_its_own_namespace_and_runs_jobset_in_it(engines):
    objects = render(engines, "trainjob")
    # JobSet's Namespace goes; kubeflow-system, which every other object lives in, stays.
    assert namespaces(objects) == ["kubeflow-system"]
    assert {obj["metadata"].get("namespace") for obj in objects if obj["kind"] != "Namespace"} == {"kubeflow-system"}
    assert sorted(images(objects).values()) == [
        f"ghcr.io/kubeflow/trainer/trainer-controller-manager:{SETTINGS['KUBEFLOW_TRAINER_VERSION']}",
        f"registry.k8s.io/jobset/jobset:{SETTINGS['JOBSET_VERSION']}",
    ]


@engines_here.needs("jobset")
def test_jobset_alone_runs_the_release_image_in_its_namespace(engines):
    objects = render(engines, "jobset")
    assert namespaces(objects) == ["jobset-system"]
    assert list(images(objects).values()) == [f"registry.k8s.io/jobset/jobset:{SETTINGS['JOBSET_VERSION']}"]


def test_kueue_runs_the_release_image_not_the_moving_main(engines):
    assert list(images(render(engines, "kueue")).values()) == [
        f"registry.k8s.io/kueue/kueue:{SETTINGS['KUEUE_VERSION']}"
    ]


def test_argo_workflows_runs_the_release_images_not_latest(engines):
    version = SETTINGS["ARGO_WORKFLOWS_VERSION"]
    assert sorted(images(render(engines, "argo-workflows")).values()) == [
        f"quay.io/argoproj/argocli:{version}",
        f"quay.io/argoproj/workflow-controller:{version}",
    ]
