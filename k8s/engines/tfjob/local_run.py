"""The local runner's part of a TFJob (scripts/localrun/ finds it here by the engine's folder): what it emulates of a
TFJob (`validate`: the operator's admission rules and the replica counts and restart policies it runs), one process
per replica with the TF_CONFIG, names and labels the training operator v1.9 gives it (`plan`), and the operator's
rules over them (`rules`, local_rules.py's TFJobRules)."""

from __future__ import annotations

from typing import Any

from scripts.common import tfconfig
from scripts.common.manifest import CHIEF_TYPES, ManifestError
from scripts.common.ports import free_ports
from scripts.localrun.envvars import PodMeta
from scripts.localrun.manifests import Manifests
from scripts.localrun.operator_rules import Replica
from scripts.localrun.podplan import Planner, ProcessPlan

from .admission import REPLICA_TYPES, tensorflow_container, webhook_problems
from .customize import TRAINER_CONTAINER
from .local_rules import TFJobRules

PROCESS_NOUN = "replica"  # what run-local's console calls one process of a TFJob: the operator's word (else pod)
RESTART_POLICIES = ("Never", "OnFailure", "Always", "ExitCode")
# The port the operator puts in TF_CONFIG: each replica gets a loopback one there, not a free port of its own.
TFJOB_PORT_NAME = "tfjob-port"


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
    if ((tfjob.get("spec") or {}).get("runPolicy") or {}).get("suspend"):
        problems.append("spec.runPolicy.suspend is true; the operator would start no pod")
    if problems:
        name = (tfjob.get("metadata") or {}).get("name", "")
        raise ManifestError(f"TFJob {name} cannot run:\n  " + "\n  ".join(problems))


def operator_labels(job: str, rtype: str, index: int, is_chief: bool) -> dict[str, str]:
    """The labels the training operator puts on a TFJob's pod (kubeflow/trainer v1.9.4, pkg/controller.v1/common)."""
    labels = {
        "training.kubeflow.org/job-name": job,
        "training.kubeflow.org/replica-type": rtype.lower(),
        "training.kubeflow.org/replica-index": str(index),
        "training.kubeflow.org/operator-name": "tfjob-controller",
    }
    if is_chief:
        labels["training.kubeflow.org/job-role"] = "master"
    return labels


def plan(self: Planner) -> tuple[list[tuple[Replica, ProcessPlan]], None]:
    """One process per replica of the TFJob, with the TF_CONFIG the operator would give it (its rules need nothing
    more)."""
    tfjob, job = self.manifests.job, self.manifests.name
    specs = replica_specs(tfjob)
    counts = {rtype: replica_count(spec) for rtype, spec in specs.items()}
    tasks = [(rtype, i) for rtype, n in counts.items() for i in range(n)]
    ports = dict(zip(tasks, free_ports(len(tasks)), strict=True))
    address = lambda rtype, i: f"127.0.0.1:{ports[(rtype, i)]}"  # noqa: E731 (the operator's Service names, made local)
    chief = tfconfig.chief_of(counts)
    planned = []
    for rtype in REPLICA_TYPES:
        if not counts.get(rtype):
            continue
        spec = specs[rtype]
        pod_spec = spec["template"]["spec"]
        container = tensorflow_container(spec["template"])
        for other in pod_spec.get("initContainers", []) + pod_spec["containers"]:
            if other is not container:
                self.problems.notes.append(
                    f"TFJob {job} {rtype}: container {other.get('name')!r} is not "
                    f"run locally (only {TRAINER_CONTAINER!r} is)"
                )
        for index in range(counts[rtype]):
            replica = Replica(rtype=rtype, index=index, restart_policy=spec.get("restartPolicy", "Never"))
            pod_name = f"{job}-{rtype.lower()}-{index}"
            pod = PodMeta(
                name=pod_name,
                namespace=self.manifests.namespace,
                labels={
                    **(spec["template"].get("metadata") or {}).get("labels", {}),
                    **operator_labels(job, rtype, index, (rtype, index) == chief),
                },
                annotations=(spec["template"].get("metadata") or {}).get("annotations", {}),
            )
            where = f"TFJob {job} {rtype} {index}"
            plan = self.plan_container(
                replica.name, pod_name, pod_spec, container, where, pod, own_ports=(TFJOB_PORT_NAME,)
            )
            if (rtype, index) == chief:
                self.chief = plan
            config = tfconfig.tf_config(counts, rtype, index, address)
            if config is not None:
                plan.env["TF_CONFIG"] = config
            planned.append((replica, plan))
    return planned, None


def rules(manifests: Manifests, replicas: list[tuple[Replica, ProcessPlan]], planned: None) -> TFJobRules:
    spec = manifests.job["spec"]
    run_policy = spec.get("runPolicy") or {}
    return TFJobRules(
        manifests.name,
        manifests.namespace,
        [r for r, _ in replicas],
        run_policy.get("backoffLimit"),
        run_policy.get("activeDeadlineSeconds"),
        spec.get("successPolicy", ""),
        clean_pod_policy=run_policy.get("cleanPodPolicy", ""),
    )
