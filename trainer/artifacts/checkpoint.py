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

from trainer.artifacts.layout import ModelDir
from trainer.base import private_api
from trainer.base.atomic_file import write_json
from trainer.base.errors import ConfigError, ModelDirError, first_line

log = logging.getLogger(__name__)

# What decides the meaning of a step: change any of these and step N is no longer the same step (refused).
RESUME_KEYS = ("model", "dataset", "train_examples", "global_batch_size", "seed", "train_data")
# What an exact resume (to the weights of an uninterrupted run) also depends on: a change is allowed, and said.
EXACT_RESUME_KEYS = ("workers", "steps_per_epoch", "cache", "shuffle_buffer")
# Bookkeeping entries every checkpoint has, whatever the model.
_BOOKKEEPING = ("_CHECKPOINTABLE_OBJECT_GRAPH", "save_counter/.ATTRIBUTES/VARIABLE_VALUE")


class Checkpointer:
    """Owns the tf.train.Checkpoint of model, optimizer and global step, and where it is written."""

    def __init__(self, model_dir: ModelDir, is_chief: bool, task_name: str, keep: int, **trackables: Any) -> None:
        self.model_dir = model_dir
        self.directory = model_dir.checkpoints
        self.run_setup_path = model_dir.run_setup
        self.is_chief = is_chief
        self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self.checkpoint = tf.train.Checkpoint(global_step=self.global_step, **trackables)
        self._write_directory = self.directory if is_chief else _scratch_directory(model_dir.root, task_name)
        self.manager = tf.train.CheckpointManager(self.checkpoint, self._write_directory, max_to_keep=keep)

    def check_run_setup(self, setup: dict[str, Any]) -> dict[str, Any] | None:
        """Refuses checkpoints whose steps meant something else; returns the recorded setup (None without
        checkpoints)."""
        recorded = recorded_run_setup(self.model_dir)
        if recorded is None:
            return None
        mismatches = [
            f"{key}: checkpoint has {recorded[key]!r}, this run has {setup.get(key)!r}"
            for key in RESUME_KEYS
            if key in recorded and recorded[key] != setup.get(key)
        ]
        if mismatches:
            raise ModelDirError(
                f"the checkpoints in {self.directory} come from a different run setup ({'; '.join(mismatches)}). "
                f"Run with the same settings to resume, or give a new --model-dir to start over."
            )
        return recorded

    def record_run_setup(self, setup: dict[str, Any]) -> None:
        """The chief records what the checkpoints it writes from now on depend on (before the first of them)."""
        if self.is_chief:
            keys = (*RESUME_KEYS, *EXACT_RESUME_KEYS, "per_worker_batch_size")
            write_json(self.run_setup_path, {key: setup.get(key) for key in keys})

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
            if expected is not None:
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
        try:
            self.manager.save(checkpoint_number=step)
        except Exception:
            # A failed write (a full volume) leaves TensorFlow's partial files behind: give their space back.
            for partial in tf.io.gfile.glob(os.path.join(self._write_directory, f"ckpt-{step}_temp*")):
                shutil.rmtree(partial, ignore_errors=True)
            raise

    def close(self) -> None:
        if not self.is_chief:
            shutil.rmtree(self._write_directory, ignore_errors=True)

    def _variable_shapes(self) -> dict[str, list[int]] | None:
        """The variables and shapes a checkpoint of this model has (None: leave the check to the restore's own
        matching)."""
        shapes = private_api.checkpoint_variable_shapes(self.checkpoint)
        return None if shapes is None else {key: shape for key, shape in shapes.items() if key not in _BOOKKEEPING}


def recorded_run_setup(layout: ModelDir) -> dict[str, Any] | None:
    """The run setup recorded beside the checkpoints; None when there is no checkpoint (or no record) to resume."""
    if not checkpoint_prefixes(layout.checkpoints) or not os.path.exists(layout.run_setup):
        return None
    try:
        with open(layout.run_setup) as handle:
            recorded = json.load(handle)
    except (OSError, ValueError) as error:
        raise ModelDirError(
            f"{layout.run_setup} is unreadable ({error}); delete it to resume from these checkpoints anyway, or "
            f"give a new --model-dir"
        ) from None
    wrong = _wrong_shape(recorded)
    if wrong:
        raise ModelDirError(
            f"{layout.run_setup} is not a run setup ({wrong}); delete it to resume from these checkpoints anyway, or "
            f"give a new --model-dir"
        )
    return dict(recorded)


# The recorded numbers the resume computes with: each an integer (or null, where a run had none).
_COUNTS = ("global_batch_size", "workers", "per_worker_batch_size", "steps_per_epoch")


def _wrong_shape(recorded: Any) -> str | None:
    """What makes valid JSON not a run setup, None when it is one."""
    if not isinstance(recorded, dict):
        return f"expected an object, found {type(recorded).__name__}"
    for key in _COUNTS:
        value = recorded.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            return f"{key} is {value!r}, not a whole number"
    return None


def resumed_per_worker_batch(recorded: dict[str, Any] | None, per_worker_batch_size: int, workers: int) -> int:
    """The per-worker batch of a run on `workers` workers. Resuming checkpoints written by another number of workers
    with the same --per-worker-batch-size keeps their global batch (a step means the same number of examples), so
    each worker takes global / workers; a worker count that does not divide it is refused naming the choices."""
    if (
        recorded is None
        or recorded.get("per_worker_batch_size") != per_worker_batch_size
        or recorded.get("workers") in (None, workers)
    ):
        return per_worker_batch_size
    global_batch, written_by = int(recorded["global_batch_size"]), recorded["workers"]
    if global_batch % workers:
        choices = [count for count in range(1, min(global_batch, 64) + 1) if global_batch % count == 0]
        raise ConfigError(
            f"the checkpoints were written by {written_by} workers with a global batch of {global_batch}, which a "
            f"resumed run keeps; {workers} workers cannot share it evenly. Resume on a worker count that divides "
            f"{global_batch} ({', '.join(map(str, choices))}), or start over with another batch: a new --model-dir "
            f"(make run-local: CLEAN=1 or another JOB_NAME)"
        )
    return global_batch // workers


def resume_note(recorded: dict[str, Any] | None, setup: dict[str, Any], start_step: int) -> str | None:
    """One line for a resume that cannot be exact (a key of EXACT_RESUME_KEYS changed): what changed, and what it
    means for the data of the epoch in progress (docs/data.md, "Resuming on another number of workers")."""
    if recorded is None or not start_step:
        return None
    changed = [
        f"{key} {recorded[key]} -> {setup.get(key)}"
        for key in EXACT_RESUME_KEYS
        if key in recorded and recorded[key] is not None and recorded[key] != setup.get(key)
    ]
    if not changed:
        return None
    steps_per_epoch, global_batch = setup["steps_per_epoch"], setup["global_batch_size"]
    epoch, done = divmod(start_step, steps_per_epoch)
    return (
        f"resuming at step {start_step} with {', '.join(changed)}: the global step goes on and the global batch "
        f"stays {global_batch} ({global_batch // setup['workers']} per worker); epoch {epoch + 1} goes on from its "
        f"step {done + 1} of {steps_per_epoch} in the order this setup reads it, so up to {done * global_batch} of "
        f"its examples may come twice in it and as many not at all; later epochs read each example once. The "
        f"weights will differ from an uninterrupted run's (an exact resume needs the same "
        f"{', '.join(EXACT_RESUME_KEYS)})"
    )


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
