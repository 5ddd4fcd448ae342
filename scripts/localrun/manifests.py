"""The rendered manifests (`kubectl kustomize <dir>` or a file), and the objects run-local uses from them: the
engine's object (a TFJob, a JobSet, or the JobSet Trainer v2 makes of a TrainJob), its ConfigMaps, the batch Jobs."""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from k8s.engines.tfjob.admission import webhook_problems
from scripts.common.manifest import CHIEF_TYPES, ENGINE_KINDS, ManifestError

from .engine_modules import local_run

RESTART_POLICIES = ("Never", "OnFailure", "Always", "ExitCode")


@dataclasses.dataclass
class Manifests:
    job: dict[str, Any]  # the TFJob or JobSet that runs the group
    config_maps: dict[str, dict[str, Any]]
    jobs: list[dict[str, Any]]
    made_from: dict[str, Any] | None = None  # the object `job` was made from (a TrainJob), if any

    @property
    def kind(self) -> str:
        return self.job["kind"]

    @property
    def tfjob(self) -> dict[str, Any]:
        assert self.kind == "TFJob", self.kind
        return self.job

    @property
    def name(self) -> str:
        return self.job["metadata"]["name"]

    @property
    def namespace(self) -> str:
        return self.job["metadata"].get("namespace") or "default"


def load_text(text: str, source: str) -> list[dict[str, Any]]:
    """The objects of a rendered YAML stream."""
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc]
    except yaml.YAMLError as error:
        raise ManifestError(f"{source}: not valid YAML: {error}") from None


def parse(docs: list[dict[str, Any]], source: str) -> Manifests:
    """Picks the one TFJob, JobSet or TrainJob (made into its JobSet), the ConfigMaps it may reference, and the
    batch Jobs."""
    engines = [d for d in docs if d.get("kind") in ENGINE_KINDS]
    if len(engines) != 1:
        kinds = ", ".join(d["kind"] for d in engines) or "none"
        raise ManifestError(f"{source}: expected exactly one TFJob, JobSet or TrainJob, found {kinds}")
    engine, made_from = engines[0], None
    as_run = getattr(local_run(engine["kind"]), "as_run", None) if engine["kind"] != "TFJob" else None
    if as_run is not None:
        made_from, engine = engine, as_run(engine, docs)
    manifests = Manifests(job=engine, config_maps={}, jobs=[], made_from=made_from)
    for doc in docs:
        kind, name = doc.get("kind"), (doc.get("metadata") or {}).get("name", "")
        if kind == "ConfigMap":
            manifests.config_maps[name] = doc
        elif kind == "Job" and str(doc.get("apiVersion", "")).startswith("batch/"):
            manifests.jobs.append(doc)
    if manifests.kind == "TFJob":
        validate(manifests.job)
    else:
        local_run(manifests.kind).validate(manifests.job)
    return manifests


def replica_specs(tfjob: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return tfjob.get("spec", {}).get("tfReplicaSpecs") or {}


def replica_count(spec: dict[str, Any]) -> int:
    """The operator's defaulting: an unset replicas means 1."""
    return int(spec.get("replicas", 1))


def validate(tfjob: dict[str, Any]) -> None:
    """The training operator's admission webhook rules, so a job the cluster would reject fails here too,
    and the replica counts and restart policies run-local can run."""
    problems = webhook_problems(tfjob)
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
