"""What make submit and its follower ask of a job, whatever its engine: read it, create it, delete it in the
foreground, which condition ends it, which pods and services are its (`Engine`). Each engine's folder says how, in
its cluster.py (k8s/engines/<engine>/cluster.py, found by the job's kind), beside its overlays, its local runner
and its admission rules, so adding an engine is adding a folder. A cluster part provides:

- `engine(objects, namespace, clients)`: the rendered job's Engine behind its real client (one of `Clients`);
- `admission_problems(objects)`: (whose rules, what they would reject), checked before any cluster call;
- `chief_container(objects)`: the chief's trainer container as its pod will run it;
- `objects_before_job(objects)`: what must exist before the job is created (a TrainJob's runtime);
- `request_body(objects)`: what creating the job sends (make submit --dry-run prints it);
- `WORKFLOW_CONDITIONS`, `API_RULES`: what the pipeline's Argo step waits for, and what its pods may do with the job.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from scripts.common.manifest import ENGINE_KINDS, engine_module, engine_of

Manifest = dict[str, Any]
JOB_VERBS = ["get", "list", "watch", "create", "delete"]  # what creating and following a job takes (API_RULES)


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


@dataclass
class Clients:
    """The real clients an engine may use, each made only when called: the kubeflow-training SDK's TrainingClient
    (namespace), the Kubernetes CustomObjectsApi (), the kubeflow SDK's TrainerClient (namespace)."""

    training: Callable[[str], Any]
    custom_objects: Callable[[], Any]
    trainer: Callable[[str], Any]


def foreground():
    """Delete options under which the API server keeps the object until its dependents are deleted."""
    from kubernetes.client import V1DeleteOptions

    return V1DeleteOptions(propagation_policy="Foreground")


def api_message(error: BaseException) -> str:
    """The message of the Status the API server answered, which the Kubernetes client's ApiException carries as its
    body ('' when the error is no such answer, or the body holds none)."""
    try:
        return json.loads(getattr(error, "body", None) or "{}").get("message", "")
    except (ValueError, AttributeError):
        return ""


def conditions_of(raw: list[dict] | None) -> list[Condition]:
    """A custom object's status.conditions as read from the API (camelCase keys)."""
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
    """The kind of the one job object the kustomization renders (TFJob, or an optional engine's)."""
    return kind_of(engine_of(objects))


def kind_of(engine: str) -> str:
    """The job kind of an engine folder's name (tfjob -> TFJob)."""
    return next(kind for kind, name in ENGINE_KINDS.items() if name == engine)


def cluster_part(kind: str) -> ModuleType:
    """The cluster.py of the engine folder whose kind this is."""
    return engine_module(kind, "cluster")


class Engine:
    """One job kind behind its client. Subclasses set the names and implement read/create/delete."""

    kind = ""
    # The condition type that means the job succeeded (the other end is always Failed).
    succeeded = ""
    # The container whose log is the trainer's (each engine names its own).
    container = ""
    # What the job does once a lost node's pods are deleted (make status's advice for a lost node).
    after_lost_pods = "restarts its group on the nodes that remain, from the last checkpoint."

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
