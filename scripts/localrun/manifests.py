"""The rendered manifests (`kubectl kustomize <dir>` or a file), and the objects run-local uses from them."""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from scripts.common import manifest as tfjob_manifest
from scripts.common.manifest import CHIEF_TYPES, ManifestError

RESTART_POLICIES = ("Never", "OnFailure", "Always", "ExitCode")


@dataclasses.dataclass
class Manifests:
    tfjob: dict[str, Any]
    config_maps: dict[str, dict[str, Any]]
    jobs: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return self.tfjob["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.tfjob["metadata"].get("namespace") or "default"


def load_text(text: str, source: str) -> list[dict[str, Any]]:
    """The objects of a rendered YAML stream."""
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc]
    except yaml.YAMLError as error:
        raise ManifestError(f"{source}: not valid YAML: {error}") from None


def parse(docs: list[dict[str, Any]], source: str) -> Manifests:
    """Picks the one TFJob, the ConfigMaps it may reference, and the batch Jobs."""
    tfjobs = [d for d in docs if d.get("kind") == "TFJob"]
    if len(tfjobs) != 1:
        raise ManifestError(f"{source}: expected exactly one object of kind TFJob, found {len(tfjobs)}")
    manifests = Manifests(tfjob=tfjobs[0], config_maps={}, jobs=[])
    for doc in docs:
        kind, name = doc.get("kind"), (doc.get("metadata") or {}).get("name", "")
        if kind == "ConfigMap":
            manifests.config_maps[name] = doc
        elif kind == "Job" and str(doc.get("apiVersion", "")).startswith("batch/"):
            manifests.jobs.append(doc)
    validate(manifests.tfjob)
    return manifests


def replica_specs(tfjob: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return tfjob.get("spec", {}).get("tfReplicaSpecs") or {}


def replica_count(spec: dict[str, Any]) -> int:
    """The operator's defaulting: an unset replicas means 1."""
    return int(spec.get("replicas", 1))


def validate(tfjob: dict[str, Any]) -> None:
    """The training operator's admission webhook rules, so a job the cluster would reject fails here too,
    and the replica counts and restart policies run-local can run."""
    problems = tfjob_manifest.webhook_problems(tfjob)
    for rtype, spec in replica_specs(tfjob).items():
        path = f"spec.tfReplicaSpecs.{rtype}"
        if replica_count(spec) < 0:
            problems.append(f"{path}.replicas must not be negative")
        if rtype in CHIEF_TYPES and replica_count(spec) > 1:
            problems.append(f"{path}.replicas must be 0 or 1: a job has at most one {rtype}")
        policy = spec.get("restartPolicy", "Never")
        if policy not in RESTART_POLICIES:
            problems.append(f"{path}.restartPolicy {policy!r}: use Never, OnFailure, Always or ExitCode")
    if problems:
        name = (tfjob.get("metadata") or {}).get("name", "")
        raise ManifestError(f"TFJob {name} cannot run:\n  " + "\n  ".join(problems))
