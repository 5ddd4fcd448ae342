"""train_and_evaluate in-process on tiny synthetic data, on two replicas: artifacts, metrics.json, resuming."""

import json
import os
import time

import pytest
import tensorflow as tf

from replicas import two_replicas
from trainer.__main__ import open_inputs
from trainer.artifacts import layout
from trainer.context import RunContext, parse_config
from trainer.distribution.cluster import SINGLE_PROCESS
from trainer.distribution.sync_runner import SyncRunner
from trainer.loop import train_and_evaluate
from trainer.reporting.progress import Startup
from trainer.reporting.report import Reporter
from trainer.task import task_of
from trainer.tasks.image_classification import MODELS

TINY = [
    "--dataset",
    "synthetic",
    "--train-examples",
    "512",
    "--test-examples",
    "128",
    "--per-worker-batch-size",
    "64",
    "--steps-per-loop",
    "2",
    "--log-every",
    "2",
    "--checkpoint-every",
    "0",
]


def train(model_dir, *flags):
    config = parse_config([*TINY, *flags, "--model-dir", str(model_dir)], {})
    context = RunContext(config, SINGLE_PROCESS, task_of(config), layout.ModelDir(config.model_dir))
    reporter = Reporter(context.model_dir, SINGLE_PROCESS.name, is_chief=True)
    strategy = two_replicas()
    inputs = open_inputs(config, SINGLE_PROCESS, strategy)
    try:
        return train_and_evaluate(context, strategy, inputs, SyncRunner, Startup(time.time()), reporter)
    finally:
        reporter.close()


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    model_dir = tmp_path_factory.mktemp("run") / "model"
    return model_dir, train(model_dir, "--epochs", "1")


def test_a_run_leaves_every_artifact(one_epoch):
    model_dir, _ = one_epoch
    assert set(layout.ARTIFACTS) <= set(os.listdir(model_dir))
    assert os.listdir(layout.ModelDir(str(model_dir)).logs("train"))


def test_metrics_json_holds_what_the_readme_promises(one_epoch):
    model_dir, returned = one_epoch
    metrics = json.loads((model_dir / layout.METRICS).read_text())
    assert metrics == json.loads(json.dumps(returned))
    for key in (
        "train_loss",
        "train_accuracy",
        "test_loss",
        "test_accuracy",
        "examples_per_second",
        "time_to_first_step_seconds",
        "duration_seconds",
    ):
        assert metrics[key] > 0, key
    assert metrics["workers"] == 1 and metrics["global_batch_size"] == 64 and metrics["steps_per_epoch"] == 8
    assert metrics["steps"] == 8 and metrics["resumed_from_step"] == 0 and metrics["restarts"] == 0
    assert metrics["train_examples"] == 512 and metrics["test_examples"] == 128
    assert metrics["config"]["model"] == "cnn" and metrics["config"]["epochs"] == 1
    assert {"python", "tensorflow", "keras"} <= set(metrics["versions"])
    assert len(metrics["weights_sha256"]) == 64
    # The start-up milestones the loop reaches (make bench prints them), in the order it reaches them.
    startup = metrics["startup_seconds"]
    assert 0 < startup["model_restored"] <= startup["input_ready"] <= startup["first_step"], startup


def test_the_status_and_tensorboard_tell_the_same_run_as_metrics_json(one_epoch):
    model_dir, returned = one_epoch
    status = json.loads((model_dir / layout.STATUS).read_text())
    assert status["state"] == "succeeded" and status["global_step"] == status["checkpoint_step"] == returned["steps"]
    assert status["test_loss"] == returned["test_loss"] and status["test_accuracy"] == returned["test_accuracy"]
    assert status["tested_epoch"] == 1  # the epoch its test figures are of (a tuner prunes by them)
    assert os.listdir(layout.ModelDir(str(model_dir)).logs("test"))


def test_a_second_call_resumes_from_the_last_checkpoint(one_epoch):
    model_dir, first = one_epoch
    second = train(model_dir, "--epochs", "2")
    assert second["resumed_from_step"] == first["steps"] == 8
    assert second["steps"] == 16 and second["weights_sha256"] != first["weights_sha256"]


# batch_norm, whose moving statistics a replica context must update, in the quick suite; the others in make test-slow.
VARIANTS = [
    pytest.param(name, marks=() if name == "batch_norm" else pytest.mark.slow) for name in sorted(set(MODELS) - {"cnn"})
]


@pytest.mark.parametrize("name", VARIANTS)
def test_every_variant_trains_with_state_updated_in_replica_context(name, tmp_path):
    metrics = train(tmp_path / name, "--model", name, "--epochs", "1")
    assert metrics["steps"] == 8 and metrics["test_loss"] > 0
    assert (tmp_path / name / layout.KERAS_MODEL).exists()


@pytest.mark.slow  # 16-bit convolutions are emulated on most CPUs: over a minute each on 2 shared cores
@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_trains_and_the_saved_model_keeps_its_dtypes(precision, tmp_path):
    import keras
    import numpy as np

    try:
        metrics = train(tmp_path / precision, "--precision", precision, "--epochs", "1")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert metrics["config"]["precision"] == precision and np.isfinite(metrics["test_loss"])
    serve = tf.saved_model.load(layout.ModelDir(str(tmp_path / precision)).latest_saved_model()).signatures["serve"]
    assert serve.structured_input_signature[1]["images"].dtype == tf.uint8
    outputs = serve.structured_outputs
    assert (outputs["probabilities"].dtype, outputs["class_id"].dtype) == (tf.float32, tf.int64)


# The StdOut metrics collector's default filter (Katib v0.19.0, pkg/metricscollector/v1beta1/common/const.go):
# name=value anywhere in a line; a tuner on the cluster reads the objective from the chief's output so.
KATIB_DEFAULT_FILTER = r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)"


def test_the_results_end_the_output_as_name_value_pairs_a_tuner_reads(tmp_path, capsys):
    import re

    model_dir = tmp_path / "model"
    train(model_dir, "--epochs", "1")
    output = capsys.readouterr().out
    read = [(name, float(value)) for name, value, *_ in re.findall(KATIB_DEFAULT_FILTER, output) if value]
    metrics = json.loads((model_dir / layout.METRICS).read_text())
    for key in ("test_accuracy", "test_loss", "train_accuracy", "train_loss"):
        # Katib keeps every value it reads and takes the best: each name once, the final value.
        (value,) = [value for name, value in read if name == key]
        assert value == pytest.approx(metrics[key], rel=1e-6), (key, output[-2000:])
