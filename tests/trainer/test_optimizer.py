"""The optimizer of a run: the task's choice, the learning-rate schedule (and its exact resume), and the clip by
global norm after the all-reduce, in one process on two replicas (tests/trainer/conftest.py)."""

from __future__ import annotations

import json
import pathlib
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf

from multiworker import run_group
from replicas import two_replicas
from trainer.artifacts.checkpoint import checkpoint_prefixes, checkpoint_step
from trainer.artifacts.layout import ModelDir
from trainer.base.errors import ConfigError
from trainer.context import parse_config
from trainer.optimizer import WarmupThenDecay, build_optimizer
from trainer.task import Task, task_of


def test_warmup_rises_linearly_then_holds_or_decays_to_zero_at_the_last_step():
    held = WarmupThenDecay(0.1, 4, "constant", 20)
    assert [round(float(held(step)), 6) for step in range(6)] == [0.025, 0.05, 0.075, 0.1, 0.1, 0.1]
    decayed = WarmupThenDecay(0.1, 4, "cosine", 20)
    assert float(decayed(3)) == pytest.approx(0.1) and float(decayed(4)) == pytest.approx(0.1)
    assert float(decayed(12)) == pytest.approx(0.05) and float(decayed(20)) == pytest.approx(0.0, abs=1e-9)
    assert float(WarmupThenDecay(0.1, 0, "cosine", 10)(0)) == pytest.approx(0.1)


def test_the_defaults_keep_a_plain_adam_and_the_task_chooses_its_optimizer():
    config = parse_config([], {})
    optimizer = build_optimizer(task_of(config), config, 1e-3, 100)
    assert type(optimizer) is keras.optimizers.Adam and float(optimizer.learning_rate) == pytest.approx(1e-3)

    class Momentum(Task):
        def optimizer(self, learning_rate):
            return keras.optimizers.SGD(learning_rate, momentum=0.9)

    mixed = parse_config(["--precision", "mixed_float16", "--warmup-steps", "10"], {})
    wrapped = build_optimizer(Momentum(None), mixed, 0.5, 100)
    assert isinstance(wrapped, keras.optimizers.LossScaleOptimizer)  # the group-agreeing subclass
    assert isinstance(wrapped.inner_optimizer, keras.optimizers.SGD) and wrapped.inner_optimizer.momentum == 0.9
    assert isinstance(wrapped.inner_optimizer._learning_rate, WarmupThenDecay)


@pytest.mark.parametrize("flags", [["--clip-norm", "-1"], ["--warmup-steps", "-2"], ["--learning-rate-schedule", "x"]])
def test_bad_schedule_and_clip_flags_are_refused_by_name(flags):
    with pytest.raises((ConfigError, SystemExit)):
        parse_config(flags, {})


def test_the_clip_applies_to_the_summed_gradient_so_every_replica_steps_by_the_clip_norm():
    class Plain(Task):
        def optimizer(self, learning_rate):
            return keras.optimizers.SGD(learning_rate)

    strategy = two_replicas()
    with strategy.scope():
        weights = keras.Variable(np.zeros(3, np.float32))
        optimizer = build_optimizer(Plain(None), parse_config(["--clip-norm", "0.01"], {}), 1.0, 10)
        optimizer.build([weights])

    @tf.function
    def step():
        def replica():
            # Each replica's gradient has norm 1, a hundred times the clip norm, in a direction of its own: clipped
            # one by one (as Keras's clipnorm does, before the sum), their sum would be sqrt(2) times the clip norm.
            index = tf.distribute.get_replica_context().replica_id_in_sync_group
            direction = tf.one_hot(index, 3)
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(weights.value * direction)
            optimizer.apply_gradients([(tape.gradient(loss, weights.value), weights)])

        strategy.run(replica)

    step()
    moved = np.linalg.norm(weights.numpy())
    assert moved == pytest.approx(0.01, rel=1e-4), f"the update's norm is {moved}: not clipped after the sum"


@pytest.mark.slow  # several processes for long: make test-slow
def test_a_resume_continues_the_schedule_exactly(tmp_path):
    flags = ["--dataset", "synthetic", "--train-examples", "512", "--test-examples", "128", "--epochs", "2"]
    flags += ["--per-worker-batch-size", "64", "--steps-per-loop", "2", "--log-every", "2"]
    flags += ["--learning-rate-schedule", "cosine", "--warmup-steps", "5", "--clip-norm", "1"]
    flags += ["--checkpoint-every", "4", "--keep-checkpoints", "10"]

    def train(model_dir):
        (result,) = run_group(1, [*flags, "--model-dir", str(model_dir)]).values()
        assert result.returncode == 0, result.output[-3000:]
        return json.loads((model_dir / "metrics.json").read_text())

    uninterrupted = train(tmp_path / "whole")
    # The same run stopped after step 8: its model dir as the checkpoint at step 8 left it.
    stopped = tmp_path / "stopped"
    shutil.copytree(tmp_path / "whole", stopped)
    layout = ModelDir(str(stopped))
    for prefix in checkpoint_prefixes(layout.checkpoints):
        if checkpoint_step(prefix) > 8:
            for path in pathlib.Path(prefix).parent.glob(pathlib.Path(prefix).name + ".*"):
                path.unlink()
    shutil.rmtree(layout.serving)
    resumed = train(stopped)
    assert resumed["resumed_from_step"] == 8 and resumed["steps"] == 16
    assert resumed["weights_sha256"] == uninterrupted["weights_sha256"]
