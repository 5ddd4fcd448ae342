"""The rendered manifests (`kubectl kustomize <dir>` or a file), and the objects run-local uses from them: the
engine's object (a TFJob, a JobSet, or the JobSet Trainer v2 makes of a TrainJob), its ConfigMaps, the batch Jobs."""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from scripts.common.manifest import ENGINE_KINDS, ManifestError

from .engine_modules import local_run


@dataclasses.dataclass
class Manifests:
    job: dict[str, Any]  # the engine's object that runs the group (a TFJob, a JobSet)
    config_maps: dict[str, dict[str, Any]]
    jobs: list[dict[str, Any]]
    made_from: dict[str, Any] | None = None  # the object `job` was made from (a TrainJob), if any

    @property
    def kind(self) -> str:
        return self.job["kind"]

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
    """Picks the one engine's object (a TFJob, a JobSet, a TrainJob made into its JobSet), the ConfigMaps it may
    reference, and the batch Jobs."""
    engines = [d for d in docs if d.get("kind") in ENGINE_KINDS]
    if len(engines) != 1:
        kinds = ", ".join(d["kind"] for d in engines) or "none"
        raise ManifestError(f"{source}: expected exactly one {' or '.join(ENGINE_KINDS)}, found {kinds}")
    engine, made_from = engines[0], None
    as_run = getattr(local_run(engine["kind"]), "as_run", None)
    if as_run is not None:
        made_from, engine = engine, as_run(engine, docs)
    manifests = Manifests(job=engine, config_maps={}, jobs=[], made_from=made_from)
    for doc in docs:
        kind, name = doc.get("kind"), (doc.get("metadata") or {}).get("name", "")
        if kind == "ConfigMap":
            manifests.config_maps[name] = doc
        elif kind == "Job" and str(doc.get("apiVersion", "")).startswith("batch/"):
            manifests.jobs.append(doc)
    local_run(manifests.kind).validate(manifests.job)
    return manifests
