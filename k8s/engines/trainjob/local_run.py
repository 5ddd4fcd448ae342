"""The local runner's part of a TrainJob (scripts/localrun/ finds it here by the engine's folder): the JobSet that
Kubeflow Trainer v2 makes from a TrainJob and its runtime, for what run-local supports; the JobSet's own part
(k8s/engines/jobset/local_run.py) then runs it.

Source: kubeflow/trainer v2.3.0. pkg/runtime/core/trainingruntime.go newRuntimeInfo: the runtime's JobSet template
is the start; each replicated job is a pod set whose count is its parallelism (default 1), the trainer's (label
trainer.kubeflow.org/trainjob-ancestor-step: trainer) mlPolicy.numNodes; resourcesPerNode merges into the `node`
container's resources. plugins/plainml/plainml.go EnforceMLPolicy: the TrainJob's numNodes replaces the trainer's
count, its env is upserted into the `node` container. plugins/jobset/jobset.go SyncParallelCount (parallelism =
completions = count) and Build; plugins/jobset/builder.go Trainer: the trainer Job gets replicas 1 and the
TrainJob's image, command and args replace the `node` container's. The JobSet is named after the TrainJob.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from scripts.common.manifest import Manifest, ManifestError, the_one

ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TRAINER_ANCESTOR = "trainer"
NODE = "node"
RUNTIME_KINDS = ("TrainingRuntime", "ClusterTrainingRuntime")
# The TrainJob fields run-local applies; any other set field stops the run.
TRAINER_FIELDS = ("image", "command", "args", "env", "numNodes", "resourcesPerNode")
SPEC_FIELDS = ("runtimeRef", "trainer")


def _unsupported(field: str, trainjob: str) -> ManifestError:
    return ManifestError(f"not supported locally: {field} (in TrainJob {trainjob})")


def _upsert_env(env: list[dict[str, Any]], overrides: list[Mapping[str, Any]]) -> None:
    """apply.UpsertEnvVars: a variable of the same name is replaced in place, a new one appended."""
    for item in overrides:
        for index, existing in enumerate(env):
            if existing.get("name") == item.get("name"):
                env[index] = dict(item)
                break
        else:
            env.append(dict(item))


def _merge_resources(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """MergeResourceRequirements: the TrainJob's limits and requests win, key by key, over the runtime's."""
    merged = {key: dict(value) for key, value in base.items()}
    for key in ("limits", "requests"):
        if overrides.get(key):
            merged.setdefault(key, {}).update(overrides[key])
    return merged


def find_runtime(trainjob: Mapping[str, Any], objects: list[Mapping[str, Any]], missing: str = "") -> Mapping[str, Any]:
    """The TrainingRuntime or ClusterTrainingRuntime the TrainJob names, from the same manifests; `missing` ends the
    message when they do not hold it."""
    ref = trainjob["spec"].get("runtimeRef") or {}
    kind = ref.get("kind") or "ClusterTrainingRuntime"  # Trainer v2's default
    name = trainjob["metadata"]["name"]
    if kind not in RUNTIME_KINDS:
        raise ManifestError(
            f"TrainJob {name}: runtimeRef.kind {kind!r} is not a TrainingRuntime or ClusterTrainingRuntime"
        )
    for obj in objects:
        if obj.get("kind") == kind and obj["metadata"].get("name") == ref.get("name"):
            return obj
    raise ManifestError(f"TrainJob {name} names {kind} {ref.get('name')!r}, which the manifests do not hold{missing}")


def runtime_of(objects: list[Manifest]) -> Manifest:
    """The runtime the manifests' one TrainJob names."""
    return find_runtime(the_one(objects, "TrainJob"), objects)


def jobset_for(trainjob: Mapping[str, Any], runtime: Mapping[str, Any]) -> dict[str, Any]:
    """The JobSet Trainer v2 creates for `trainjob` from `runtime` (plainML runtimes only)."""
    name = trainjob["metadata"]["name"]
    spec = trainjob.get("spec") or {}
    for field in spec:
        if field not in SPEC_FIELDS:
            raise _unsupported(f"spec.{field}", name)
    overrides = spec.get("trainer") or {}
    for field in overrides:
        if field not in TRAINER_FIELDS:
            raise _unsupported(f"spec.trainer.{field}", name)
    policy = runtime["spec"].get("mlPolicy") or {}
    if set(policy) - {"numNodes"}:
        others = ", ".join(sorted(set(policy) - {"numNodes"}))
        raise _unsupported(f"{runtime['kind']} {runtime['metadata']['name']} mlPolicy.{others} (only plainML)", name)
    template = copy.deepcopy(runtime["spec"].get("template") or {})
    jobset_spec = template.get("spec") or {}
    trainers = 0
    for rjob in jobset_spec.get("replicatedJobs") or []:
        job_template = rjob["template"]
        job_spec = job_template["spec"]
        ancestor = ((job_template.get("metadata") or {}).get("labels") or {}).get(ANCESTOR_LABEL)
        count = job_spec.get("parallelism", 1)
        if ancestor == TRAINER_ANCESTOR:
            trainers += 1
            count = overrides.get("numNodes", policy.get("numNodes", 1))
            rjob["replicas"] = 1
            for container in job_spec["template"]["spec"]["containers"]:
                if container.get("name") != NODE:
                    continue
                for field in ("image", "command", "args"):
                    if field in overrides:
                        container[field] = copy.deepcopy(overrides[field])
                if "env" in overrides:
                    _upsert_env(container.setdefault("env", []), overrides["env"])
                if "resourcesPerNode" in overrides:
                    container["resources"] = _merge_resources(
                        container.get("resources") or {}, overrides["resourcesPerNode"]
                    )
        job_spec["parallelism"] = job_spec["completions"] = int(count)
    if trainers != 1:
        raise ManifestError(
            f"{runtime['kind']} {runtime['metadata']['name']}: expected one replicated job labelled "
            f"{ANCESTOR_LABEL}: {TRAINER_ANCESTOR} (Trainer v2's trainer Job), found {trainers}"
        )
    metadata = template.get("metadata") or {}
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {
            "name": name,
            "namespace": trainjob["metadata"].get("namespace") or "default",
            "labels": dict(metadata.get("labels") or {}),
            "annotations": dict(metadata.get("annotations") or {}),
        },
        "spec": jobset_spec,
    }


def as_run(trainjob: dict[str, Any], objects: list[dict[str, Any]]) -> dict[str, Any]:
    """The JobSet that runs the TrainJob: Trainer's, from the TrainJob and the runtime it names."""
    local = ": run-local runs the runtime it renders (a runtime installed on a cluster is not supported locally)"
    return jobset_for(trainjob, find_runtime(trainjob, objects, missing=local))


def describe(trainjob: Mapping[str, Any], jobset: Mapping[str, Any]) -> str:
    return (
        f"TrainJob {trainjob['metadata'].get('namespace') or 'default'}/{trainjob['metadata']['name']}: runs as the "
        f"JobSet {jobset['metadata']['name']} that Kubeflow Trainer v2 makes of it and its runtime "
        f"{trainjob['spec']['runtimeRef'].get('name')}"
    )
