"""The training loop, written once: epochs, calls of --steps-per-loop steps, checkpoints, evaluation, SIGTERM and
reporting, readable top to bottom.

Keras 3 `model.fit` fails under MultiWorkerMirroredStrategy, so this is a custom loop. How one call of steps
runs is the only thing that differs between the modes, and it is a `Calls`: all-reduce workers
(trainer/distribution/sync_calls.py, the default) or a chief scheduling calls onto parameter-server workers
(trainer/ps/async_calls.py). The task (trainer/task.py) says what a step computes: the model, the loss and the
metrics; this module and the Calls only run it.
"""

from __future__ import annotations

import abc
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from trainer.artifacts import export_check, saving
from trainer.artifacts.checkpoint import Checkpointer, recorded_run_setup, resume_note, resumed_per_worker_batch
from trainer.artifacts.progress import Progress, Startup, Throughput
from trainer.artifacts.report import Report, metrics_record
from trainer.artifacts.status import StatusReporter
from trainer.config import Config
from trainer.data import corrupt_records, datasets
from trainer.data.datasets import Shard, Source
from trainer.distribution import allreduce
from trainer.distribution.cluster import Cluster
from trainer.distribution.preemption import Preempted, StopSignal
from trainer.distribution.strategy import is_group_failure
from trainer.task import Task, task_of

log = logging.getLogger(__name__)


class Calls(abc.ABC):
    """How one call of training steps runs. Built before the model (it opens this process's data), started once
    the model is restored; every method is called at the same steps on every worker."""

    source: Source  # the dataset this process reads: the task builds its model for it
    global_batch_size: int  # examples per step
    writes_checkpoints: bool  # whether this process's checkpoints are the ones kept
    steps_per_epoch: int  # set by start()
    sizes: dict[str, Any]  # train_examples, test_examples, cache: set by start(), recorded in metrics.json
    shards: tuple[Shard, ...] = ()  # this process's shards of both splits: where a corrupt record is looked for

    def build(self, model: keras.Model, optimizer: keras.optimizers.Optimizer) -> None:  # noqa: B027 (optional)
        """Creates what the calls keep beside the model (metrics), inside strategy.scope()."""

    @abc.abstractmethod
    def start(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, start_step: int) -> None:
        """Sets steps_per_epoch and sizes, and prepares the calls to run from start_step on."""

    @abc.abstractmethod
    def run(self, steps: int, stop_requested: bool) -> tuple[int, bool]:
        """Starts a call of `steps` steps; returns (steps finished meanwhile, whether the group stops here)."""

    def settle(self) -> int:
        """Waits until every step started has finished; returns how many finished meanwhile."""
        return 0

    @abc.abstractmethod
    def train_metrics(self) -> dict[str, float]:
        """train_<name> of every metric since the epoch began."""

    @abc.abstractmethod
    def reset_train_metrics(self) -> None: ...

    @abc.abstractmethod
    def evaluate(self) -> dict[str, float]:
        """test_<name> of every metric over the test split, and test_examples_evaluated."""

    @abc.abstractmethod
    def describe(self, config: Config, workers: int) -> str:
        """How the work is split, for the run's first line."""

    def shape(self) -> dict[str, Any]:
        """The run's shape for metrics.json beyond the workers and the batch (the async mode adds its own)."""
        return {}

    def corrupt_records_skipped(self) -> dict[str, int]:
        """{"corrupt_records_skipped": n} over the group when --on-corrupt-record skip is on, else {}; every worker
        calls it at the same point (it may be a collective)."""
        return {}


CallsFactory = Callable[[Config, Cluster, tf.distribute.Strategy, Task], Calls]


