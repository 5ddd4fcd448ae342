"""Checkpoints on the shared volume, restored by every worker from the chief's directory.

The chief writes `<model-dir>/checkpoints`; the other workers must save too
(saving can need every worker) and write to a temporary directory outside the
model directory that they delete. At start-up every worker restores the chief's
newest readable checkpoint, so a restarted worker never holds fresh weights
while the others hold trained ones. A checkpoint that cannot be read is skipped
for the one before it; one written by a different run setup is refused.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from typing import Any

import tensorflow as tf

from trainer.config import ConfigError

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
RUN_SETUP = "run-setup.json"
# What decides the meaning of a step: change any of these and step N is no longer the same step.
RESUME_KEYS = ("model", "dataset", "train_examples", "global_batch_size", "seed")


class Checkpointer:
    """Owns the tf.train.Checkpoint of model, optimizer and counters, and where it is written."""

    def __init__(self, model_dir: str, is_chief: bool, keep: int, **trackables: Any) -> None:
        self.directory = os.path.join(model_dir, CHECKPOINTS)
        self.is_chief = is_chief
        self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.restarts = tf.Variable(0, dtype=tf.int64, trainable=False, name="restarts")
        self.checkpoint = tf.train.Checkpoint(global_step=self.global_step, restarts=self.restarts, **trackables)
        self._write_directory = self.directory if is_chief else tempfile.mkdtemp(prefix="trainer-worker-ckpt-")
        self.manager = tf.train.CheckpointManager(self.checkpoint, self._write_directory, max_to_keep=keep)

    def check_run_setup(self, setup: dict[str, Any]) -> None:
        """Refuses to resume a run whose steps meant something else; the chief records the setup."""
        path = os.path.join(self.directory, RUN_SETUP)
        if os.path.exists(path):
            with open(path) as handle:
                recorded = json.load(handle)
            mismatches = [f"{key}: checkpoint has {recorded.get(key)!r}, this run has {setup[key]!r}"
                          for key in RESUME_KEYS if recorded.get(key) != setup[key]]
            if mismatches:
                raise ConfigError(
                    f"the checkpoints in {self.directory} come from a different run setup ({'; '.join(mismatches)}). "
                    f"Run with the same settings to resume, or give a new --model-dir to start over.")
        elif self.is_chief:
            os.makedirs(self.directory, exist_ok=True)
            from trainer.saving import write_json

            write_json(path, {key: setup[key] for key in RESUME_KEYS})

    def restore_latest(self) -> int:
        """Restores the chief's newest readable checkpoint on this worker; returns the global step."""
        candidates = _checkpoints_newest_first(self.directory)
        for path in candidates:
            try:
                self.checkpoint.restore(path).assert_existing_objects_matched()
            except Exception as error:  # noqa: BLE001 (a truncated file raises IndexError, others OpError; none may crash-loop)
                reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
                log.warning("checkpoint %s is unreadable (%s); trying the one before it", path, reason[:200])
                continue
            self.restarts.assign_add(1)
            log.info("resumed from %s at global step %d (restart %d)",
                     path, int(self.global_step.numpy()), int(self.restarts.numpy()))
            return int(self.global_step.numpy())
        if candidates:
            log.warning("no readable checkpoint in %s; starting from step 0", self.directory)
        return 0

    def save(self, step: int) -> None:
        """Every worker calls this at the same step; only the chief's copy is kept."""
        self.global_step.assign(step)
        self.manager.save(checkpoint_number=step)

    def close(self) -> None:
        if not self.is_chief:
            shutil.rmtree(self._write_directory, ignore_errors=True)


def _checkpoints_newest_first(directory: str) -> list[str]:
    """Every checkpoint prefix in the directory, newest first, whatever the `checkpoint` file says."""
    if not os.path.isdir(directory):
        return []
    prefixes = {name.split(".index")[0] for name in os.listdir(directory) if name.endswith(".index")}

    def number(prefix: str) -> int:
        suffix = prefix.rsplit("-", 1)[-1]
        return int(suffix) if suffix.isdigit() else -1

    return [os.path.join(directory, prefix) for prefix in sorted(prefixes, key=number, reverse=True)]
