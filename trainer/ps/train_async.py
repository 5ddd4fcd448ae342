"""The asynchronous loop, run by the chief as coordinator of ParameterServerStrategy.

The variables live on the ps tasks; the chief schedules closures of `steps_per_loop` steps onto whichever
worker is free (ClusterCoordinator), each worker reading the training split in its own order. A step is one
worker's batch applied to the variables, so an epoch is train_size // per_worker_batch_size steps, whatever
the number of workers. At most two closures per worker are in flight; the losses and accuracies come back
with each closure and are summed on the chief. Before a checkpoint, an evaluation or the end, the chief lets
the closures in flight finish, so checkpoint N holds exactly N steps' updates. Only the chief writes: the
checkpoints, TensorBoard, the status, metrics.json and the model (the workers and ps tasks write nothing).

A lost worker costs nothing but its share: the coordinator runs its closures elsewhere and gives it work
again once it is back. A lost ps task (or the chief itself) loses the variables: the chief exits with the
group-failure code, and the run resumes from the last checkpoint once every task is back.
"""

from __future__ import annotations

import collections
import functools
import logging
from typing import Any

import keras
import tensorflow as tf

from trainer.artifacts import report, saving
from trainer.artifacts.checkpoint import Checkpointer
from trainer.artifacts.progress import Progress, Startup, Throughput
from trainer.artifacts.status import StatusReporter
from trainer.config import Config
from trainer.data import datasets, pipeline
from trainer.distribution.cluster import Cluster
from trainer.distribution.preemption import Preempted, StopSignal
from trainer.model import build_model, build_optimizer
from trainer.ps.evaluator import evaluation_function

log = logging.getLogger(__name__)

SUM_KEYS = ("loss_sum", "correct", "examples")  # what each closure returns, summed on the chief
CLOSURES_IN_FLIGHT_PER_WORKER = 2  # one running, one queued: a worker never waits for the chief


