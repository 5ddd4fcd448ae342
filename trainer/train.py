"""The training loop: one function, readable top to bottom.

Keras 3 `model.fit` fails under MultiWorkerMirroredStrategy, so this is a
custom loop: `strategy.run` of a train step inside a `tf.function` that runs
several steps per call, the loss averaged over the global batch, metrics kept
per replica and reduced across workers only when they are read (log intervals,
epoch ends). Every worker runs exactly the same sequence of calls; only the
chief prints and persists.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.artifacts import saving
from trainer.artifacts.checkpoint import Checkpointer
from trainer.artifacts.progress import Progress, Startup, Throughput
from trainer.artifacts.report import (
    metrics_record,
    report_epoch,
    report_finished,
    report_running,
    report_training,
    summary_writers,
)
from trainer.artifacts.status import StatusReporter
from trainer.config import Config
from trainer.data import datasets, pipeline
from trainer.distribution import allreduce
from trainer.distribution.cluster import Cluster
from trainer.distribution.preemption import Preempted, StopSignal
from trainer.distribution.strategy import is_group_failure
from trainer.errors import ModelDirError
from trainer.model import build_model, build_optimizer

log = logging.getLogger(__name__)


def train_and_evaluate(
    config: Config,
    cluster: Cluster,
    strategy: tf.distribute.Strategy,
    startup: Startup,
    status: StatusReporter | None = None,
) -> dict[str, Any]:
    """Trains (resuming from the newest checkpoint) and evaluates; the chief saves the model and
    metrics.json. Raises Preempted after a SIGTERM-triggered checkpoint. Returns the metrics."""
    status = status or StatusReporter(config.model_dir, enabled=False)
    workers = cluster.num_workers
    global_batch_size = config.per_worker_batch_size * workers
    learning_rate = config.learning_rate * (workers if config.scale_learning_rate else 1)
    keras.utils.set_random_seed(config.seed)
    inputs = Inputs(config, cluster, strategy, global_batch_size)  # this worker's shards: nothing read yet

    with strategy.scope():
        model = build_model(config.model, inputs.source.image_shape, inputs.source.num_classes)
        optimizer = allreduce.install(
            build_optimizer(learning_rate), config.gradient_compression, config.gradient_bucket_bytes
        )
        # Create the slot variables now, in scope: created lazily inside tf.function they break mirroring.
        optimizer.build(model.trainable_variables)
        metrics = Metrics()
        checkpointer = Checkpointer(
            config.model_dir, cluster.is_chief, cluster.name, config.keep_checkpoints, model=model, optimizer=optimizer
        )
    checkpointer.check_run_setup({**config.to_dict(), "global_batch_size": global_batch_size})
    start_step = checkpointer.restore_latest()
    inputs.agree(start_step)
    startup.reached("model_restored")

    steps_per_epoch, total_steps = inputs.steps_per_epoch, inputs.steps_per_epoch * config.epochs
    iterator = inputs.train_iterator(min(start_step, total_steps))
    train_steps, evaluate = step_functions(strategy, model, optimizer, metrics, global_batch_size, inputs.test())
    progress = Progress(total_steps, steps_per_epoch, config.epochs, enabled=cluster.is_chief or config.verbose_workers)
    progress.line(
        _run_summary(config, inputs.sizes["train_examples"], workers, steps_per_epoch, learning_rate, start_step)
    )
    if start_step >= total_steps:
        progress.line(f"training already reached step {start_step} of {total_steps}; evaluating and saving")
    train_log, test_log = summary_writers(config.model_dir, cluster.is_chief)
    stop = StopSignal()
    report_running(status, progress, workers, start_step)
    startup.reached("input_ready")

    step = last_checkpoint = start_step
    throughput = Throughput(global_batch_size, startup)
    test_metrics: dict[str, float] = {}
    epoch_train_metrics: dict[str, float] = {}
    try:
        while step < total_steps:
            epoch_end, next_checkpoint, steps = _next_call(config, step, steps_per_epoch, throughput.ran_a_step)
            stopping = int(train_steps(iterator, tf.constant(steps), tf.constant(int(stop.requested)))) > 0
            step += steps
            throughput.ran(steps)
            if stopping:
                checkpointer.save(step)
                status.update(state="preempted", global_step=step)
                raise Preempted(f"stopped at step {step} of {total_steps} after a checkpoint")
            if step % config.effective_log_every == 0 or step == epoch_end:
                # Reading a metric all-reduces it across workers: every worker reads at the same steps.
                report_training(progress, status, train_log, throughput, optimizer, step, metrics.train)
            if step == epoch_end:
                epoch_train_metrics = metrics.train()
                metrics.reset()
                # --no-eval-in-loop (an evaluator task follows the checkpoints): only the last epoch is evaluated here.
                evaluated = config.eval_in_loop or step == total_steps
                if evaluated:
                    with throughput.paused():
                        test_metrics = evaluate()
                report_epoch(progress, status, test_log, step, epoch_train_metrics, test_metrics if evaluated else {})
            if step == epoch_end or step == next_checkpoint:
                checkpointer.save(step)
                last_checkpoint = step
    except tf.errors.OpError as error:
        if is_group_failure(error):
            log.warning(
                "%s lost the group after step %d (last checkpoint at step %d)", cluster.name, step, last_checkpoint
            )
        raise

    if not test_metrics:  # resumed after the last step: evaluate the restored model
        test_metrics = evaluate()
    saving.save_model(model, config.model_dir, cluster.is_chief)
    checkpointer.close()
    shape = {"workers": workers, "global_batch_size": global_batch_size, "learning_rate": learning_rate}
    progress_made = {"steps": step, "resumed_from_step": start_step, "restarts": status.restarts}
    results = {**epoch_train_metrics, **test_metrics}
    data: dict[str, int | str] = {**inputs.sizes, "steps_per_epoch": steps_per_epoch, "cache": inputs.cache}
    record = metrics_record(config, model, throughput, results, **shape, **progress_made, **data)
    report_finished(config.model_dir, cluster.name, cluster.is_chief, status, step, test_metrics, record)
    return record


def _next_call(config: Config, step: int, steps_per_epoch: int, warmed_up: bool) -> tuple[int, int, int]:
    """(the step that ends this epoch, the next periodic checkpoint's step, how many steps the next call runs):
    a call stops at an epoch end, a log point or a checkpoint, whichever comes first."""
    epoch_end = (step // steps_per_epoch + 1) * steps_per_epoch
    next_log = (step // config.effective_log_every + 1) * config.effective_log_every
    every = config.checkpoint_every
    next_checkpoint = (step // every + 1) * every if every else epoch_end
    # The first call runs one step, so the time to the first finished step is measured exactly.
    steps = min(config.steps_per_loop, epoch_end - step, next_log - step, next_checkpoint - step) if warmed_up else 1
    return epoch_end, next_checkpoint, steps


class Inputs:
    """This worker's shards of both splits, the steps per epoch the group agreed on, and their pipelines."""

    def __init__(
        self, config: Config, cluster: Cluster, strategy: tf.distribute.Strategy, global_batch_size: int
    ) -> None:
        self.config, self.cluster, self.strategy, self.global_batch_size = config, cluster, strategy, global_batch_size
        workers = cluster.num_workers
        # Each worker opens only its own shard; the group then agrees on the steps per epoch.
        self.source = datasets.load(config)
        self.train_shard = self.source.train.shard(cluster.rank, workers)
        self.test_shard = self.source.test.shard(cluster.rank, workers)
        self.test_size = _limited(self.test_shard.size, config.test_examples, cluster.rank, workers)
        self.train_size = _limited(self.train_shard.size, config.train_examples, cluster.rank, workers)
        reads = self.train_shard.reads
        (log.warning if self.train_shard.every_worker_reads_all else log.info)("%s reads %s", cluster.name, reads)
        self.cache = pipeline.cache_kind(config.cache, self.train_shard, self.source.image_shape)

    def agree(self, start_step: int) -> None:
        """One collective: every worker's shard sizes (the smallest train shard sets the steps per epoch) and the
        step it restored, which must be the same everywhere (else the workers would silently diverge)."""
        rank, workers = self.cluster.rank, self.cluster.num_workers
        rows = _gather_over_workers(self.strategy, rank, workers, [self.train_size, self.test_size, start_step])
        if any(row[2] != start_step for row in rows):
            raise ModelDirError(
                f"the workers restored different checkpoints (steps by rank: {[row[2] for row in rows]}). Every "
                f"worker must see the chief's --model-dir: mount the same shared volume on all of them"
            )
        self.sizes = {"train_examples": sum(row[0] for row in rows), "test_examples": sum(row[1] for row in rows)}
        self.steps_per_epoch = pipeline.steps_per_epoch([row[0] for row in rows], self.config.per_worker_batch_size)

    def train_batches(self, start_step: int) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
        """The dataset function of this worker's batches for every step from start_step on."""
        config, rank = self.config, self.cluster.rank

        def batches(context: tf.distribute.InputContext) -> tf.data.Dataset:
            return pipeline.train_batches(
                self.train_shard,
                rank,
                context.get_per_replica_batch_size(self.global_batch_size),
                self.steps_per_epoch * config.per_worker_batch_size,
                config.seed,
                config.epochs,
                start_step,
                self.steps_per_epoch,
                config.shuffle_buffer,
                self.cache,
            )

        return batches

    def train_iterator(self, start_step: int) -> Any:
        """Batches for every step from start_step on. With one replica per worker (CPU workers, one GPU each) a
        plain tf.data iterator: strategy.run takes the local tensors, and a distributed iterator would add a
        cross-worker check per step that the steps agreed by construction make needless (docs/bench.md)."""
        batches, rank, workers = self.train_batches(start_step), self.cluster.rank, self.cluster.num_workers
        if self.strategy.num_replicas_in_sync == workers:
            return iter(batches(tf.distribute.InputContext(workers, rank, workers)))
        return iter(self.strategy.distribute_datasets_from_function(batches))

    def test(self) -> Any:
        """The test split's batches; distributed, since workers' shards differ by up to one partial batch."""
        cache = pipeline.cache_kind(self.config.cache, self.test_shard, self.source.image_shape)
        return self.strategy.distribute_datasets_from_function(
            lambda context: pipeline.test_batches(
                self.test_shard, context.get_per_replica_batch_size(self.global_batch_size), self.test_size, cache
            )
        )


class Metrics:
    """Keras metrics with per-replica state; reading one all-reduces it, so every worker reads at the same steps."""

    def __init__(self) -> None:
        self.train_loss, self.train_accuracy = keras.metrics.Mean(), keras.metrics.SparseCategoricalAccuracy()
        self.test_loss, self.test_accuracy = keras.metrics.Mean(), keras.metrics.SparseCategoricalAccuracy()

    def train(self) -> dict[str, float]:
        return {"train_loss": float(self.train_loss.result()), "train_accuracy": float(self.train_accuracy.result())}

    def test(self) -> dict[str, float]:
        # Each worker evaluates its own shard, the last batch partial: the summed count shows each example once.
        return {
            "test_loss": float(self.test_loss.result()),
            "test_accuracy": float(self.test_accuracy.result()),
            "test_examples_evaluated": int(tf.convert_to_tensor(self.test_accuracy.count.value)),
        }

    def reset(self) -> None:
        for metric in (self.train_loss, self.train_accuracy, self.test_loss, self.test_accuracy):
            metric.reset_state()


def step_functions(
    strategy: tf.distribute.Strategy,
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    metrics: Metrics,
    global_batch_size: int,
    test_batches: Any,
) -> tuple[Callable[..., tf.Tensor], Callable[[], dict[str, float]]]:
    """What the loop calls: `train_steps(iterator, steps, stop_requested)` runs `steps` training steps on every
    replica and returns how many workers asked to stop; `evaluate()` runs the test split and returns its metrics."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def train_step(images: tf.Tensor, labels: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_example_loss = loss_fn(labels, logits)
            # Divide by the global batch, not the local one: the all-reduce sums the workers' gradients.
            loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        metrics.train_loss.update_state(per_example_loss)
        metrics.train_accuracy.update_state(labels, logits)

    # A plain while_loop, not autograph's conversion of a Python loop: the same graph, traced 0.3 s sooner.
    @functools.partial(tf.function, autograph=False)
    def train_steps(iterator: Any, steps: tf.Tensor, stop_requested: tf.Tensor) -> tf.Tensor:
        def one_step(step: tf.Tensor) -> tuple[tf.Tensor]:
            strategy.run(train_step, args=next(iterator))
            return (step + 1,)

        tf.while_loop(lambda step: step < steps, one_step, (tf.constant(0),))
        # One small all-reduce per call: if any worker got SIGTERM, every worker stops at this step.
        return _sum_over_workers(strategy, stop_requested)

    def eval_step(images: tf.Tensor, labels: tf.Tensor) -> None:
        logits = model(images, training=False)
        metrics.test_loss.update_state(loss_fn(labels, logits))
        metrics.test_accuracy.update_state(labels, logits)

    @tf.function
    def run_evaluation() -> None:
        for images, labels in test_batches:
            strategy.run(eval_step, args=(images, labels))

    def evaluate() -> dict[str, float]:
        """Evaluates the test split; reading the metrics all-reduces them across workers."""
        run_evaluation()
        return metrics.test()

    return train_steps, evaluate


def _run_summary(
    config: Config, train_size: int, workers: int, steps_per_epoch: int, learning_rate: float, start_step: int
) -> str:
    """The run's first line: what trains on what, and how the work is split."""
    global_batch_size = workers * config.per_worker_batch_size
    return (
        f"training {config.model} on {config.dataset}: {train_size} examples, "
        f"{workers} worker(s) x {config.per_worker_batch_size} = global batch {global_batch_size}, "
        f"{steps_per_epoch} steps/epoch x {config.epochs} epochs, learning rate {learning_rate:g}"
        + (f", resuming at step {start_step}" if start_step else "")
    )


def _limited(size: int, limit: int, rank: int, workers: int) -> int:
    """A worker's shard size under --train-examples/--test-examples (0 = all): its share of the limit."""
    return min(size, datasets.share(limit, rank, workers)) if limit else size


def _gather_over_workers(
    strategy: tf.distribute.Strategy, rank: int, workers: int, values: list[int]
) -> list[tuple[int, ...]]:
    """Every worker's `values`, by rank: each fills its own row of a zero matrix and the rows are summed."""
    rows = np.zeros((workers, len(values)), np.int64)
    rows[rank] = values
    total = tf.function(lambda local: _sum_over_workers(strategy, local), autograph=False)(tf.constant(rows))
    replicas_per_worker = strategy.num_replicas_in_sync // workers  # each local replica added the same rows
    return [tuple(int(v) // replicas_per_worker for v in row) for row in total.numpy()]


def _sum_over_workers(strategy: tf.distribute.Strategy, value: tf.Tensor) -> tf.Tensor:
    """Every worker's `value` added up: a collective, so all workers must call it at the same point."""
    return strategy.reduce("SUM", strategy.run(tf.identity, args=(value,)), axis=None)