def train_and_evaluate(
    config: Config,
    cluster: Cluster,
    strategy: tf.distribute.Strategy,
    startup: Startup,
    status: StatusReporter | None = None,
    calls_factory: CallsFactory | None = None,
) -> dict[str, Any]:
    """Trains (resuming from the newest checkpoint) and evaluates; the chief saves the model and metrics.json.
    Raises Preempted after a SIGTERM-triggered checkpoint. Returns the metrics."""
    status = status or StatusReporter(config.model_dir, enabled=False)
    task = task_of(config)
    if calls_factory is None:
        from trainer.distribution import sync_calls

        calls_factory = sync_calls.SyncCalls
    workers = cluster.num_workers
    requested, recorded = config, recorded_run_setup(config.model_dir)
    if not cluster.is_async:  # sync checkpoints of another worker count: keep their global batch
        per_worker = resumed_per_worker_batch(recorded, config.per_worker_batch_size, workers)
        config = dataclasses.replace(config, per_worker_batch_size=per_worker)
    # Linear scaling follows the global batch: after a resize, the workers of the run that set it.
    scale = workers * config.per_worker_batch_size // requested.per_worker_batch_size
    learning_rate = config.learning_rate * (scale if config.scale_learning_rate else 1)
    keras.mixed_precision.set_global_policy(config.precision)  # before the model: its layers take the policy
    keras.utils.set_random_seed(config.seed)
    calls = calls_factory(config, cluster, strategy, task)  # this process's data: nothing read yet

    with strategy.scope():
        model = task.build_model(calls.source)
        optimizer = build_optimizer(
            learning_rate, config.precision, config.gradient_compression, config.gradient_bucket_bytes
        )
        # Create the slot variables now, in scope: created lazily inside tf.function they break mirroring.
        optimizer.build(model.trainable_variables)
        calls.build(model, optimizer)
        checkpointer = Checkpointer(
            config.model_dir,
            calls.writes_checkpoints,
            cluster.name,
            config.keep_checkpoints,
            model=model,
            optimizer=optimizer,
        )
    # What a step means; "model" names the task's model where its options have no field of that name.
    setup = {
        "model": task.describe(),
        **requested.to_dict(),  # the flags as given: a resize keeps --per-worker-batch-size as the user set it
        "global_batch_size": calls.global_batch_size,
        "train_data": datasets.fingerprint(calls.source.train),
        "workers": workers,
    }
    recorded = checkpointer.check_run_setup(setup)
    start_step = checkpointer.restore_latest()
    calls.start(model, optimizer, start_step)
    startup.reached("model_restored")
    setup.update(steps_per_epoch=calls.steps_per_epoch, cache=calls.sizes.get("cache", config.cache))
    checkpointer.record_run_setup(setup)
    note = None if cluster.is_async else resume_note(recorded, setup, start_step)  # async is never exact anyway
    if note and cluster.is_chief:
        log.warning("%s", note)

    steps_per_epoch, total_steps = calls.steps_per_epoch, calls.steps_per_epoch * config.epochs
    progress = Progress(total_steps, steps_per_epoch, config.epochs, enabled=cluster.is_chief or config.verbose_workers)
    progress.line(
        f"training {task.describe()} on {config.dataset}: "
        f"{calls.sizes['train_examples']} examples, {calls.describe(config, workers)}, "
        f"{steps_per_epoch} steps/epoch x {config.epochs} epochs, learning rate {learning_rate:g}"
        + (f", {config.precision}" if config.precision != "float32" else "")
        + (f", resuming at step {start_step}" if start_step else "")
    )
    if start_step >= total_steps:
        progress.line(f"training already reached step {start_step} of {total_steps}; evaluating and saving")
    throughput = Throughput(calls.global_batch_size, startup)
    report = Report(config.model_dir, cluster.is_chief, status, progress, throughput, ("loss", *task.metric_names))
    stop = StopSignal()
    report.running(workers, start_step)
    startup.reached("input_ready")

    step = last_checkpoint = start_step
    test_metrics: dict[str, float] = {}
    epoch_train_metrics: dict[str, float] = {}
    try:
        while step < total_steps:
            epoch_end, next_checkpoint, steps = _next_call(config, step, steps_per_epoch, throughput.ran_a_step)
            finished, stopping = calls.run(steps, stop.requested)
            step += steps
            throughput.ran(finished)
            boundary = step in (epoch_end, next_checkpoint)
            if boundary or stopping:
                throughput.ran(calls.settle())  # a checkpoint holds exactly the steps before it
            if stopping:
                checkpointer.save(step)
                status.update(state="preempted", global_step=step)
                raise Preempted(f"stopped at step {step} of {total_steps} after a checkpoint")
            if step % config.effective_log_every == 0 or step == epoch_end:
                # Reading a metric all-reduces it across workers: every worker reads at the same steps.
                report.training(optimizer, step, calls.train_metrics)
            if step == epoch_end:
                epoch_train_metrics = calls.train_metrics()
                calls.reset_train_metrics()
                # --no-eval-in-loop (an evaluator task follows the checkpoints): only the last epoch is evaluated here.
                evaluated = config.eval_in_loop or step == total_steps
                if evaluated:
                    with throughput.paused():
                        test_metrics = calls.evaluate()
                report.epoch(step, epoch_train_metrics, test_metrics if evaluated else {})
            if boundary:
                checkpointer.save(step)
                last_checkpoint = step
    except tf.errors.OpError as error:
        if is_group_failure(error):
            log.warning(
                "%s lost the group after step %d (last checkpoint at step %d)", cluster.name, step, last_checkpoint
            )
        else:
            where = f"{cluster.name}: reading the input failed in the steps after step {step}"
            corrupt = corrupt_records.named(error, calls.shards, where)
            if corrupt is not None:
                raise corrupt from None
        raise

    if not test_metrics:  # resumed after the last step: evaluate the restored model
        test_metrics = calls.evaluate()
    features = export_check.test_features(task, calls.shards)
    exported = saving.save_model(model, task, config.model_dir, cluster.is_chief, version=step, features=features)
    checkpointer.close()
    record = metrics_record(
        config,
        model,
        throughput,
        {**epoch_train_metrics, **test_metrics},
        workers=workers,
        **calls.shape(),
        global_batch_size=calls.global_batch_size,
        learning_rate=learning_rate,
        steps=step,
        resumed_from_step=start_step,
        restarts=status.restarts,
        steps_per_epoch=steps_per_epoch,
        **calls.sizes,
        **calls.corrupt_records_skipped(),
    )
    if exported is not None:
        record["export_check"] = exported
    report.finished(cluster.name, step, test_metrics, record)
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


