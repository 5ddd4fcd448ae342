"""How make's command line applies to a JobSet (scripts/common/manifest.py's customize finds it here by the
engine): where a JobSet's pod templates are and which container in them is the trainer, which pod templates run the
trainer, and how the worker count scales the workers' Job and the worker count in every pod's TF_CONFIG."""

from __future__ import annotations

from scripts.common.manifest import Manifest, ManifestError, the_one, trainer_of

TRAINER_CONTAINER = "trainer"  # the trainer's container in the overlays' replicated jobs
POD_TEMPLATE_KINDS = ("JobSet",)  # what pod_templates reads (manifest.pod_templates asks)
WORKER_JOBS = ("worker", "node")  # the workers' replicated job: JobSet's, and Trainer v2's trainer Job
# The worker count in the overlays' TF_CONFIG: the settings' WORKERS, which a count given here replaces.
WORKER_COUNT = '"count": $(WORKERS)'


def replicated_job_templates(jobset_spec: Manifest) -> list[Manifest]:
    """The pod templates of a JobSet spec's replicated jobs (a JobSet's spec, or a TrainingRuntime's template.spec)."""
    return [rjob["template"]["spec"]["template"] for rjob in jobset_spec.get("replicatedJobs") or []]


def pod_templates(obj: Manifest) -> list[Manifest]:
    """Each replicated job's pod template."""
    return replicated_job_templates(obj["spec"])


def scale_jobset(jobset_spec: Manifest, where: str, workers: int) -> str:
    """Sets the workers' Job to `workers` pods (parallelism, completions and the count in every pod's TF_CONFIG);
    returns its replicated job's name."""
    jobs = {rjob["name"]: rjob for rjob in jobset_spec.get("replicatedJobs") or []}
    name = next((job for job in WORKER_JOBS if job in jobs), None)
    if name is None:
        raise ManifestError(f"--workers: {where} has no replicated job named {' or '.join(WORKER_JOBS)} to scale")
    if workers < 1:
        raise ManifestError(f"--workers must be at least 1, got {workers}")
    job_spec = jobs[name]["template"]["spec"]
    job_spec["parallelism"] = job_spec["completions"] = workers
    for template in replicated_job_templates(jobset_spec):
        for entry in trainer_of(template).get("env") or []:
            if entry.get("name") == "TF_CONFIG" and "value" in entry:
                entry["value"] = str(entry["value"]).replace(WORKER_COUNT, f'"count": {workers}')
    return name


def trainer_templates(objects: list[Manifest]) -> list[Manifest]:
    """Every replicated job's pod template."""
    return pod_templates(the_one(objects, "JobSet"))


def scale(objects: list[Manifest], workers: int) -> None:
    jobset = the_one(objects, "JobSet")
    scale_jobset(jobset["spec"], f"JobSet {jobset['metadata']['name']}", workers)


def trainer_overrides(objects: list[Manifest]) -> list[Manifest]:
    """Nothing beside the trainer containers carries the trainer's command line."""
    return []


def set_image(objects: list[Manifest], image: str) -> None:
    """The containers carry the image (customize sets them)."""
