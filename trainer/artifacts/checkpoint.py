"""Checkpoints on the shared volume, restored by every worker from the chief's directory.

The chief writes `<model-dir>/checkpoints`; the other workers must save too
(saving can need every worker) and write to a scratch directory outside the
model directory that they delete. At start-up every worker restores the chief's
newest readable checkpoint, so a restarted worker never holds fresh weights
while the others hold trained ones. Each candidate is read in full before any
live variable is touched: an unreadable one is skipped for the one before it,
and one whose variables do not fit this model, or whose run setup differs, is
refused with the mismatch named.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import os
import shutil
import tempfile
from typing import Any

import tensorflow as tf

from trainer.artifacts.atomic_file import write_json
from trainer.errors import ModelDirError, first_line
from trainer.artifacts.layout import ModelDir

log = logging.getLogger(__name__)

# What decides the meaning of a step: change any of these and step N is no longer the same step.
RESUME_KEYS = ("model", "dataset", "train_examples", "global_batch_size", "seed")
# Bookkeeping entries every checkpoint has, whatever the model.
_BOOKKEEPING = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE")


class Checkpointer:
    """Owns the tf.train.Checkpoint of model, optimizer and global step, and where it is written."""

    def __init__(self, model_dir: str, is_chief: bool, task_name: str, keep: int, **trackables: Any) -> None:
        self.directory = ModelDir(model_dir).checkpoints
        self.run_setup_path = ModelDir(model_dir).run_setup
        self.is_chief = is_chief
        self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.checkpoint = tf.train.Checkpoint(global_step=self.global_step, **trackables)
        self._write_directory = self.directory if is_chief else _scratch_directory(model_dir, task_name)
        self.manager = tf.train.CheckpointManager(self.checkpoint, self._write_directory, max_to_keep=keep)

    def check_run_setup(self, setup: dict[str, Any]) -> None:
        """Refuses checkpoints whose steps meant something else; the chief records the setup."""
        path = self.run_setup_path
        if checkpoint_prefixes(self.directory) and os.path.exists(path):
            try:
                with open(path) as handle:
                    recorded = json.load(handle)
            except (OSError, ValueError) as error:
                raise ModelDirError(
                    f"{path} is unreadable ({error}); delete it to resume from these checkpoints "
                    f"anyway, or give a new --model-dir"
                ) from None
            mismatches = [
                f"{key}: checkpoint has {recorded.get(key)!r}, this run has {setup[key]!r}"
                for key in RESUME_KEYS
                if recorded.get(key) != setup[key]
            ]
            if mismatches:
                raise ModelDirError(
                    f"the checkpoints in {self.directory} come from a different run setup ({'; '.join(mismatches)}). "
                    f"Run with the same settings to resume, or give a new --model-dir to start over."
                )
        elif self.is_chief:
            write_json(path, {key: setup[key] for key in RESUME_KEYS})

    def restore_latest(self) -> int:
        """Restores the chief's newest readable checkpoint on this worker; returns its global step."""
        candidates = checkpoint_prefixes(self.directory)
        if not candidates:
            return 0
        expected = self._variable_shapes()
        for path in candidates:
            try:
                shapes = _read_in_full(path)
            except Exception as error:  # noqa: BLE001 (truncated files raise IndexError, others OpError)
                log.warning("checkpoint %s is unreadable (%s); trying the one before it", path, first_line(error)[:200])
                continue
            _refuse_if_different(path, shapes, expected)
            self.checkpoint.restore(path).assert_existing_objects_matched()
            log.info("resumed from %s at global step %d", path, int(self.global_step.numpy()))
            return int(self.global_step.numpy())
        log.warning("no readable checkpoint in %s; starting from step 0", self.directory)
        return 0

    def save(self, step: int) -> None:
        """Every worker calls this at the same step; only the chief's copy is kept."""
        self.global_step.assign(step)
        self.manager.save(checkpoint_number=step)

    def close(self) -> None:
        if not self.is_chief:
            shutil.rmtree(self._write_directory, ignore_errors=True)

    def _variable_shapes(self) -> dict[str, list[int]]:
        """The variables and shapes a checkpoint of this model has, read from a throw-away write."""
        scratch = tempfile.mkdtemp(prefix="trainer-shape-probe-")
        try:
            return _shapes(tf.train.load_checkpoint(self.checkpoint.write(os.path.join(scratch, "probe"))))
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


def _scratch_directory(model_dir: str, task_name: str) -> str:
    """A non-chief's checkpoint directory: one per task and model dir, so a restart replaces its leftovers."""
    key = hashlib.sha256(os.path.abspath(model_dir).encode()).hexdigest()[:12]
    path = os.path.join(tempfile.gettempdir(), f"trainer-worker-ckpt-{task_name}-{key}")
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def _shapes(reader: Any) -> dict[str, list[int]]:
    return {name: list(shape) for name, shape in reader.get_variable_to_shape_map().items() if name not in _BOOKKEEPING}


def _read_in_full(path: str) -> dict[str, list[int]]:
    """Reads every tensor of a checkpoint (raising if any is damaged); returns the shapes."""
    reader = tf.train.load_checkpoint(path)
    shapes = _shapes(reader)
    for name in shapes:
        reader.get_tensor(name)
    return shapes


def _refuse_if_different(path: str, found: dict[str, list[int]], expected: dict[str, list[int]]) -> None:
    if found == expected:
        return
    differences = [
        f"{name}: checkpoint {found.get(name, 'missing')}, this model {expected.get(name, 'missing')}"
        for name in sorted(set(found) | set(expected))
        if found.get(name) != expected.get(name)
    ]
    raise ModelDirError(
        f"checkpoint {path} was written by a different model ({len(differences)} variables differ, "
        f"e.g. {'; '.join(differences[:3])}). Use the same --model and dataset to resume, or give a "
        f"new --model-dir to start over."
    )


def checkpoint_step(prefix: str) -> int:
    """The global step a checkpoint prefix was saved at (`ckpt-120` -> 120); -1 for a foreign name."""
    suffix = prefix.rsplit("-", 1)[-1]
    return int(suffix) if suffix.isdigit() else -1


def checkpoint_prefixes(directory: str) -> list[str]:
    """Every checkpoint prefix in the directory, newest first, whatever the `checkpoint` file says."""
    if not os.path.isdir(directory):
        return []
    prefixes = {name[: -len(".index")] for name in os.listdir(directory) if name.endswith(".index")}
    return [os.path.join(directory, prefix) for prefix in sorted(prefixes, key=checkpoint_step, reverse=True)]
