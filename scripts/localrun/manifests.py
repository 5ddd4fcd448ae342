"""The rendered manifests (`kubectl kustomize <dir>` or a file), and the objects run-local uses from them: the
engine's object (a TFJob, a JobSet, or the JobSet Trainer v2 makes of a TrainJob), its ConfigMaps, the batch Jobs."""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from scripts.common import manifest as tfjob_manifest
from scripts.common.manifest import CHIEF_TYPES, ENGINE_KINDS, ManifestError

from . import trainjob as trainjob_rules
from .jobset_rules import ACTIONS, POD_FAILURE_ACTIONS

RESTART_POLICIES = ("Never", "OnFailure", "Always", "ExitCode")


@dataclasses.dataclass
class Manifests:
    job: dict[str, Any]  # the TFJob or JobSet that runs the group
    config_maps: dict[str, dict[str, Any]]
    jobs: list[dict[str, Any]]
    trainjob: dict[str, Any] | None = None  # the TrainJob that `job` was made from, if any

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
    engine, trainjob = engines[0], None
    if engine["kind"] == "TrainJob":
        trainjob, engine = engine, trainjob_rules.jobset_for(engine, trainjob_rules.find_runtime(engine, docs))
    manifests = Manifests(job=engine, config_maps={}, jobs=[], trainjob=trainjob)
    for doc in docs:
        kind, name = doc.get("kind"), (doc.get("metadata") or {}).get("name", "")
        if kind == "ConfigMap":
            manifests.config_maps[name] = doc
        elif kind == "Job" and str(doc.get("apiVersion", "")).startswith("batch/"):
            manifests.jobs.append(doc)
    if manifests.kind == "TFJob":
        validate(manifests.job)
    else:
        validate_jobset(manifests.job)
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


# What run-local emulates of a JobSet (fields outside these stop the run with "not supported locally").
JOBSET_SPEC_FIELDS = (
    "replicatedJobs",
    "network",
    "successPolicy",
    "failurePolicy",
    "startupPolicy",
    "suspend",
    "ttlSecondsAfterFinished",
)
JOB_SPEC_FIELDS = (
    "completionMode",
    "parallelism",
    "completions",
    "backoffLimit",
    "activeDeadlineSeconds",
    "podFailurePolicy",
    "template",
    "ttlSecondsAfterFinished",
)
JOBSET_RESTART_POLICIES = ("Never", "OnFailure")


def validate_jobset(jobset: dict[str, Any]) -> None:
    """The JobSet fields and values run-local emulates; anything else stops the run with "not supported locally"."""
    name = jobset["metadata"]["name"]
    spec = jobset.get("spec") or {}
    where = f"JobSet {name}"
    problems = [
        f"not supported locally: spec.{field} (in {where})" for field in spec if field not in JOBSET_SPEC_FIELDS
    ]
    if spec.get("suspend"):
        problems.append(f"{where} has spec.suspend: true; JobSet would start no pod")
    if (spec.get("startupPolicy") or {}).get("startupPolicyOrder", "AnyOrder") != "AnyOrder":
        problems.append(f"not supported locally: spec.startupPolicy.startupPolicyOrder InOrder (in {where})")
    network = spec.get("network") or {}
    if network.get("enableDNSHostnames") is False:
        problems.append(
            f"{where}: network.enableDNSHostnames is false, so pods get no DNS names and the trainer cannot build "
            f"its group from them; remove it (JobSet's default is true)"
        )
    for index, rule in enumerate((spec.get("failurePolicy") or {}).get("rules") or []):
        if rule.get("action") not in ACTIONS:
            problems.append(
                f"not supported locally: spec.failurePolicy.rules[{index}].action {rule.get('action')} (in {where})"
            )
    if (spec.get("failurePolicy") or {}).get("restartStrategy", "Recreate") not in ("Recreate", "BlockingRecreate"):
        problems.append(f"not supported locally: spec.failurePolicy.restartStrategy (in {where})")
    for rjob in spec.get("replicatedJobs") or []:
        path = f"{where} replicatedJobs[{rjob.get('name')}]"
        job_spec = rjob["template"]["spec"]
        problems += [f"not supported locally: {f} (in {path})" for f in job_spec if f not in JOB_SPEC_FIELDS]
        if job_spec.get("completionMode", "Indexed") != "Indexed":
            problems.append(f"not supported locally: completionMode {job_spec['completionMode']} (in {path})")
        if int(job_spec.get("completions", job_spec.get("parallelism", 1))) != int(job_spec.get("parallelism", 1)):
            problems.append(f"not supported locally: completions other than parallelism (in {path})")
        policy = job_spec["template"]["spec"].get("restartPolicy", "OnFailure")  # JobSet's webhook default
        if policy not in JOBSET_RESTART_POLICIES:
            problems.append(f"{path}: a Job's pods have restartPolicy Never or OnFailure, not {policy}")
        rules = (job_spec.get("podFailurePolicy") or {}).get("rules") or []
        if rules and policy != "Never":
            problems.append(
                f"{path}: podFailurePolicy needs the pod's restartPolicy Never (Kubernetes rejects the Job)"
            )
        for index, rule in enumerate(rules):
            if "onPodConditions" in rule or rule.get("action") not in POD_FAILURE_ACTIONS:
                problems.append(
                    f"not supported locally: podFailurePolicy.rules[{index}] (in {path}): only FailJob, "
                    f"Ignore and Count on onExitCodes are"
                )
    if problems:
        raise ManifestError(f"JobSet {name} cannot run:\n  " + "\n  ".join(problems))
