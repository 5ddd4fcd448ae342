"""One training step and one test step, how their metrics add up, and the interface of what runs them.

A step is the task's arithmetic: the model's outputs, the per-example loss averaged over the global batch (the
all-reduce sums the workers' gradients), the update, and each metric's values. A step returns its metrics as
sums and counts (`[sum, count]` per metric, "loss" first), and every way of running steps (all-reduce workers,
parameter-server workers, the evaluator) adds those up and divides at the end: one way to compute a metric, in
both modes. `keyed` names them for metrics.json and the status (`train_loss`, `test_accuracy`), in one place.
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

if TYPE_CHECKING:
    import keras

    from trainer.data.datasets import Source
    from trainer.task import Task


def train_step(
    task: Task, model: keras.Model, optimizer: keras.optimizers.Optimizer, batch: Any, global_batch_size: int
) -> tf.Tensor:
    """One replica's training step on its batch: the update applied; returns its metrics' sums and counts."""
    features, targets = task.features_and_targets(batch)
    with tf.GradientTape() as tape:
        outputs = model(features, training=True)
        per_example_loss = tf.cast(task.loss(targets, outputs), tf.float32)
        # Divide by the global batch, not the local one: the all-reduce sums the replicas' gradients.
        loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)
        if model.losses:
            loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        scaled_loss = optimizer.scale_loss(loss)  # the loss itself unless mixed_float16's loss scaling
    gradients = tape.gradient(scaled_loss, model.trainable_variables)
    optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
    return sums_and_counts(task, targets, outputs, per_example_loss)


def test_step(task: Task, model: keras.Model, batch: Any) -> tf.Tensor:
    """The metrics' sums and counts on one test batch."""
    features, targets = task.features_and_targets(batch)
    outputs = model(features, training=False)
    return sums_and_counts(task, targets, outputs, tf.cast(task.loss(targets, outputs), tf.float32))


def test_totals(task: Task, model: keras.Model, batches: tf.data.Dataset) -> tf.Tensor:
    """The metrics' sums and counts over every batch of a (local) dataset; call it inside a tf.function."""
    totals = tf.zeros(2 * len(metric_names(task)))
    for batch in batches:
        totals += test_step(task, model, batch)
    return totals


def metric_names(task: Task) -> tuple[str, ...]:
    """The metrics a step reports, in the order of its sums and counts."""
    return ("loss", *task.metric_names)


def sums_and_counts(task: Task, targets: Any, outputs: Any, per_example_loss: tf.Tensor) -> tf.Tensor:
    """[sum, count] of each metric's values, flattened in metric_names' order."""
    values = task.metrics(targets, outputs)
    missing = set(task.metric_names) - set(values)
    if missing:
        raise ValueError(f"{type(task).__name__}.metrics() returned no value for {sorted(missing)}")
    parts = [per_example_loss, *(tf.cast(values[name], tf.float32) for name in task.metric_names)]
    return tf.stack([part for value in parts for part in (tf.reduce_sum(value), tf.cast(tf.size(value), tf.float32))])


class Totals:
    """Sums and counts added up on the host, in float64: the metrics of an epoch or of a test pass."""

    def __init__(self, names: tuple[str, ...], values: Any = None) -> None:
        self.names = names
        self.values = np.zeros(2 * len(names)) if values is None else np.asarray(values, np.float64)

    def add(self, other: Totals) -> None:
        self.values = self.values + other.values

    @property
    def examples(self) -> int:
        """How many examples the totals cover: the loss has one value per example."""
        return int(self.values[1])

    def means(self) -> dict[str, float]:
        """{name: sum / count} of each metric."""
        return {
            name: float(self.values[2 * i]) / max(float(self.values[2 * i + 1]), 1.0)
            for i, name in enumerate(self.names)
        }


def keyed(split: str, metrics: dict[str, float]) -> dict[str, Any]:
    """{split_name: value}: the names metrics.json, the status and evaluations.json use (train_loss, test_loss)."""
    return {f"{split}_{name}": value for name, value in metrics.items()}


class StepRunner(abc.ABC):
    """How calls of training steps run: on every all-reduce worker (trainer/distribution/sync_runner.py) or
    scheduled onto parameter-server workers (trainer/ps/async_runner.py). Built before the model (it opens this
    process's data and knows the steps per epoch), started once the model is restored; the loop calls it at the
    same steps on every worker."""

    source: Source  # the dataset this process reads: the task builds its model for it
    global_batch_size: int  # examples per step
    steps_per_epoch: int
    sizes: dict[str, Any]  # train_examples, test_examples, cache: recorded in metrics.json

    @abc.abstractmethod
    def start(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, start_step: int) -> None:
        """Prepares the calls to run from start_step on."""

    @abc.abstractmethod
    def run(self, steps: int, stop_requested: bool, settle: bool) -> tuple[Any, bool]:
        """Runs a call of `steps` steps; returns (the metrics' sums and counts of the steps applied meanwhile,
        whether the group stops here). settle: every step started so far is applied when it returns."""

    @abc.abstractmethod
    def evaluate(self) -> Any:
        """The metrics' sums and counts over the test split."""

    @abc.abstractmethod
    def describe(self) -> str:
        """How the work is split, for the run's first line."""
