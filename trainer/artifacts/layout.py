"""The model directory's layout, defined once: the trainer writes it; the tools and tests read it.

<model-dir>/
  model.keras          the Keras model (the task's features in, its outputs out)
  serving/<version>/   SavedModel, signature `serve` (the task's serving function), where TF Serving and KServe
                       look: point their model base path at serving/. The version is the global step of the
                       weights, so a run continued for more steps adds a newer version and the servers load it.
  metrics.json         final metrics, throughput, config and versions
  status.json          the chief's live status
  owner.json           the job this directory belongs to (trainer/artifacts/ownership.py)
  evaluations.json     the evaluator task's result for each checkpoint it evaluated
  checkpoints/         the last checkpoints and run-setup.json (what a step means)
  logs/train, logs/test, logs/eval   TensorBoard scalars
"""

from __future__ import annotations

import os

KERAS_MODEL = "model.keras"
SERVING = "serving"
METRICS = "metrics.json"
STATUS = "status.json"
OWNER = "owner.json"
EVALUATIONS = "evaluations.json"
CHECKPOINTS = "checkpoints"
RUN_SETUP = "run-setup.json"  # inside CHECKPOINTS
LOGS = "logs"
# What a finished run leaves for the user, in the order tools list it.
ARTIFACTS = (KERAS_MODEL, SERVING, METRICS, CHECKPOINTS, LOGS)


def version_folders(base_path: str) -> dict[int, str]:
    """{version: its folder's name} under a model base path (a model dir's serving/, or where selection publishes),
    ascending; hidden and non-numeric names (a copy being written) are not versions. A zero-padded folder (0002) is
    version 2, as TF Serving reads it, and is found under its own name."""
    try:
        names = os.listdir(base_path)
    except FileNotFoundError:
        return {}
    folders: dict[int, str] = {}
    for name in sorted(names):  # two spellings of one number (2 and 0002): the first by name, every time
        if name.isascii() and name.isdigit() and os.path.isdir(os.path.join(base_path, name)):
            folders.setdefault(int(name), name)
    return dict(sorted(folders.items()))


def numbered_versions(base_path: str) -> list[int]:
    """The version numbers under a model base path, ascending (version_folders)."""
    return list(version_folders(base_path))


class ModelDir:
    """Paths inside one --model-dir."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.keras_model = os.path.join(root, KERAS_MODEL)
        self.serving = os.path.join(root, SERVING)
        self.metrics = os.path.join(root, METRICS)
        self.status = os.path.join(root, STATUS)
        self.owner = os.path.join(root, OWNER)
        self.evaluations = os.path.join(root, EVALUATIONS)
        self.checkpoints = os.path.join(root, CHECKPOINTS)
        self.run_setup = os.path.join(root, CHECKPOINTS, RUN_SETUP)

    def saved_model(self, version: int) -> str:
        """The SavedModel of one version: the global step its weights had."""
        return os.path.join(self.serving, str(version))

    def latest_saved_model(self) -> str:
        """The SavedModel a server would load: the highest numbered version folder under serving/."""
        folders = version_folders(self.serving)
        if not folders:
            raise FileNotFoundError(f"no numbered SavedModel under {self.serving}")
        return os.path.join(self.serving, folders[max(folders)])

    def logs(self, name: str) -> str:
        """TensorBoard directory of one summary stream: train, test or eval."""
        return os.path.join(self.root, LOGS, name)
