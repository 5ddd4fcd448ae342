"""One training step and one test step, how their metrics add up, and the interface of what runs them.

A step is the task's arithmetic: the model's outputs, the per-example loss averaged over the global batch (the
all-reduce sums the workers' gradients), the update, and each metric's values. A step returns its metrics as
sums and counts (`[sum, count]` per metric, "loss" first), and every way of running steps (all-reduce workers,
parameter-server workers, the evaluator) adds those up and divides at the end: one way to compute a metric, in
both modes. `keyed` names them for metrics.json and the status (`train_loss`, `test_accuracy`), in one place.
"""

from __future__ import annotations

import abc
import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np
import tensorflow as tf

from trainer.base.errors import Diverged, ExitCode

if TYPE_CHECKING:
    import keras

    from trainer.settings.config import Config
    from trainer.task import Task


def train_step(
    task: Task,
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    batch: Any,
    global_batch_size: int,
    guard: NonFiniteGuard,
) -> tf.Tensor:
    """One replica's training step on its batch: the update applied (unless the guard skips it); returns its
    metrics' sums and counts, then its HEALTH counts."""
    features, targets = task.features_and_targets(batch)
    # The forward pass in training mode updates the layers' own state (BatchNorm's moving statistics) as it runs, so
    # a step that may be skipped reads that state first, to put it back: a skipped step leaves no trace.
    state = floating(model.non_trainable_variables) if guard.skips else []
    before = [tf.identity(variable.value) for variable in state]
    with tf.GradientTape() as tape:
        outputs = model(features, training=True)
        per_example_loss = tf.cast(task.loss(targets, outputs), tf.float32)
        # Divide by the global batch, not the local one: the all-reduce sums the replicas' gradients.
        loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)
        if model.losses:
            loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        scaled_loss = optimizer.scale_loss(loss)  # the loss itself unless mixed_float16's loss scaling
    gradients = tape.gradient(scaled_loss, model.trainable_variables)
    health = guard.health(loss, gradients)
    skipped = tf.constant(0.0)
    if guard.skips:
        skip = guard.agreed_skip(health)
        # Each replica's share of the skipped step, so the group's sum counts it once.
        skipped = tf.cast(skip, tf.float32) / tf.distribute.get_replica_context().num_replicas_in_sync
        # The choice is made across the replicas (as Keras's loss scaling makes its own): the update all-reduces.
        tf.distribute.get_replica_context().merge_call(_update_unless, args=(skip, optimizer, model, gradients))
        for variable, value in zip(state, before, strict=True):
            variable.assign(tf.where(skip, value, variable.value))
    else:
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
    sums = sums_and_counts(task, targets, outputs, per_example_loss)
    sums = tf.where(skipped > 0, tf.zeros_like(sums), sums)  # a skipped step counts in no metric
    return tf.concat([sums, health, tf.stack([skipped, 0.0])], 0)


def floating(variables: list[Any]) -> list[Any]:
    """The floating-point ones of `variables` (not a seed generator's integer state, say)."""
    return [variable for variable in variables if tf.as_dtype(variable.dtype).is_floating]


def _update_unless(
    distribution: tf.distribute.Strategy, skip: Any, optimizer: Any, model: keras.Model, gradients: Any
) -> None:
    """In cross-replica context: every replica applies its gradients, or none does (the replicas agreed on skip)."""

    def update(gradients: Any) -> None:
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))

    def update_every_replica() -> None:
        distribution.extended.call_for_each_replica(update, args=(gradients,))

    tf.cond(distribution.experimental_local_results(skip)[0], lambda: None, update_every_replica)


def test_step(task: Task, model: keras.Model, batch: Any) -> tf.Tensor:
    """The metrics' sums and counts on one test batch (its HEALTH counts zero). An empty batch, what tf.distribute
    hands a worker whose test shard ended while another's goes on, counts zero without a model call: Conv2D
    answered one with a wrongly shaped tensor, failing the next layer (TF 2.21)."""
    examples = tf.shape(tf.nest.flatten(batch)[0])[0]
    return tf.cond(examples > 0, lambda: _test_sums(task, model, batch), lambda: tf.zeros(slots(task)))