def train_async(
    config: Config,
    cluster: Cluster,
    strategy: tf.distribute.Strategy,
    coordinator: Any,
    startup: Startup,
    status: StatusReporter,
) -> dict[str, Any]:
    """Trains asynchronously (resuming from the newest checkpoint), evaluates and saves; returns the metrics."""
    batch_size = config.per_worker_batch_size
    keras.utils.set_random_seed(config.seed)
    source = datasets.load(config)
    # The whole split for every worker: under ParameterServerStrategy the dataset function is traced once for all
    # workers (its InputContext reads 0 of 1 on each), so a worker cannot pick its shard; it gets its own order.
    train_shard, test_shard = source.train.shard(0, 1), source.test.shard(0, 1)
    train_size = min(train_shard.size, config.train_examples or train_shard.size)
    test_size = min(test_shard.size, config.test_examples or test_shard.size)
    steps_per_epoch = pipeline.steps_per_epoch([train_size], batch_size)
    total_steps = steps_per_epoch * config.epochs

    with strategy.scope():
        model = build_model(config.model, source.image_shape, source.num_classes)
        optimizer = build_optimizer(config.learning_rate)
        optimizer.build(model.trainable_variables)
        checkpointer = Checkpointer(
            config.model_dir, True, cluster.name, config.keep_checkpoints, model=model, optimizer=optimizer
        )
    log.info("variables on the ps tasks: %s", _placement(model.weights + optimizer.variables))
    checkpointer.check_run_setup({**config.to_dict(), "global_batch_size": batch_size})
    start_step = checkpointer.restore_latest()

    cache = pipeline.cache_kind(config.cache, train_shard, source.image_shape)
    worker_batches = iter(
        coordinator.create_per_worker_dataset(
            lambda: strategy.distribute_datasets_from_function(
                lambda context: _worker_batches(config, train_shard, train_size, steps_per_epoch, cache)
            )
        )
    )
    train_steps = _train_steps_function(strategy, model, optimizer)
    evaluate = evaluation_function(model, pipeline.test_batches(test_shard, batch_size, test_size))

    progress = Progress(total_steps, steps_per_epoch, config.epochs)
    progress.line(
        f"training {config.model} on {config.dataset} asynchronously: {train_size} examples, "
        f"{cluster.num_workers} worker(s) x batch {batch_size}, {cluster.num_ps} ps task(s), "
        f"{steps_per_epoch} steps/epoch x {config.epochs} epochs, learning rate {config.learning_rate:g}"
        + (f", resuming at step {start_step}" if start_step else "")
    )
    train_log, test_log = report.summary_writers(config.model_dir, True)
    stop = StopSignal()
    report.report_running(status, progress, cluster.num_workers, start_step)

    step = scheduled = start_step
    throughput = Throughput(batch_size, startup)
    sums = _zero_sums()  # since the epoch began
    in_flight: collections.deque = collections.deque()
    limit = CLOSURES_IN_FLIGHT_PER_WORKER * cluster.num_workers
    log_every = config.effective_log_every
    test_metrics: dict[str, float] = {}
    train_metrics: dict[str, float] = {}
    while step < total_steps:
        epoch_end = (step // steps_per_epoch + 1) * steps_per_epoch
        next_checkpoint = (
            (step // config.checkpoint_every + 1) * config.checkpoint_every if config.checkpoint_every else epoch_end
        )
        pause_at = min(epoch_end, next_checkpoint)
        while scheduled < pause_at and len(in_flight) < limit and not stop.requested:
            steps = min(config.steps_per_loop, pause_at - scheduled)
            in_flight.append((steps, coordinator.schedule(train_steps, args=(worker_batches, tf.constant(steps)))))
            scheduled += steps
        if in_flight:
            steps, result = in_flight.popleft()
            for key, value in zip(SUM_KEYS, result.fetch(), strict=True):
                sums[key] += float(value)
            previous, step = step, step + steps
            throughput.ran(steps)
            if step // log_every > previous // log_every or step == epoch_end:
                report.report_training(
                    progress, status, train_log, throughput, optimizer, step, functools.partial(_epoch_metrics, sums)
                )
            if step < pause_at and not stop.requested:
                continue
        if stop.requested:
            coordinator.join()
            step = scheduled  # every closure scheduled has finished
            checkpointer.save(step)
            status.update(state="preempted", global_step=step)
            raise Preempted(f"stopped at step {step} of {total_steps} after a checkpoint")
        if step == epoch_end:
            train_metrics, sums = _epoch_metrics(sums), _zero_sums()
            # --no-eval-in-loop (an evaluator task follows the checkpoints): only the last epoch is evaluated here.
            evaluated = config.eval_in_loop or step == total_steps
            if evaluated:
                with throughput.paused():
                    test_metrics = evaluate()
            report.report_epoch(progress, status, test_log, step, train_metrics, test_metrics if evaluated else {})
        checkpointer.save(step)

    if not test_metrics:  # resumed after the last step: evaluate the restored model
        test_metrics = evaluate()
    saving.save_model(model, config.model_dir, is_chief=True)
    record = report.metrics_record(
        config,
        model,
        throughput,
        {**train_metrics, **test_metrics},
        strategy="async",
        workers=cluster.num_workers,
        ps_tasks=cluster.num_ps,
        global_batch_size=batch_size,
        learning_rate=config.learning_rate,
        steps=step,
        resumed_from_step=start_step,
        restarts=status.restarts,
        steps_per_epoch=steps_per_epoch,
        train_examples=train_size,
        test_examples=test_size,
        cache=cache,
    )
    report.report_finished(config.model_dir, cluster.name, True, status, step, test_metrics, record)
    return record


def _worker_batches(
    config: Config, shard: datasets.Shard, train_size: int, steps_per_epoch: int, cache: str
) -> tf.data.Dataset:
    """One worker's batches, repeated without end (it may run more than its share while another is down), in an
    order seeded by --seed and by this worker's clock when the coordinator builds it, so workers differ."""
    clock = tf.cast(tf.timestamp() * 1e6, tf.int64)
    seed = tf.constant(config.seed, tf.int64) * 1_000_003 + clock
    # Printed on the worker each time the coordinator (re)builds its input, e.g. after the worker restarted.
    tf.print("input pipeline built on this worker; it receives work from the coordinator")
    batches = pipeline.train_batches(
        shard,
        0,
        config.per_worker_batch_size,
        train_size,
        seed,
        config.epochs,
        0,
        steps_per_epoch,
        config.shuffle_buffer,
        cache,
    )
    return batches.repeat()


def _train_steps_function(
    strategy: tf.distribute.Strategy, model: keras.Model, optimizer: keras.optimizers.Optimizer
) -> Any:
    """`train_steps(iterator, steps)`, run on a worker: `steps` updates, returning (loss sum, correct, examples)."""
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    def train_step(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_example_loss = loss_fn(labels, logits)
            # One worker's batch is the whole update: the mean over it, as in one process.
            loss = tf.reduce_mean(per_example_loss)
            if model.losses:
                loss += tf.add_n(model.losses)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables, strict=True))
        correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, -1), tf.cast(labels, tf.int64)), tf.float32))
        return tf.stack([tf.reduce_sum(per_example_loss), correct, tf.cast(tf.size(labels), tf.float32)])

    @tf.function
    def train_steps(iterator: Any, steps: tf.Tensor) -> tf.Tensor:
        totals = tf.zeros(3)
        for _ in tf.range(steps):
            totals += strategy.run(train_step, args=next(iterator))
        return totals

    return train_steps


def _placement(variables: list[Any]) -> str:
    """Bytes of variables per ps task, e.g. 'ps-0 402,240 bytes, ps-1 401,984 bytes'."""
    held: collections.Counter = collections.Counter()
    for variable in variables:
        device = tf.DeviceSpec.from_string(variable.value.device)
        held[f"{device.job}-{device.task}"] += variable.value.shape.num_elements() * variable.value.dtype.size
    return ", ".join(f"{task} {size:,} bytes" for task, size in sorted(held.items()))


def _zero_sums() -> dict[str, float]:
    return dict.fromkeys(SUM_KEYS, 0.0)


def _epoch_metrics(sums: dict[str, float]) -> dict[str, float]:
    examples = sums["examples"] or 1.0
    return {"train_loss": sums["loss_sum"] / examples, "train_accuracy": sums["correct"] / examples}
