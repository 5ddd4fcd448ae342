"""Where the cluster tools find a job's model and publish a selection on the training volume (the settings'
MOUNT_PATH, MODEL_ROOT and SELECTION_ROOT), and the selection they run there."""

from __future__ import annotations

from collections.abc import Mapping


def model_dir(settings: Mapping[str, str], job: str) -> str:
    """A job's model dir on the volume, as its pods set TRAINER_MODEL_DIR: MODEL_ROOT/JOB_NAME."""
    return f"{settings['MODEL_ROOT']}/{job}"


def serving_base_path(settings: Mapping[str, str]) -> str:
    """The published base path on the volume, relative to it: one per job (SELECTION_ROOT/JOB_NAME/serving), so two
    pipelines or searches never publish into, or serve, each other's."""
    return f"{settings['SELECTION_ROOT']}/{settings['JOB_NAME']}/serving"


def select_command(settings: Mapping[str, str], jobs: list[str], replace: bool = False) -> list[str]:
    """Model selection (make select's) over the jobs' model dirs, publishing into the base path, in a pod that
    mounts the volume at MOUNT_PATH; replace: publish the winner even where the served model is as good."""
    base_path = f"{settings['MOUNT_PATH']}/{serving_base_path(settings)}"
    command = ["python", "-m", "trainer.serving.select", *(["--replace"] if replace else [])]
    command += ["--base-path", base_path, "--candidates"]
    return command + [model_dir(settings, job) for job in jobs]