def _test_sums(task: Task, model: keras.Model, batch: Any) -> tf.Tensor:
    features, targets = task.features_and_targets(batch)
    outputs = model(features, training=False)
    sums = sums_and_counts(task, targets, outputs, tf.cast(task.loss(targets, outputs), tf.float32))
    return tf.concat([sums, tf.zeros(len(HEALTH))], 0)


def test_totals(task: Task, model: keras.Model, batches: tf.data.Dataset) -> tf.Tensor:
    """The metrics' sums and counts over every batch of a (local) dataset; call it inside a tf.function."""
    totals = tf.zeros(slots(task))
    for batch in batches:
        totals += test_step(task, model, batch)
    return totals


def metric_names(task: Task) -> tuple[str, ...]:
    """The metrics a step reports, in the order of its sums and counts."""
    return ("loss", *task.metric_names)


def slots(task: Task) -> int:
    """The length of a step's vector: [sum, count] per metric, then HEALTH."""
    return 2 * len(metric_names(task)) + len(HEALTH)


def sums_and_counts(task: Task, targets: Any, outputs: Any, per_example_loss: tf.Tensor) -> tf.Tensor:
    """[sum, count] of each metric's values, flattened in metric_names' order."""
    values = task.metrics(targets, outputs)
    missing = set(task.metric_names) - set(values)
    if missing:
        raise ValueError(f"{type(task).__name__}.metrics() returned no value for {sorted(missing)}")
    parts = [per_example_loss, *(tf.cast(values[name], tf.float32) for name in task.metric_names)]
    return tf.stack([part for value in parts for part in (tf.reduce_sum(value), tf.cast(tf.size(value), tf.float32))])


# What the steps' vectors count beside the metrics, added up over steps and workers: steps whose (unscaled) loss
# or gradients were not finite, steps whose update was skipped, and calls that ended with non-finite weights.
HEALTH = ("nonfinite_loss", "nonfinite_gradients", "skipped", "nonfinite_weights")


@dataclasses.dataclass(frozen=True)
class NonFiniteGuard:
    """What a step does about a loss or gradients that are not finite (--on-nonfinite). It watches this replica's
    values; the workers agree through sums: the call's one all-reduce (stop), or one small all-reduce per step
    before the update (skip), so every worker takes the same decision at the same step."""

    action: str  # stop, skip or ignore
    loss_scaled: bool  # mixed_float16: a non-finite gradient under a finite loss is an overflow the scale skips

    @property
    def skips(self) -> bool:
        return self.action == "skip"

    def health(self, loss: tf.Tensor, gradients: list[Any]) -> tf.Tensor:
        """[loss not finite, gradients not finite] on this replica, 0 or 1 each."""
        if self.action == "ignore":
            return tf.zeros(2)
        loss_bad = tf.logical_not(tf.reduce_all(tf.math.is_finite(loss)))
        present = [getattr(g, "values", g) for g in gradients if g is not None]
        gradients_bad = tf.logical_not(tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in present]))
        if self.loss_scaled:
            gradients_bad = tf.logical_and(gradients_bad, loss_bad)
        return tf.cast(tf.stack([loss_bad, gradients_bad]), tf.float32)

    def agreed_skip(self, health: tf.Tensor) -> tf.Tensor:
        """Whether any replica of the group saw a non-finite value in this step (a collective: every replica)."""
        context = tf.distribute.get_replica_context()
        total = context.all_reduce("SUM", tf.reduce_sum(health)) if context is not None else tf.reduce_sum(health)
        return total > 0

    def weights_health(self, variables: list[Any]) -> tf.Tensor:
        """1 where any of the variables (give model.variables: the layers' own state too, not only the trainable
        weights) is not finite, else 0 (0 when ignoring)."""
        if self.action == "ignore":
            return tf.constant(0.0)
        finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(v)) for v in floating(variables)])
        return tf.cast(tf.logical_not(finite), tf.float32)


class Totals:
    """Sums and counts added up on the host, in float64: the metrics of an epoch or of a test pass, and HEALTH."""

    def __init__(self, names: tuple[str, ...], values: Any = None) -> None:
        self.names = names
        self.values = np.zeros(2 * len(names) + len(HEALTH)) if values is None else np.asarray(values, np.float64)

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

    @property
    def health(self) -> dict[str, float]:
        """HEALTH by name."""
        return dict(zip(HEALTH, self.values[2 * len(self.names) :].tolist(), strict=True))


