"""The evaluator task following a real run's checkpoints: one evaluation per checkpoint, exit 0 after the last."""

import json
import os

import pytest

from multiworker import free_ports, start, tf_config, trainer_flags, wait_all
from trainer.artifacts import layout
from trainer.artifacts.checkpoint import checkpoint_prefixes, checkpoint_step

# 2048 examples / batch 64 = 32 steps per epoch, 2 epochs, a checkpoint every 8 steps: 8 checkpoints, all kept.
RUN = [
    *trainer_flags(dataset="synthetic", train_examples=2048, test_examples=512, seed=3, epochs=2, threads=1),
    *trainer_flags(log_every=8, steps_per_loop=4, checkpoint_every=8, keep_checkpoints=100),
]


@pytest.mark.slow  # several processes for long: make test-slow
def test_the_evaluator_evaluates_every_checkpoint_and_exits_after_the_last(tmp_path):
    model_dir = tmp_path / "model"
    trainer_port, evaluator_port = (f"127.0.0.1:{port}" for port in free_ports(2))
    cluster = {"worker": [trainer_port], "evaluator": [evaluator_port]}
    args = [*RUN, "--model-dir", str(model_dir)]
    results = wait_all(
        {
            "evaluator": start(args, tf_config(cluster, "evaluator", 0)),
            "trainer": start([*args, "--no-eval-in-loop"], tf_config(cluster, "worker", 0)),
        },
        300,
    )
    for result in results.values():
        assert result.returncode == 0, result.output[-3000:]
    model = layout.ModelDir(str(model_dir))
    saved = sorted(checkpoint_step(prefix) for prefix in checkpoint_prefixes(model.checkpoints))
    evaluations = json.loads(open(model.evaluations).read())["evaluations"]
    assert [e["global_step"] for e in evaluations] == saved == list(range(8, 65, 8))
    assert os.listdir(model.logs("eval"))
    assert "evaluated the final checkpoint (step 64)" in results["evaluator"].output
    # The last checkpoint holds the saved model's weights: the evaluator and the chief agree on its accuracy.
    metrics = json.loads(open(model.metrics).read())
    assert abs(evaluations[-1]["test_accuracy"] - metrics["test_accuracy"]) < 1e-6


@pytest.mark.slow  # several processes for long: make test-slow
def test_without_eval_in_loop_the_chief_evaluates_only_the_last_epoch(tmp_path):
    result = wait_all(
        {"single": start([*RUN, "--no-eval-in-loop", "--model-dir", str(tmp_path / "model")], None)}, 300
    )["single"]
    assert result.returncode == 0, result.output[-3000:]
    assert "epoch 1/2 done: train loss" in result.output and "(test pass left to the evaluator)" in result.output
    assert "epoch 2/2 done:" in result.output and "| test loss" in result.output
