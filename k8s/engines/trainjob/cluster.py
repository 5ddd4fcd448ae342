"""The TrainJob's part of make submit (scripts/common/job_engine.py finds it here by the job's kind): the `kubeflow`
SDK's TrainerClient creates it (`train()`); reads and the foreground delete go through the same SDK's
CustomObjectsApi, because TrainerClient.delete_job takes no delete options and get_job gives a status word without
the conditions' messages or the deletion timestamp. The state is read from the conditions exactly as the SDK reads
them (Complete or Failed with status True; backends/kubernetes/backend.py in kubeflow 0.5.0), which
tests/tools/test_submit_engines.py checks against the SDK itself. Its JobSet is named after it, so pods, the chief and
the headless service are found as for a JobSet (k8s/engines/jobset/, which this engine builds on)."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

from k8s.engines.jobset.cluster import JobSetEngine, first_replicated_job
from k8s.engines.trainjob import admission
from k8s.engines.trainjob.local_run import ANCESTOR_LABEL, NODE, RUNTIME_KINDS, TRAINER_ANCESTOR, runtime_of
from scripts.common import manifest
from scripts.common.job_engine import JOB_VERBS, Clients, Condition, JobView, Manifest, api_message, foreground
from scripts.common.settings import load

TRAINER_GROUP, TRAINER_VERSION, TRAINJOBS = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
# What the pipeline's Argo step waits for (resource template conditions): Trainer (v2.3.0) sets only Suspended,
# Complete and Failed.
WORKFLOW_CONDITIONS = {
    "success": "status.jobsStatus.0.succeeded == 1",
    "failure": ",".join(f"status.conditions.{i}.type == Failed" for i in range(3)),
}
# What a pod that creates and follows the job may do with it and its runtime, applied before it (the pipeline's Role).
API_RULES = [
    {"apiGroups": [TRAINER_GROUP], "resources": [TRAINJOBS], "verbs": JOB_VERBS},
    {"apiGroups": [TRAINER_GROUP], "resources": ["trainingruntimes"], "verbs": ["get", "create", "patch"]},
]
# The label the SDK reads a runtime's framework from (pkg/constants at v2.3.0).
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
# Trainer's webhook reads the runtime from its controller's cache (pkg/runtime/core/trainingruntime.go
# ValidateObjects at v2.3.0), which can lag the API server behind a runtime applied a moment before (NVIDIA/aicr#1669).
# Its refusal (clustertrainingruntime.go says the same of a clusterTrainingRuntime).
RUNTIME_NOT_CACHED = "trainingruntime must be created before the trainjob is created"
# How long create() waits for that cache before it lets the refusal stand, and how often it asks.
RUNTIME_CACHE_WAIT_S, RUNTIME_CACHE_POLL_S = 60.0, 1.0


class TrainJobEngine(JobSetEngine):
    """A TrainJob: created by the SDK's TrainerClient.train() from the rendered TrainJob (`sdk_call`)."""

    kind, succeeded = "TrainJob", "Complete"

    def __init__(
        self,
        trainer_client,
        name: str,
        namespace: str,
        chief_job: str,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ):
        custom_api = trainer_client.backend.custom_api
        super().__init__(custom_api, name, namespace, chief_job, subdomain=name, container=NODE)
        self.trainer = trainer_client
        self.sleep, self.clock = sleep, clock

    @classmethod
    def of(cls, trainer_client, objects: list[Manifest], namespace: str) -> TrainJobEngine:
        trainjob = next(obj for obj in objects if obj.get("kind") == "TrainJob")
        runtime = runtime_of(objects)
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
        """train() the TrainJob; while Trainer's webhook has not yet seen the runtime that the SDK has just read from
        the API server, ask again (every refusal but that one, and that one after RUNTIME_CACHE_WAIT_S, is raised)."""
        trainjob = next(obj for obj in objects if obj.get("kind") == "TrainJob")
        runtime, trainer, options = sdk_call(trainjob, runtime_of(objects))
        deadline, told = self.clock() + RUNTIME_CACHE_WAIT_S, False
        while True:
            try:
                self.trainer.train(runtime=runtime, trainer=trainer, options=options)
                return
            except RuntimeError as error:
                if not runtime_not_cached(error) or self.clock() >= deadline:
                    raise
            if not told:
                print(
                    f"Trainer's webhook has not seen runtime {runtime} yet (its cache lags the API server); "
                    f"asking again for up to {RUNTIME_CACHE_WAIT_S:.0f} s",
                    flush=True,
                )
                told = True
            self.sleep(RUNTIME_CACHE_POLL_S)

    def delete(self) -> None:
        self.custom.delete_namespaced_custom_object(
            TRAINER_GROUP, TRAINER_VERSION, self.namespace, TRAINJOBS, self.name, body=foreground()
        )