def build_optimizer(
    learning_rate: float, precision: str, gradient_compression: str = "none", gradient_bucket_bytes: int = 0
) -> keras.optimizers.Optimizer:
    """Adam; under mixed_float16 wrapped in dynamic loss scaling (the step scales the loss with
    optimizer.scale_loss, and apply_gradients unscales the gradients and skips a step that overflowed). With
    compression or buckets, Adam all-reduces its gradients through trainer/distribution/allreduce.py."""
    optimizer = keras.optimizers.Adam(learning_rate=learning_rate)
    if gradient_compression != "none" or gradient_bucket_bytes:
        # On Adam itself: the loss-scale wrapper hands it the unscaled gradients, and Adam reduces them.
        allreduce.install(optimizer, gradient_compression, gradient_bucket_bytes)
    return keras.optimizers.LossScaleOptimizer(optimizer) if precision == "mixed_float16" else optimizer


def train_step_values(
    task: Task, model: keras.Model, optimizer: keras.optimizers.Optimizer, batch: Any, global_batch_size: int
) -> dict[str, tf.Tensor]:
    """One replica's training step on its batch: the update applied, then the values of every metric ("loss"
    first), float32, for the calls to accumulate."""
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
    return _metric_values(task, targets, outputs, per_example_loss)


def test_step_values(task: Task, model: keras.Model, batch: Any) -> dict[str, tf.Tensor]:
    """The values of every metric ("loss" first) on one test batch."""
    features, targets = task.features_and_targets(batch)
    outputs = model(features, training=False)
    return _metric_values(task, targets, outputs, tf.cast(task.loss(targets, outputs), tf.float32))


def _metric_values(task: Task, targets: Any, outputs: Any, per_example_loss: tf.Tensor) -> dict[str, tf.Tensor]:
    values = task.metrics(targets, outputs)
    missing = set(task.metric_names) - set(values)
    if missing:
        raise ValueError(f"{type(task).__name__}.metrics() returned no value for {sorted(missing)}")
    return {"loss": per_example_loss, **{name: tf.cast(values[name], tf.float32) for name in task.metric_names}}


def sums_and_counts(values: dict[str, tf.Tensor]) -> tf.Tensor:
    """[sum, count] of each metric's values, flattened in the metrics' order: what a call adds up."""
    return tf.stack(
        [part for value in values.values() for part in (tf.reduce_sum(value), tf.cast(tf.size(value), tf.float32))]
    )


def means(names: tuple[str, ...], totals: Any, prefix: str) -> dict[str, float]:
    """{prefix + name: sum / count} from sums_and_counts() totals (added up over calls)."""
    return {
        f"{prefix}{name}": float(totals[2 * i]) / max(float(totals[2 * i + 1]), 1.0) for i, name in enumerate(names)
    }


def example_count(totals: Any) -> int:
    """How many examples the totals cover: the loss has one value per example."""
    return int(totals[1])
