"""How make's command line applies to a TrainJob (scripts/common/manifest.py's customize finds it here by the
engine): where a runtime's pod templates are and which container in them is the trainer; its runtime's replicated
jobs run the trainer; the worker count is the TrainJob's numNodes, with the count in the runtime's TF_CONFIG as for a
JobSet; the TrainJob's own trainer fields go over the runtime's `node` container."""

from __future__ import annotations

from k8s.engines.jobset.customize import replicated_job_templates, scale_jobset
from k8s.engines.trainjob.local_run import NODE, RUNTIME_KINDS, runtime_of
from scripts.common.manifest import Manifest, the_one

TRAINER_CONTAINER = NODE  # Trainer v2's trainer container, in its runtime's trainer Job
POD_TEMPLATE_KINDS = RUNTIME_KINDS  # what pod_templates reads (manifest.pod_templates asks)


def pod_templates(obj: Manifest) -> list[Manifest]:
    """A (Cluster)TrainingRuntime's replicated jobs' pod templates (a TrainJob holds none)."""
    return replicated_job_templates(obj["spec"]["template"]["spec"])


def trainer_templates(objects: list[Manifest]) -> list[Manifest]:
    """The runtime's replicated jobs' pod templates."""
    return pod_templates(runtime_of(objects))


def scale(objects: list[Manifest], workers: int) -> None:
    runtime = runtime_of(objects)
    scale_jobset(runtime["spec"]["template"]["spec"], f"{runtime['kind']} {runtime['metadata']['name']}", workers)
    the_one(objects, "TrainJob")["spec"].setdefault("trainer", {})["numNodes"] = workers


def trainer_overrides(objects: list[Manifest]) -> list[Manifest]:
    """The TrainJob's trainer fields, where they set the command line: Trainer v2 puts them over the runtime's node
    container (args replace, env merges), so they are edited too."""
    overrides = the_one(objects, "TrainJob")["spec"].get("trainer") or {}
    return [overrides] if any(field in overrides for field in ("command", "args", "env")) else []


def set_image(objects: list[Manifest], image: str) -> None:
    """The TrainJob's own image, where it names one: it replaces the runtime's node image."""
    trainer = the_one(objects, "TrainJob")["spec"].get("trainer") or {}
    if trainer.get("image"):
        trainer["image"] = image