def runtime_not_cached(error: BaseException) -> bool:
    """Whether the SDK's error wraps Trainer's webhook refusing a runtime its controller's cache has not seen."""
    from kubernetes.client.exceptions import ApiException

    cause = error.__cause__
    return isinstance(cause, ApiException) and RUNTIME_NOT_CACHED in api_message(cause).lower()


# The TrainJob fields TrainerClient.train() can set (kubeflow 0.5.0: CustomTrainerContainer and the options Name,
# Labels, Annotations, TrainerCommand, TrainerArgs, ActiveDeadlineSeconds; its RuntimePatch is not used here).
SDK_METADATA = {"name", "labels", "annotations"}
SDK_SPEC = {"runtimeRef", "trainer", "activeDeadlineSeconds"}
SDK_TRAINER = {"image", "numNodes", "resourcesPerNode", "env", "command", "args"}


def runtime_trainer_image(runtime: Manifest) -> str | None:
    """The image of the runtime's trainer container (the `node` container of the ancestor-labelled job)."""
    for rjob in runtime["spec"]["template"]["spec"].get("replicatedJobs") or []:
        if (rjob["template"].get("metadata") or {}).get("labels", {}).get(ANCESTOR_LABEL) == TRAINER_ANCESTOR:
            for container in rjob["template"]["spec"]["template"]["spec"]["containers"]:
                if container["name"] == NODE:
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
        raise manifest.ManifestError(
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


def engine(objects: list[Manifest], namespace: str, clients: Clients) -> TrainJobEngine:
    return TrainJobEngine.of(clients.trainer(namespace), objects, namespace)


def admission_problems(objects: list[Manifest]) -> tuple[str, list[str]]:
    """Trainer's rules, and what the SDK cannot send (sdk_call raises ManifestError naming the field)."""
    job, runtime = manifest.the_one(objects, "TrainJob"), runtime_of(objects)
    who = f"Kubeflow Trainer {load().get('KUBEFLOW_TRAINER_VERSION', '')}".rstrip()
    problems = admission.trainjob_problems(job, runtime)
    sdk_call(job, runtime)
    return who, problems


def chief_container(objects: list[Manifest]) -> Manifest:
    """The chief's `node` container as its pod runs it: the TrainJob's args and env applied to its runtime's."""
    job = manifest.the_one(objects, "TrainJob")
    runtime = runtime_of(objects)
    chief = first_replicated_job(runtime["spec"]["template"]["spec"])
    containers = chief["template"]["spec"]["template"]["spec"]["containers"]
    container = dict(next((c for c in containers if c["name"] == NODE), containers[0]))
    overrides = job["spec"].get("trainer") or {}
    if "args" in overrides:
        container["args"] = overrides["args"]
    env = {entry["name"]: entry for entry in container.get("env") or []}
    env.update({entry["name"]: entry for entry in overrides.get("env") or []})
    container["env"] = list(env.values())
    return container


def objects_before_job(objects: list[Manifest]) -> list[Manifest]:
    """Its runtime: Trainer's webhook refuses a TrainJob whose runtime does not exist yet."""
    return [obj for obj in objects if obj.get("kind") in RUNTIME_KINDS]


def request_body(objects: list[Manifest]) -> Manifest:
    return sdk_request_body(manifest.the_one(objects, "TrainJob"), runtime_of(objects))
