"""The three engines a job can run under, each through its own real client: what submit and the follower ask of a
job (read it, create it, delete it in the foreground, which condition ends it, which pods and services are its).

- TFJob (training operator v1): the Kubeflow SDK `kubeflow-training`'s TrainingClient.
- JobSet: the Kubernetes client's CustomObjectsApi (JobSet ships no Python client of its own on PyPI).
- TrainJob (Trainer v2): the `kubeflow` SDK's TrainerClient creates it (`train()`); reads and the foreground
  delete go through the same SDK's CustomObjectsApi, because TrainerClient.delete_job takes no delete options and
  get_job gives a status word without the conditions' messages or the deletion timestamp. The state is read from
  the conditions exactly as the SDK reads them (Complete or Failed with status True; backends/kubernetes/backend.py
  in kubeflow 0.5.0), which tests/tools/test_submit_engines.py checks against the SDK itself.

Which engine a rendered kustomization runs under is the kind of its job object (`engine_kind`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from scripts.common import manifest as shared_manifest
from scripts.common.manifest import ENGINE_KINDS, TFJOB_CONTAINER, ManifestError

Manifest = dict[str, Any]

JOBSET_GROUP, JOBSET_VERSION, JOBSETS = "jobset.x-k8s.io", "v1alpha2", "jobsets"
TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")
# Labels JobSet puts on every pod of a JobSet (api/jobset/v1alpha2/jobset_types.go at v0.12.0) and Kubernetes on
# every pod of an Indexed Job.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
# Trainer v2 names the trainer's container `node` and marks its replicated job with this label (pkg/constants at
# v2.3.0); the SDK looks for both.
TRAINER_CONTAINER = "node"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"


@dataclass
class Condition:
    type: str
    status: str
    reason: str | None = None
    message: str | None = None
    last_transition_time: Any = None


@dataclass
class JobView:
    """What the follower needs of one read of a job, whatever its kind."""

    deleting: bool
    conditions: list[Condition] = field(default_factory=list)


def foreground():
    """Delete options under which the API server keeps the object until its dependents are deleted."""
    from kubernetes.client import V1DeleteOptions

    return V1DeleteOptions(propagation_policy="Foreground")


def _conditions(raw: list[dict] | None) -> list[Condition]:
    return [
        Condition(
            type=c.get("type", ""),
            status=c.get("status", ""),
            reason=c.get("reason"),
            message=c.get("message"),
            last_transition_time=c.get("lastTransitionTime"),
        )
        for c in raw or []
    ]


def engine_kind(objects: list[Manifest]) -> str:
    """TFJob, JobSet or TrainJob: the kind of the one job object the kustomization renders."""
    engine = shared_manifest.engine_of(objects)
    return next(kind for kind, name in ENGINE_KINDS.items() if name == engine)


def first_replicated_job(jobset_spec: Manifest) -> Manifest:
    """The replicated job that holds the chief: the first one (chief in the async shape, workers in the sync)."""
    replicated = jobset_spec.get("replicatedJobs") or []
    if not replicated:
        raise ManifestError("the JobSet template has no replicatedJobs")
    return replicated[0]


class Engine:
    """One job kind behind its client. Subclasses set the names and implement read/create/delete."""

    kind = ""
    # The condition type that means the job succeeded (the other end is always Failed).
    succeeded = ""
    # The container whose log is the trainer's.
    container = TFJOB_CONTAINER

    def __init__(self, name: str, namespace: str):
        self.name = name
        self.namespace = namespace

    def finished_state(self, conditions: list[Condition]) -> str | None:
        """Succeeded or Failed once a finishing condition is True, else None."""
        for condition in conditions:
            if condition.status == "True" and condition.type in (self.succeeded, "Failed"):
                return "Succeeded" if condition.type == self.succeeded else "Failed"
        return None

    def read(self) -> JobView:
        raise NotImplementedError

    def create(self, objects: list[Manifest]) -> None:
        raise NotImplementedError

    def delete(self) -> None:
        raise NotImplementedError

    def pod_selector(self) -> str:
        raise NotImplementedError

    def chief_selector(self) -> str:
        raise NotImplementedError

    def service_query(self) -> dict[str, str]:
        """list_namespaced_service keyword arguments that find the services the controller made for this job."""
        raise NotImplementedError


class TFJobEngine(Engine):
    kind, succeeded = "TFJob", "Succeeded"

    def __init__(self, training_client, name: str, namespace: str):
        super().__init__(name, namespace)
        self.training = training_client

    def read(self) -> JobView:
        job = self.training.get_job(self.name, namespace=self.namespace)
        conditions = [
            Condition(c.type, c.status, c.reason, c.message, c.last_transition_time)
            for c in (job.status and job.status.conditions) or []
        ]
        return JobView(deleting=bool(job.metadata and job.metadata.deletion_timestamp), conditions=conditions)

    def create(self, objects: list[Manifest]) -> None:
        from scripts.common import manifest as tfjob_manifest

        tfjob = tfjob_manifest.to_tfjob(tfjob_manifest.the_one(objects, "TFJob"))
        self.training.create_job(job=tfjob, namespace=self.namespace)

    def delete(self) -> None:
        self.training.delete_job(self.name, namespace=self.namespace, delete_options=foreground())

    def pod_selector(self) -> str:
        return f"training.kubeflow.org/job-name={self.name}"

    def chief_selector(self) -> str:
        return self.pod_selector() + ",training.kubeflow.org/job-role=master"

    def service_query(self) -> dict[str, str]:
        return {"label_selector": self.pod_selector()}


class JobSetEngine(Engine):
    """A JobSet through CustomObjectsApi. `chief_job` is the first replicated job's name (its job 0, pod 0 is the
    chief); `subdomain` names the headless service JobSet makes (network.subdomain, default the JobSet's name)."""

    kind, succeeded = "JobSet", "Completed"

    def __init__(self, custom_api, name: str, namespace: str, chief_job: str, subdomain: str, container: str):
        super().__init__(name, namespace)
        self.custom = custom_api
        self.chief_job = chief_job
        self.subdomain = subdomain
        self.container = container

    @classmethod
    def of(cls, custom_api, jobset: Manifest, namespace: str) -> JobSetEngine:
        spec = jobset["spec"]
        chief = first_replicated_job(spec)
        container = chief["template"]["spec"]["template"]["spec"]["containers"][0]["name"]
        name = jobset["metadata"]["name"]
        subdomain = (spec.get("network") or {}).get("subdomain") or name
        return cls(custom_api, name, namespace, chief["name"], subdomain, container)

    def raw(self) -> Manifest:
        return self.custom.get_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, self.namespace, JOBSETS, self.name
        )

    def read(self) -> JobView:
        job = self.raw()
        return JobView(
            deleting=bool(job.get("metadata", {}).get("deletionTimestamp")),
            conditions=_conditions((job.get("status") or {}).get("conditions")),
        )

    def create(self, objects: list[Manifest]) -> None:
        body = next(obj for obj in objects if obj.get("kind") == "JobSet")
        self.custom.create_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, self.namespace, JOBSETS, body)

    def delete(self) -> None:
        self.custom.delete_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, self.namespace, JOBSETS, self.name, body=foreground()
        )

    def pod_selector(self) -> str:
        return f"{JOBSET_NAME_LABEL}={self.name}"

    def chief_selector(self) -> str:
        return (
            f"{self.pod_selector()},{REPLICATED_JOB_LABEL}={self.chief_job},{JOB_INDEX_LABEL}=0,"
            f"{COMPLETION_INDEX_LABEL}=0"
        )

    def service_query(self) -> dict[str, str]:
        return {"field_selector": f"metadata.name={self.subdomain}"}


