"""The JobSet's part of make submit (scripts/common/job_engine.py finds it here by the job's kind): a JobSet through
the Kubernetes client's CustomObjectsApi (JobSet ships no Python client of its own on PyPI), checked against
JobSet's webhook rules (admission.py) before any cluster call."""

from __future__ import annotations

import json

from k8s.engines.jobset import admission
from scripts.common import manifest
from scripts.common.job_engine import JOB_VERBS, Clients, Engine, JobView, Manifest, conditions_of, foreground
from scripts.common.settings import load

JOBSET_GROUP, JOBSET_VERSION, JOBSETS = "jobset.x-k8s.io", "v1alpha2", "jobsets"
# What the pipeline's Argo step waits for (resource template conditions).
WORKFLOW_CONDITIONS = {"success": "status.terminalState == Completed", "failure": "status.terminalState == Failed"}
# What a pod that creates and follows the job may do with it (the pipeline's Role).
API_RULES = [{"apiGroups": [JOBSET_GROUP], "resources": [JOBSETS], "verbs": JOB_VERBS}]
# Labels JobSet puts on every pod of a JobSet (api/jobset/v1alpha2/jobset_types.go at v0.12.0) and Kubernetes on
# every pod of an Indexed Job.
JOBSET_NAME_LABEL = "jobset.sigs.k8s.io/jobset-name"
REPLICATED_JOB_LABEL = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX_LABEL = "jobset.sigs.k8s.io/job-index"
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"


def first_replicated_job(jobset_spec: Manifest) -> Manifest:
    """The replicated job that holds the chief: the first one (chief in the async shape, workers in the sync)."""
    replicated = jobset_spec.get("replicatedJobs") or []
    if not replicated:
        raise manifest.ManifestError("the JobSet template has no replicatedJobs")
    return replicated[0]


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
            conditions=conditions_of((job.get("status") or {}).get("conditions")),
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


def engine(objects: list[Manifest], namespace: str, clients: Clients) -> JobSetEngine:
    return JobSetEngine.of(clients.custom_objects(), manifest.the_one(objects, "JobSet"), namespace)


def admission_problems(objects: list[Manifest]) -> tuple[str, list[str]]:
    job = manifest.the_one(objects, "JobSet")
    who = f"JobSet {load().get('JOBSET_VERSION', '')}".rstrip()
    return who, admission.jobset_problems(job["metadata"]["name"], job["spec"])


def chief_container(objects: list[Manifest]) -> Manifest:
    job = manifest.the_one(objects, "JobSet")
    return manifest.trainer_of(first_replicated_job(job["spec"])["template"]["spec"]["template"])


def objects_before_job(objects: list[Manifest]) -> list[Manifest]:
    return []


def request_body(objects: list[Manifest]) -> Manifest:
    """The JobSet as rendered: CustomObjectsApi sends it unchanged."""
    return json.loads(json.dumps(manifest.the_one(objects, "JobSet")))
