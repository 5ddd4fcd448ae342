"""The evaluator in one process, at its edges: a model dir reused from an earlier run, and an empty test split."""

import json

import pytest
import tensorflow as tf

from trainer import evaluator
from trainer.__main__ import open_inputs
from trainer.artifacts.layout import ModelDir
from trainer.base.errors import DataError
from trainer.context import RunContext, parse_config
from trainer.data import records
from trainer.data.datasets import Source, image_spec
from trainer.distribution.cluster import from_environment
from trainer.task import task_of


class StillWaiting(Exception):
    """Raised instead of the evaluator's sleep between polls: it would have polled again."""


@pytest.fixture
def no_sleep(monkeypatch):
    def sleep(seconds):
        raise StillWaiting

    monkeypatch.setattr(evaluator.time, "sleep", sleep)


def leave_earlier_run(model_dir, step, epochs):
    """What a finished run leaves: a checkpoint at its last step and a status naming that step as the final one."""
    layout = ModelDir(str(model_dir))
    model = task_of(parse_config([], {})).build_model(Source(None, None, image_spec((28, 28, 1)), 10))
    tf.train.Checkpoint(model=model).write(f"{layout.checkpoints}/ckpt-{step}")
    with open(layout.status, "w") as handle:
        json.dump({"state": "succeeded", "global_step": step, "total_steps": step, "epochs": epochs}, handle)


def with_task(config):
    """The config, its task, this process's cluster and its data, as the entry point hands them to the evaluator."""
    cluster = from_environment()
    return RunContext(config, cluster, task_of(config), ModelDir(config.model_dir)), open_inputs(config, cluster)


def evaluator_config(model_dir, *extra):
    flags = ["--dataset", "synthetic", "--train-examples", "256", "--test-examples", "64", *extra]
    return parse_config([*flags, "--model-dir", str(model_dir)], environ={})


def test_an_earlier_runs_final_step_does_not_end_the_evaluator_of_a_longer_run(tmp_path, no_sleep, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    leave_earlier_run(tmp_path, 8, epochs=2)
    with pytest.raises(StillWaiting):  # --epochs 4 runs past step 8: wait for this run's chief to say where it ends
        evaluator.follow_checkpoints(*with_task(evaluator_config(tmp_path, "--epochs", "4")))
    # The same run setup (a chief resumed after its last step) does end at that step.
    evaluations = evaluator.follow_checkpoints(*with_task(evaluator_config(tmp_path, "--epochs", "2")))
    assert [e["global_step"] for e in evaluations] == [8]


def test_an_empty_test_split_is_refused_naming_it(tmp_path, no_sleep, monkeypatch):
    monkeypatch.delenv("TF_CONFIG", raising=False)
    records.write_split(str(tmp_path), "train", 8, 1, seed=1, encoding="raw")
    with tf.io.TFRecordWriter(str(tmp_path / "test-empty.tfrecord")):
        pass
    leave_earlier_run(tmp_path / "model", 8, epochs=2)
    flags = ["--train-files", str(tmp_path / "train-*"), "--test-files", str(tmp_path / "test-*")]
    config = parse_config(
        ["--dataset", "tfrecord", "--image-shape", "28x28x1", "--num-classes", "10", *flags, "--epochs", "2"]
        + ["--model-dir", str(tmp_path / "model")],
        environ={},
    )
    with pytest.raises(DataError, match=r"test split .* has no examples"):
        evaluator.follow_checkpoints(*with_task(config))