class TrainJobEngine(JobSetEngine):
    """A TrainJob: created by the SDK's TrainerClient.train() from the rendered TrainJob (`sdk_call`); its JobSet is
    named after it, so pods, the chief and the headless service are found as for a JobSet."""

    kind, succeeded = "TrainJob", "Complete"

    def __init__(self, trainer_client, name: str, namespace: str, chief_job: str):
        custom_api = trainer_client.backend.custom_api
        super().__init__(custom_api, name, namespace, chief_job, subdomain=name, container=TRAINER_CONTAINER)
        self.trainer = trainer_client

    @classmethod
    def of(cls, trainer_client, objects: list[Manifest], namespace: str) -> TrainJobEngine:
        trainjob = next(obj for obj in objects if obj.get("kind") == "TrainJob")
        runtime = shared_manifest.runtime_of(objects)
        chief = first_replicated_job(runtime["spec"]["template"]["spec"])
        return cls(trainer_client, trainjob["metadata"]["name"], namespace, chief["name"])

    def raw(self) -> Manifest:
        return self.custom.get_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, self.namespace, TRAINJOBS, self.name
        )

    def read(self) -> JobView:
        from kubeflow_trainer_api import models

        job = models.TrainerV1alpha1TrainJob.from_dict(self.raw())
        conditions = [
            Condition(c.type, c.status, c.reason, c.message, c.last_transition_time)
            for c in (job.status and job.status.conditions) or []
        ]
        return JobView(deleting=bool(job.metadata and job.metadata.deletion_timestamp), conditions=conditions)

    def create(self, objects: list[Manifest]) -> None:
        trainjob = next(obj for obj in objects if obj.get("kind") == "TrainJob")
        runtime, trainer, options = sdk_call(trainjob, shared_manifest.runtime_of(objects))
        self.trainer.train(runtime=runtime, trainer=trainer, options=options)

    def delete(self) -> None:
        self.custom.delete_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, self.namespace, TRAINJOBS, self.name, body=foreground()
        )


