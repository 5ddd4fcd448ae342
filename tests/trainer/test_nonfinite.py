"""The non-finite guard (--on-nonfinite): one NaN feature in one training row, with real processes. Stopping: exit 4,
the status says diverged, the newest checkpoint is finite, nothing is exported and no metrics.json remains.
Skipping: the run finishes with finite weights and counts the skipped steps."""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tensorflow as tf
from test_async import run_async

from multiworker import run_group, trainer_flags
from trainer.artifacts import layout
from trainer.artifacts.checkpoint import checkpoint_prefixes
from trainer.base.errors import Diverged, ExitCode
from trainer.settings.config import Config
from trainer.step import NonFiniteGuard, check_finite

TASK = ["--task-module", "examples.regression", "--task", "regression", "--dataset-module", "poisoned_rows"]
POISONED = [*TASK, "--dataset", "poisoned_rows", "--poisoned-row", "100"]
RUN = trainer_flags(epochs=3, per_worker_batch_size=16, steps_per_loop=4, log_every=8, checkpoint_every=4)


def assert_stopped_cleanly(result, model_dir):
    assert result.returncode == ExitCode.DIVERGED, result.output[-3000:]
    line = next(line for line in result.output.splitlines() if "training diverged" in line)
    assert "(epoch " in line and "went non-finite" in line and "a NaN or Inf in the data" in line, line
    assert "--learning-rate" in line, line
    status = json.loads((model_dir / layout.STATUS).read_text())
    assert status["state"] == "diverged" and status["exit_code"] == ExitCode.DIVERGED
    dir_layout = layout.ModelDir(str(model_dir))
    newest = checkpoint_prefixes(dir_layout.checkpoints)
    for name, _ in tf.train.list_variables(newest[0]) if newest else []:
        value = tf.train.load_checkpoint(newest[0]).get_tensor(name)
        if np.issubdtype(np.asarray(value).dtype, np.floating):
            assert np.all(np.isfinite(value)), f"{newest[0]} holds non-finite {name}"
    assert not (model_dir / layout.SERVING).exists() and not (model_dir / layout.KERAS_MODEL).exists()
    assert not (model_dir / layout.METRICS).exists()


@pytest.mark.slow  # a group of two: make test-slow (one diverged worker's exit 4 stays quick: test_termination_message)
@pytest.mark.parametrize("precision", ["float32", "mixed_float16"])
def test_two_workers_stop_at_a_poisoned_row_with_exit_4(tmp_path, precision):
    model_dir = tmp_path / "model"
    results = run_group(2, [*POISONED, *RUN, "--precision", precision, "--model-dir", str(model_dir)])
    assert_stopped_cleanly(results["worker-0"], model_dir)
    assert results["worker-1"].returncode == ExitCode.DIVERGED, results["worker-1"].output[-3000:]


@pytest.mark.slow
def test_two_workers_skip_the_poisoned_steps_and_count_them(tmp_path):
    model_dir = tmp_path / "model"
    results = run_group(2, [*POISONED, *RUN, "--on-nonfinite", "skip", "--model-dir", str(model_dir)])
    for result in results.values():
        assert result.returncode == 0, result.output[-3000:]
    metrics = json.loads((model_dir / layout.METRICS).read_text())
    # The row lies in one batch of one worker per epoch: one agreed skip per epoch.
    assert metrics["skipped_steps"] == 3 and np.isfinite(metrics["test_loss"]) and np.isfinite(metrics["train_loss"])
    assert "steps skipped (non-finite)" in results["worker-0"].output
    model = tf.saved_model.load(layout.ModelDir(str(model_dir)).latest_saved_model())
    assert all(np.all(np.isfinite(v.numpy())) for v in model.variables)


def finite_everywhere(model_dir):
    """Whether every float variable of the newest checkpoint, the SavedModel and model.keras is finite."""
    dir_layout = layout.ModelDir(str(model_dir))
    newest = checkpoint_prefixes(dir_layout.checkpoints)[0]
    values = [tf.train.load_checkpoint(newest).get_tensor(name) for name, _ in tf.train.list_variables(newest)]
    values += [v.numpy() for v in tf.saved_model.load(dir_layout.latest_saved_model()).variables]
    values += [np.asarray(v) for v in keras.saving.load_model(dir_layout.keras_model, compile=False).weights]
    return all(np.all(np.isfinite(v)) for v in values if np.issubdtype(np.asarray(v).dtype, np.floating))


@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_a_skipped_step_leaves_no_nan_in_batch_norms_moving_statistics(tmp_path, workers):
    # Before: the forward pass put the poisoned batch's NaN mean into moving_mean; the run exited 0 and served a model
    # that answered the same value for every input.
    model_dir = tmp_path / "model"
    flags = ["--task-module", "batch_norm_regression", "--task", "batch_norm_regression", *POISONED[4:]]
    results = run_group(workers, [*flags, *RUN, "--on-nonfinite", "skip", "--model-dir", str(model_dir)])
    for result in results.values():
        assert result.returncode == 0, result.output[-3000:]
    metrics = json.loads((model_dir / layout.METRICS).read_text())
    assert metrics["skipped_steps"] == 3 and np.isfinite(metrics["test_loss"])
    assert finite_everywhere(model_dir)


def test_a_nonfinite_layer_state_stops_a_skipping_run_too():
    # Before: check_finite ignored non-finite weights unless the mode was stop, and read only the trainable ones.
    config = Config(on_nonfinite="skip")
    health = {"nonfinite_loss": 0.0, "nonfinite_gradients": 0.0, "skipped": 0.0, "nonfinite_weights": 1.0}
    with pytest.raises(Diverged, match="the weights went non-finite"):
        check_finite(health, 0, config, (5, 8), 32)
    state = tf.Variable([np.nan], trainable=False)
    assert float(NonFiniteGuard("skip", loss_scaled=False).weights_health([tf.Variable([1.0]), state])) == 1.0
    check_finite({**health, "nonfinite_weights": 1.0}, 0, Config(on_nonfinite="ignore"), (5, 8), 32)


@pytest.mark.slow
def test_async_stops_at_a_poisoned_row_with_exit_4(tmp_path):
    model_dir = tmp_path / "model"
    _, results, _ = run_async(model_dir, [*POISONED, *RUN], workers=1)
    assert_stopped_cleanly(results["chief"], model_dir)


@pytest.mark.slow  # several processes for long: make test-slow
def test_the_default_run_is_untouched_by_the_guard(tmp_path):
    model_dir = tmp_path / "model"
    results = run_group(1, [*TASK, "--dataset", "poisoned_rows", *RUN, "--model-dir", str(model_dir)])
    assert results["worker-0"].returncode == 0, results["worker-0"].output[-3000:]
    assert json.loads((model_dir / layout.METRICS).read_text())["skipped_steps"] == 0
