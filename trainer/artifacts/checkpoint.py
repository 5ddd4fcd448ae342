"""Checkpoints on the shared volume, restored by every worker from the chief's directory.

The chief writes `<model-dir>/checkpoints`; the other workers must save too
(saving can need every worker) and write to a scratch directory outside the
model directory that they delete. At start-up every worker restores the chief's
newest readable checkpoint, so a restarted worker never holds fresh weights
while the others hold trained ones. Each candidate's index is checked before any
live variable is touched (nothing is read twice, nothing written to learn the
model's shapes): an unreadable one is skipped for the one before it, and one
whose variables do not fit this model, or whose run setup differs, is refused
with the mismatch named.
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

import numpy as np
import tensorflow as tf

from trainer.artifacts.atomic_file import write_json
from trainer.artifacts.layout import ModelDir
from trainer.errors import ModelDirError, first_line

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
        """Restores the chief's newest readable checkpoint on this worker; returns its global step.

        A candidate is checked from its index alone (variables, shapes, and data files long enough for them), so
        the check costs the same for any model size; the restore then reads each tensor once, verifying its
        checksum. A candidate that fails either way is skipped for the one before it (that one's restore then
        overwrites every variable a failed restore may have touched)."""
        candidates = checkpoint_prefixes(self.directory)
        if not candidates:
            return 0
        expected = self._variable_shapes()
        damaged = []
        for path in candidates:
            try:
                shapes = _read_index(path)
            except Exception as error:  # noqa: BLE001 (truncated files raise IndexError, others OpError)
                log.warning("checkpoint %s is unreadable (%s); trying the one before it", path, first_line(error)[:200])
                continue
            _refuse_if_different(path, shapes, expected)
            try:
                self.checkpoint.restore(path).assert_existing_objects_matched()
            except (tf.errors.OpError, ValueError) as error:
                log.warning("checkpoint %s is unreadable (%s); trying the one before it", path, first_line(error)[:200])
                damaged.append(path)
                continue
            log.info("resumed from %s at global step %d", path, int(self.global_step.numpy()))
            return int(self.global_step.numpy())
        if damaged:
            # A failed restore may have written some variables already: starting afresh from them would be wrong.
            raise ModelDirError(
                f"no checkpoint in {self.directory} could be restored ({', '.join(damaged)} failed while being "
                f"read). Delete the damaged checkpoint files to start from an earlier one or from step 0, or give a "
                f"new --model-dir"
            )
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
        """The variables and shapes a checkpoint of this model has: the checkpoint keys TensorFlow would save,
        from the object graph of the live objects, with each variable's own shape (nothing is written or read)."""
        # No public API names the keys a save would write; save_util is what tf.train.Checkpoint.write calls.
        from tensorflow.python.checkpoint import graph_view, save_util

        serialized = save_util.serialize_graph_view(graph_view.ObjectGraphView(self.checkpoint))[0]
        return {
            key: list(trackable.shape)
            for trackable, tensors in serialized.items()
            for key in tensors
            if key not in _BOOKKEEPING
        }


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


def _read_index(path: str) -> dict[str, list[int]]:
    """The variables and shapes of a checkpoint, from its index file; raises if its data files are shorter than the
    index says its numeric tensors need (a truncated write). Reads no tensor."""
    reader = tf.train.load_checkpoint(path)
    dtypes = reader.get_variable_to_dtype_map()
    shapes = reader.get_variable_to_shape_map()
    needed = sum(int(np.prod(shape)) * dtypes[name].size for name, shape in shapes.items() if dtypes[name] != tf.string)
    found = sum(tf.io.gfile.stat(data).length for data in tf.io.gfile.glob(f"{path}.data-*"))
    if found < needed:
        raise ValueError(f"its data files hold {found} bytes, fewer than the {needed} its variables need (truncated)")
    return _shapes(reader)


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