# The TrainJob fields TrainerClient.train() can set (kubeflow 0.5.0: CustomTrainerContainer and the options Name,
# Labels, Annotations, TrainerCommand, TrainerArgs, ActiveDeadlineSeconds; its RuntimePatch is not used here).
SDK_METADATA = {"name", "labels", "annotations"}
SDK_SPEC = {"runtimeRef", "trainer", "activeDeadlineSeconds"}
SDK_TRAINER = {"image", "numNodes", "resourcesPerNode", "env", "command", "args"}


def runtime_trainer_image(runtime: Manifest) -> str | None:
    """The image of the runtime's trainer container (the `node` container of the ancestor-labelled job)."""
    for rjob in runtime["spec"]["template"]["spec"].get("replicatedJobs") or []:
        if (rjob["template"].get("metadata") or {}).get("labels", {}).get(ANCESTOR_LABEL) == "trainer":
            for container in rjob["template"]["spec"]["template"]["spec"]["containers"]:
                if container["name"] == TRAINER_CONTAINER:
                    return container.get("image")
    return None


def sdk_call(trainjob: Manifest, runtime: Manifest) -> tuple[str, Any, list]:
    """The TrainerClient.train() arguments (runtime name, CustomTrainerContainer, options) that send this TrainJob;
    ManifestError naming the field when the SDK cannot send something the TrainJob holds. CustomTrainerContainer
    needs an image: a TrainJob without one gets the runtime's, which changes nothing the pods run."""
    from kubeflow.trainer import CustomTrainerContainer
    from kubeflow.trainer.options import common as common_options
    from kubeflow.trainer.options import kubernetes as k8s_options

    problems = [f"metadata.{key}" for key in trainjob["metadata"] if key not in SDK_METADATA | {"namespace"}]
    spec = trainjob["spec"]
    problems += [f"spec.{key}" for key in spec if key not in SDK_SPEC]
    trainer = spec.get("trainer") or {}
    problems += [f"spec.trainer.{key}" for key in trainer if key not in SDK_TRAINER]
    env = trainer.get("env") or []
    problems += [f"spec.trainer.env {e['name']} (valueFrom)" for e in env if set(e) != {"name", "value"}]
    resources = trainer.get("resourcesPerNode") or {}
    if resources and (set(resources) - {"requests", "limits"} or resources.get("requests") != resources.get("limits")):
        problems.append("spec.trainer.resourcesPerNode (the SDK sets requests and limits to the same values)")
    image = trainer.get("image") or runtime_trainer_image(runtime)
    if not image:
        problems.append("spec.trainer.image (neither the TrainJob nor its runtime's trainer container has one)")
    if problems:
        raise ManifestError(
            "the kubeflow SDK's TrainerClient.train() cannot send these TrainJob fields: "
            + ", ".join(problems)
            + "; put them in the runtime's template (the TrainJob then inherits them)"
        )
    container = CustomTrainerContainer(
        image=image,
        num_nodes=trainer.get("numNodes"),
        resources_per_node=dict(resources.get("limits") or {}) or None,
        env={e["name"]: e["value"] for e in env} or None,
    )
    metadata = trainjob["metadata"]
    options: list = [common_options.Name(metadata["name"])]
    if metadata.get("labels"):
        options.append(k8s_options.Labels(dict(metadata["labels"])))
    if metadata.get("annotations"):
        options.append(k8s_options.Annotations(dict(metadata["annotations"])))
    if "command" in trainer:
        options.append(k8s_options.TrainerCommand(list(trainer["command"])))
    if "args" in trainer:
        options.append(k8s_options.TrainerArgs(list(trainer["args"])))
    if "activeDeadlineSeconds" in spec:
        options.append(k8s_options.ActiveDeadlineSeconds(int(spec["activeDeadlineSeconds"])))
    return spec["runtimeRef"]["name"], container, options


def sdk_request_body(trainjob: Manifest, runtime: Manifest) -> Manifest:
    """The TrainJob as train() creates it once the API server has applied the CRD's defaults: the rendered one, with
    the runtime's trainer image when the TrainJob names none (see sdk_call)."""
    body = copy.deepcopy(trainjob)
    trainer = body["spec"].setdefault("trainer", {})
    trainer.setdefault("image", runtime_trainer_image(runtime))
    return body
