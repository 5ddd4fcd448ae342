"""How make's command line applies to a TFJob (scripts/common/manifest.py's customize finds it here by the engine):
where a TFJob's pod templates are and which container in them is the trainer, which templates run the trainer, and
how the worker count scales it."""

from __future__ import annotations

from scripts.common.manifest import CHIEF_TYPES, Manifest, ManifestError, the_one

# The container the operator gives TF_CONFIG: its webhook requires one of this name in every replica.
TRAINER_CONTAINER = "tensorflow"
POD_TEMPLATE_KINDS = ("TFJob",)  # what pod_templates reads (manifest.pod_templates asks)


def pod_templates(obj: Manifest) -> list[Manifest]:
    """Each replica's pod template."""
    return [spec["template"] for spec in obj["spec"]["tfReplicaSpecs"].values()]


def trainer_templates(objects: list[Manifest]) -> list[Manifest]:
    """Every replica's pod template."""
    return pod_templates(the_one(objects, "TFJob"))


def scale(objects: list[Manifest], workers: int) -> None:
    """The Worker replicas; without a chief, at least one."""
    tfjob = the_one(objects, "TFJob")
    specs = tfjob["spec"]["tfReplicaSpecs"]
    if "Worker" not in specs:
        raise ManifestError(f"--workers: TFJob {tfjob['metadata']['name']} has no Worker replica spec to scale")
    has_chief = any(int(specs[t].get("replicas", 1)) for t in CHIEF_TYPES if t in specs)
    if workers < (0 if has_chief else 1):
        raise ManifestError(f"--workers must be at least {0 if has_chief else 1}, got {workers}")
    specs["Worker"]["replicas"] = workers


def trainer_overrides(objects: list[Manifest]) -> list[Manifest]:
    """Nothing beside the trainer containers carries the trainer's command line."""
    return []


def set_image(objects: list[Manifest], image: str) -> None:
    """The containers carry the image (customize sets them)."""
