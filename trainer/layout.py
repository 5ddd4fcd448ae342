"""The model directory's layout, defined once: the trainer writes it; the tools and tests read it.

    <model-dir>/
      model.keras          the Keras model (raw uint8 images in, logits out)
      saved_model/         SavedModel, signature `serve`
      metrics.json         final metrics, throughput, config and versions
      status.json          the chief's live status
      checkpoints/         the last checkpoints and run-setup.json (what a step means)
      logs/train, logs/test, logs/eval   TensorBoard scalars
"""

from __future__ import annotations

import dataclasses
import os

KERAS_MODEL = "model.keras"
SAVED_MODEL = "saved_model"
METRICS = "metrics.json"
STATUS = "status.json"
CHECKPOINTS = "checkpoints"
RUN_SETUP = "run-setup.json"  # inside CHECKPOINTS
LOGS = "logs"
# What a finished run leaves for the user, in the order tools list it.
ARTIFACTS = (KERAS_MODEL, SAVED_MODEL, METRICS, CHECKPOINTS, LOGS)


@dataclasses.dataclass(frozen=True)
class ModelDir:
    """Paths inside one --model-dir."""

    root: str

    def _join(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    @property
    def keras_model(self) -> str:
        return self._join(KERAS_MODEL)

    @property
    def saved_model(self) -> str:
        return self._join(SAVED_MODEL)

    @property
    def metrics(self) -> str:
        return self._join(METRICS)

    @property
    def status(self) -> str:
        return self._join(STATUS)

    @property
    def checkpoints(self) -> str:
        return self._join(CHECKPOINTS)

    @property
    def run_setup(self) -> str:
        return self._join(CHECKPOINTS, RUN_SETUP)

    def logs(self, name: str) -> str:
        """TensorBoard directory of one summary stream: train, test or eval."""
        return self._join(LOGS, name)
