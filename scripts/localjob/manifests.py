"""The rendered manifests: `kubectl kustomize <dir>` (or a file), and the objects run-local uses from them."""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil
import subprocess
from typing import Any

import yaml

from .tfconfig import CHIEF_TYPES, REPLICA_TYPES

_DNS1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DEFAULT_CONTAINER = "tensorflow"


class ManifestError(ValueError):
    """The manifests cannot be run; the message names the object, the field and the fix."""


@dataclasses.dataclass
class Manifests:
    tfjob: dict[str, Any]
    config_maps: dict[str, dict[str, Any]]
    secrets: dict[str, dict[str, Any]]
    jobs: list[dict[str, Any]]
    others: list[str]  # kind/name of objects with no local role, to say so

    @property
    def name(self) -> str:
        return self.tfjob["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.tfjob["metadata"].get("namespace") or "default"


def render(kustomize_dir: pathlib.Path) -> str:
    """The output of `kubectl kustomize DIR`, the same renderer `kubectl apply -k` uses."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise ManifestError("kubectl is not installed, so the kustomization cannot be rendered: install kubectl "
                            "(https://kubernetes.io/docs/tasks/tools/) or pass --manifest FILE with rendered YAML")
    if not (kustomize_dir / "kustomization.yaml").exists():
        raise ManifestError(f"{kustomize_dir}/kustomization.yaml does not exist: pass --kustomize DIR "
                            f"or --manifest FILE with rendered YAML")
    result = subprocess.run([kubectl, "kustomize", str(kustomize_dir)], capture_output=True, text=True)
    if result.returncode != 0:
        raise ManifestError(f"kubectl kustomize {kustomize_dir} failed:\n{result.stderr.strip()}")
    return result.stdout


def parse(text: str, source: str) -> Manifests:
    """Picks the one TFJob, the ConfigMaps and Secrets it may reference, and the batch Jobs."""
    try:
        docs = [doc for doc in yaml.safe_load_all(text) if doc]
    except yaml.YAMLError as error:
        raise ManifestError(f"{source}: not valid YAML: {error}") from None
    tfjobs = [d for d in docs if d.get("kind") == "TFJob"]
    if len(tfjobs) != 1:
        raise ManifestError(f"{source}: expected exactly one object of kind TFJob, found {len(tfjobs)}")
    manifests = Manifests(tfjob=tfjobs[0], config_maps={}, secrets={}, jobs=[], others=[])
    for doc in docs:
        kind, name = doc.get("kind"), (doc.get("metadata") or {}).get("name", "")
        if kind == "ConfigMap":
            manifests.config_maps[name] = doc
        elif kind == "Secret":
            manifests.secrets[name] = doc
        elif kind == "Job" and str(doc.get("apiVersion", "")).startswith("batch/"):
            manifests.jobs.append(doc)
        elif kind != "TFJob":
            manifests.others.append(f"{kind}/{name}")
    validate(manifests.tfjob)
    return manifests


def replica_specs(tfjob: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return tfjob.get("spec", {}).get("tfReplicaSpecs") or {}


def replica_count(spec: dict[str, Any]) -> int:
    """The operator's defaulting: an unset replicas means 1."""
    return int(spec.get("replicas", 1))


def validate(tfjob: dict[str, Any]) -> None:
    """The training operator's admission webhook rules, so a job the cluster would reject fails here too."""
    name = (tfjob.get("metadata") or {}).get("name", "")
    if not _DNS1035.match(name) or len(name) > 63:
        raise ManifestError(f"TFJob name {name!r} is not a DNS-1035 label (lower-case letters, digits and '-', "
                            f"starting with a letter, at most 63 characters); the operator's webhook rejects it")
    specs = replica_specs(tfjob)
    if not specs:
        raise ManifestError(f"TFJob {name}: spec.tfReplicaSpecs is empty; add a Worker replica spec")
    for rtype, spec in specs.items():
        where = f"TFJob {name}: tfReplicaSpecs.{rtype}"
        if rtype not in REPLICA_TYPES:
            raise ManifestError(f"{where}: unknown replica type; use one of {', '.join(REPLICA_TYPES)}")
        if replica_count(spec) < 0:
            raise ManifestError(f"{where}.replicas must not be negative")
        if rtype in CHIEF_TYPES and replica_count(spec) > 1:
            raise ManifestError(f"{where}.replicas must be 0 or 1: a job has at most one {rtype}")
        policy = spec.get("restartPolicy", "Never")
        if policy not in ("Never", "OnFailure", "Always", "ExitCode"):
            raise ManifestError(f"{where}.restartPolicy {policy!r}: use Never, OnFailure, Always or ExitCode")
        containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
        if not any(c.get("name") == DEFAULT_CONTAINER for c in containers):
            raise ManifestError(f"{where}: no container named {DEFAULT_CONTAINER!r}; the operator requires one "
                                f"(it is the container that gets TF_CONFIG)")
        for container in containers:
            if not container.get("image"):
                raise ManifestError(f"{where}: container {container.get('name')!r} has no image")
    if sum(replica_count(specs[t]) for t in CHIEF_TYPES if t in specs) > 1:
        raise ManifestError(f"TFJob {name}: both Chief and Master replicas; keep one (Chief for MultiWorkerMirroredStrategy)")