def check_finite(
    health: dict[str, float], skipped_in_a_row: int, config: Config, steps: tuple[int, int], steps_per_epoch: int
) -> None:
    """Raises Diverged where a call's HEALTH says training went non-finite (--on-nonfinite stop), or skipped more
    than --max-skipped-steps steps in a row (skip), or, in every mode but ignore, left a weight or a layer's state
    non-finite (a skip that let a NaN through must not be saved). steps: the call's first and last global step."""
    what = [
        words
        for key, words in (
            ("nonfinite_loss", "the loss"),
            ("nonfinite_gradients", "the gradients"),
            ("nonfinite_weights", "the weights"),
        )
        if health[key] > 0
    ]
    weights_bad = health["nonfinite_weights"] > 0
    if config.on_nonfinite == "ignore" or not (
        (config.on_nonfinite == "stop" and what) or weights_bad or skipped_in_a_row >= config.max_skipped_steps
    ):
        return
    first, last = steps
    epoch = (first - 1) // steps_per_epoch + 1
    where = f"at step {first}" if first == last else f"in steps {first}-{last}"
    if config.on_nonfinite == "stop":
        seen = f"{' and '.join(what)} went non-finite (NaN or Inf)"
    elif weights_bad:
        seen = (
            "the weights went non-finite (NaN or Inf) though the steps with a non-finite loss or gradients were skipped"
        )
    else:
        seen = f"{skipped_in_a_row} steps in a row were skipped for a non-finite loss or gradients"
    raise Diverged(
        f"training diverged {where} (epoch {epoch}): {seen}. Likely causes: a NaN or Inf in the data (check the "
        f"examples those steps read: a missing value in a CSV reads as NaN), or a learning rate too high (lower "
        f"--learning-rate, add --warmup-steps or --clip-norm). No checkpoint holds these weights and nothing was "
        f"exported"
        + ("; `--on-nonfinite skip` skips such steps instead" if config.on_nonfinite == "stop" else "")
        + f" (exit code {ExitCode.DIVERGED})"
    )


def keyed(split: str, metrics: dict[str, float]) -> dict[str, Any]:
    """{split_name: value}: the names metrics.json, the status and evaluations.json use (train_loss, test_loss)."""
    return {f"{split}_{name}": value for name, value in metrics.items()}


@dataclasses.dataclass(frozen=True)
class CallResult:
    """What a call of steps reports to the loop."""

    sums: Any  # the metrics' sums and counts, then HEALTH, of the steps applied meanwhile, over the whole group
    skipped_in_a_row: int  # the longest run of consecutive skipped steps so far that reaches into this call
    stopping: bool  # a worker asked to stop (SIGTERM): the group stops here


class StepRunner(abc.ABC):
    """How calls of training steps run: on every all-reduce worker (trainer/distribution/sync_runner.py) or
    scheduled onto parameter-server workers (trainer/ps/async_runner.py). Built beside the model on the process's
    data (trainer/data/inputs.py), which it reads but does not open, started once the model is restored; the loop
    calls it at the same steps on every worker."""

    global_batch_size: int  # examples per step

    @abc.abstractmethod
    def start(
        self, model: keras.Model, optimizer: keras.optimizers.Optimizer, start_step: int, steps_per_epoch: int
    ) -> None:
        """Prepares the calls to run from start_step on."""

    @abc.abstractmethod
    def run(self, steps: int, stop_requested: bool, settle: bool) -> CallResult:
        """Runs a call of `steps` steps. settle: every step started so far is applied when it returns."""

    @abc.abstractmethod
    def evaluate(self) -> Any:
        """The metrics' sums and counts over the test split."""

    @abc.abstractmethod
    def describe(self) -> str:
        """How the work is split, for the run's first line."""

    def corrupt_records_skipped(self) -> dict[str, int]:
        """{"corrupt_records_skipped": n} over the group under --on-corrupt-record skip, else {}; every worker calls
        it at the same point (it may be a collective)."""
        return {}
