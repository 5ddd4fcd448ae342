"""What Kubeflow Trainer v2's admission webhooks (and its CRDs' CEL rules) reject, read from its source at the pinned
tag (this folder's settings.env), with JobSet's rules for the JobSet a TrainJob becomes (k8s/engines/jobset/), applied
before anything reaches a cluster (make submit, and the offline tests).

Trainer v2.3.0: `pkg/webhooks/trainingruntime_webhook.go` (validateReplicatedJobs),
`pkg/runtime/framework/plugins/jobset/jobset.go` (Validate), `pkg/runtime/core/trainingruntime.go`
(ValidateObjects: the runtime must exist first) and the CEL rules of `manifests/base/crds/*.yaml`.
Rules that need the cluster (an existing PVC for volumeClaimPolicies) or that only apply to updates are left out.
"""

from __future__ import annotations

from typing import Any

from k8s.engines.jobset.admission import dns_1035_problems, jobset_problems
from k8s.engines.trainjob.local_run import ANCESTOR_LABEL, NODE, RUNTIME_KINDS, TRAINER_ANCESTOR

Manifest = dict[str, Any]

# Trainer v2.3.0: the ancestor labels and the container each needs (trainingruntime_webhook.go).
ANCESTOR_CONTAINERS = {TRAINER_ANCESTOR: NODE, "model-initializer": "model-initializer"}
ANCESTOR_CONTAINERS["dataset-initializer"] = "dataset-initializer"
ML_POLICY_SOURCES = ("torch", "mpi", "jax", "xgboost", "flux")
TRAINJOB_MANAGERS = ("trainer.kubeflow.org/trainjob-controller", "kueue.x-k8s.io/multikueue")


def runtime_problems(runtime: Manifest) -> list[str]:
    """What Trainer v2.3.0 rejects in a (Cluster)TrainingRuntime, and what the kubeflow SDK needs to read it."""
    spec = runtime.get("spec") or {}
    name = runtime.get("metadata", {}).get("name")
    problems = []
    replicated = (spec.get("template") or {}).get("spec", {}).get("replicatedJobs") or []
    for rjob in replicated:
        ancestor = (rjob.get("template", {}).get("metadata") or {}).get("labels", {}).get(ANCESTOR_LABEL)
        if ancestor not in ANCESTOR_CONTAINERS:
            continue
        if rjob.get("replicas", 1) != 1:
            problems.append(
                f"runtime {name}: replicatedJob {rjob.get('name')!r} ({ancestor}) replicas always must be 1"
            )
        containers = [c.get("name") for c in rjob["template"]["spec"]["template"]["spec"].get("containers") or []]
        if ANCESTOR_CONTAINERS[ancestor] not in containers:
            problems.append(
                f"runtime {name}: replicatedJob {rjob.get('name')!r} must contain the required container for the "
                f"ancestor {ancestor}: {ANCESTOR_CONTAINERS[ancestor]!r}"
            )
    policy = spec.get("mlPolicy") or {}
    sources = [source for source in ML_POLICY_SOURCES if source in policy]
    if len(sources) > 1:
        problems.append(f"runtime {name}: only one of the policy can be configured, found {', '.join(sources)}")
    if not policy:
        problems.append(f"runtime {name}: the kubeflow SDK needs a non-empty mlPolicy (numNodes for plain ML)")
    if "trainer.kubeflow.org/framework" not in (runtime.get("metadata", {}).get("labels") or {}):
        problems.append(f"runtime {name}: the kubeflow SDK needs the label trainer.kubeflow.org/framework")
    trainers = [
        c
        for rjob in replicated
        if (rjob.get("template", {}).get("metadata") or {}).get("labels", {}).get(ANCESTOR_LABEL) == TRAINER_ANCESTOR
        for c in rjob["template"]["spec"]["template"]["spec"].get("containers") or []
        if c.get("name") == NODE
    ]
    if not trainers or not trainers[0].get("image"):
        problems.append(
            f"runtime {name}: no replicatedJob labelled {ANCESTOR_LABEL}: trainer with a {NODE!r} "
            f"container that has an image (the SDK and the Trainer both look for it)"
        )
    return problems


def trainjob_problems(trainjob: Manifest, runtime: Manifest | None) -> list[str]:
    """What Trainer v2.3.0 rejects in a TrainJob (its CRD's CEL rules, the runtime's custom validation), and the
    JobSet rules for the JobSet it would create (named after the TrainJob, from the runtime's template)."""
    name = trainjob.get("metadata", {}).get("name", "")
    spec = trainjob.get("spec") or {}
    problems = [f"TrainJob metadata.name {name!r}: {p}" for p in dns_1035_problems(name)]
    if "managedBy" in spec and spec["managedBy"] not in TRAINJOB_MANAGERS:
        problems.append(f"spec.managedBy must be one of {', '.join(TRAINJOB_MANAGERS)}")
    ref = spec.get("runtimeRef") or {}
    if ref.get("kind", "ClusterTrainingRuntime") not in RUNTIME_KINDS:
        problems.append(f"spec.runtimeRef.kind {ref.get('kind')!r} is not one of {', '.join(RUNTIME_KINDS)}")
    if runtime is None:
        return problems + [f"spec.runtimeRef {ref.get('name')!r}: the runtime must be created before the TrainJob"]
    problems += runtime_problems(runtime)
    template = runtime["spec"]["template"].get("spec") or {}
    names = {rjob.get("name"): rjob for rjob in template.get("replicatedJobs") or []}
    for source in ("dataset", "model"):
        if (spec.get("initializer") or {}).get(source) and f"{source}-initializer" not in names:
            problems.append(f"spec.initializer.{source}: the runtime has no {source}-initializer job")
    if spec.get("runtimePatches"):
        problems.append("spec.runtimePatches: not checked here; put the change in the runtime's template")
    return problems + jobset_problems(name, trainjob_jobset_spec(trainjob, runtime))


def trainjob_jobset_spec(trainjob: Manifest, runtime: Manifest) -> Manifest:
    """The runtime's JobSet template with the TrainJob's node count applied to the trainer's Job, as the plainML
    policy does (parallelism = completions = numNodes), which sets the longest pod name."""
    template = runtime["spec"]["template"].get("spec") or {}
    nodes = (trainjob["spec"].get("trainer") or {}).get("numNodes") or runtime["spec"].get("mlPolicy", {}).get(
        "numNodes"
    )
    replicated = []
    for rjob in template.get("replicatedJobs") or []:
        labels = (rjob.get("template", {}).get("metadata") or {}).get("labels", {})
        if nodes and labels.get(ANCESTOR_LABEL) == TRAINER_ANCESTOR:
            job_spec = {**rjob["template"]["spec"], "parallelism": nodes, "completions": nodes}
            rjob = {**rjob, "template": {**rjob["template"], "spec": job_spec}}
        replicated.append(rjob)
    return {**template, "replicatedJobs": replicated}
