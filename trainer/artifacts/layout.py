"""The model directory's layout, defined once: the trainer writes it; the tools and tests read it.

<model-dir>/
  model.keras          the Keras model (raw uint8 images in, logits out)
  saved_model/         SavedModel, signature `serve`
  metrics.json         final metrics, throughput, config and versions
  status.json          the chief's live status
  evaluations.json     the evaluator task's result for each checkpoint it evaluated
  checkpoints/         the last checkpoints and run-setup.json (what a step means)
  logs/train, logs/test, logs/eval   TensorBoard scalars
"""

from __future__ import annotations

import os

KERAS_MODEL = "model.keras"
SAVED_MODEL = "saved_model"
METRICS = "metrics.json"
STATUS = "status.json"
EVALUATIONS = "evaluations.json"
CHECKPOINTS = "checkpoints"
RUN_SETUP = "run-setup.json"  # inside CHECKPOINTS
LOGS = "logs"
# What a finished run leaves for the user, in the order tools list it.
ARTIFACTS = (KERAS_MODEL, SAVED_MODEL, METRICS, CHECKPOINTS, LOGS)


class ModelDir:
    """Paths inside one --model-dir."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.keras_model = os.path.join(root, KERAS_MODEL)
        self.saved_model = os.path.join(root, SAVED_MODEL)
        self.metrics = os.path.join(root, METRICS)
        self.status = os.path.join(root, STATUS)
        self.evaluations = os.path.join(root, EVALUATIONS)
        self.checkpoints = os.path.join(root, CHECKPOINTS)
        self.run_setup = os.path.join(root, CHECKPOINTS, RUN_SETUP)

    def logs(self, name: str) -> str:
        """TensorBoard directory of one summary stream: train, test or eval."""
        return os.path.join(self.root, LOGS, name)
