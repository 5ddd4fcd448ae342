"""The TFJob's part of make submit (scripts/common/job_engine.py finds it here by the job's kind): the training
operator v1's TFJob through the Kubeflow SDK `kubeflow-training`'s TrainingClient, checked against the operator's
webhook rules (admission.py's webhook_problems) before any cluster call."""

from __future__ import annotations

import json

from k8s.engines.tfjob.admission import trainer_container, webhook_problems
from k8s.engines.tfjob.customize import TRAINER_CONTAINER
from scripts.common import manifest
from scripts.common.job_engine import JOB_VERBS, Clients, Condition, Engine, JobView, Manifest, foreground

# What the pipeline's Argo step waits for (resource template conditions, {workers} filled in): the training operator
# (v1.9.4, pkg/util/status.go) appends each new condition after Created and freezes the list once Failed.
WORKFLOW_CONDITIONS = {
    "success": "status.replicaStatuses.Worker.succeeded == {workers}",
    "failure": ",".join(f"status.conditions.{i}.type == Failed" for i in range(1, 5)),
}
# What a pod that creates and follows the job may do with it (the pipeline's Role).
API_RULES = [{"apiGroups": ["kubeflow.org"], "resources": ["tfjobs"], "verbs": JOB_VERBS}]


class TFJobEngine(Engine):
    kind, succeeded = "TFJob", "Succeeded"
    container = TRAINER_CONTAINER
    after_lost_pods = "fails: make submit again resumes from the last checkpoint on the nodes that remain."

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
        tfjob = to_tfjob(manifest.the_one(objects, "TFJob"))
        self.training.create_job(job=tfjob, namespace=self.namespace)

    def delete(self) -> None:
        self.training.delete_job(self.name, namespace=self.namespace, delete_options=foreground())

    def pod_selector(self) -> str:
        return f"training.kubeflow.org/job-name={self.name}"

    def chief_selector(self) -> str:
        return self.pod_selector() + ",training.kubeflow.org/job-role=master"

    def service_query(self) -> dict[str, str]:
        return {"label_selector": self.pod_selector()}


def engine(objects: list[Manifest], namespace: str, clients: Clients) -> TFJobEngine:
    job = manifest.the_one(objects, "TFJob")
    return TFJobEngine(clients.training(namespace), job["metadata"]["name"], namespace)


def admission_problems(objects: list[Manifest]) -> tuple[str, list[str]]:
    return "the training operator", webhook_problems(manifest.the_one(objects, "TFJob"))


def chief_container(objects: list[Manifest]) -> Manifest:
    return trainer_container(manifest.the_one(objects, "TFJob"))


def objects_before_job(objects: list[Manifest]) -> list[Manifest]:
    return []


def request_body(objects: list[Manifest]) -> Manifest:
    """The exact JSON the SDK sends."""
    return sdk_request_body(to_tfjob(manifest.the_one(objects, "TFJob")))


def to_tfjob(document: Manifest):
    """The TFJob document as the SDK's KubeflowOrgV1TFJob (unknown fields would be dropped)."""
    from kubeflow.training import ApiClient
    from kubeflow.training.utils.utils import FakeResponse

    if document.get("apiVersion") != "kubeflow.org/v1" or document.get("kind") != "TFJob":
        raise manifest.ManifestError(
            f"expected a kubeflow.org/v1 TFJob, got {document.get('apiVersion')} {document.get('kind')}"
        )
    return ApiClient().deserialize(FakeResponse(document), "KubeflowOrgV1TFJob")


def sdk_request_body(tfjob_model) -> Manifest:
    """The JSON body TrainingClient.create_job sends (the kubernetes client's serializer)."""
    import kubernetes.client

    return json.loads(json.dumps(kubernetes.client.ApiClient().sanitize_for_serialization(tfjob_model)))
