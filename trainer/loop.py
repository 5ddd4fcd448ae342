"""The training loop, written once: epochs, calls of --steps-per-loop steps, checkpoints, evaluation, SIGTERM and
reporting, readable top to bottom.

Keras 3 `model.fit` fails under MultiWorkerMirroredStrategy, so this is a custom loop. What a step computes is
trainer/step.py (the task's model, loss and metrics); how a call of steps runs is the one thing that differs
between the modes, a StepRunner the entry point picks: all-reduce workers (trainer/distribution/sync_runner.py) or
a chief scheduling calls onto parameter-server workers (trainer/ps/async_runner.py).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from trainer.artifacts import export_check, saving
from trainer.artifacts.checkpoint import Checkpointer, recorded_run_setup, resume_note, resumed_per_worker_batch
from trainer.artifacts.layout import ModelDir
from trainer.context import RunContext
from trainer.data import corrupt_records, datasets
from trainer.data.inputs import Inputs
from trainer.distribution.cluster import Cluster
from trainer.distribution.preemption import Preempted, StopSignal
from trainer.distribution.strategy import is_group_failure
from trainer.optimizer import build_optimizer, learning_rate_words
from trainer.reporting.progress import Startup, Throughput
from trainer.reporting.report import Reporter
from trainer.settings.config import Config
from trainer.step import StepRunner, Totals, check_finite, metric_names
from trainer.task import Task

log = logging.getLogger(__name__)

RunnerFactory = Callable[[Config, Cluster, tf.distribute.Strategy, Task, Inputs], StepRunner]


def train_and_evaluate(
    context: RunContext,
    strategy: tf.distribute.Strategy,
    inputs: Inputs,
    runner_factory: RunnerFactory,
    startup: Startup,
    reporter: Reporter,
) -> dict[str, Any]:
    """Trains (resuming from the newest checkpoint) and evaluates on this process's inputs, telling the reporter what
    happens; the chief saves the model and metrics.json. Raises Preempted after a SIGTERM-triggered checkpoint.
    Returns the metrics."""
    training = set_up(context, strategy, inputs, runner_factory)
    task, cluster = context.task, context.cluster
    startup.reached("model_restored")
    throughput = Throughput(training.runner.global_batch_size, startup)
    reporter.started(
        first_line(task, training, training.learning_rate, training.start_step),
        training.start_step,
        training.total_steps,
        training.steps_per_epoch,
        training.config.epochs,
        cluster.num_workers,
        metric_names(task),
        throughput,
    )
    startup.reached("input_ready")
    trained = train(training, throughput, reporter)
    return finish(training, trained, reporter)


@dataclasses.dataclass(frozen=True)
class Training:
    """What set_up() builds and the loop and finish() share."""

    config: Config  # as resumed: the per-worker batch a resume keeps
    task: Task
    cluster: Cluster
    model_dir: ModelDir
    inputs: Inputs
    steps_per_epoch: int
    runner: StepRunner
    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    checkpointer: Checkpointer
    learning_rate: float
    start_step: int

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.config.epochs


@dataclasses.dataclass(frozen=True)
class Trained:
    """Where the loop ended: its last step, the last epoch's train totals, the last test pass, the steps skipped."""

    step: int
    epoch_train: Totals
    test: Totals
    skipped_steps: int


def set_up(
    context: RunContext, strategy: tf.distribute.Strategy, inputs: Inputs, runner_factory: RunnerFactory
) -> Training:
    """The model (built for this worker's data) and optimizer in the strategy's scope, restored from the newest
    checkpoint of the same run setup, and the runner of its steps."""
    requested, task, cluster, model_dir = context.config, context.task, context.cluster, context.model_dir
    config, learning_rate = resumed_batch_and_rate(requested, cluster, model_dir)
    steps_per_epoch = inputs.steps_per_epoch(config.per_worker_batch_size)
    runner = runner_factory(config, cluster, strategy, task, inputs)
    with strategy.scope():
        model = task.build_model(inputs.source)
        optimizer = build_optimizer(task, config, learning_rate, steps_per_epoch * config.epochs)
        # Create the slot variables now, in scope: created lazily inside tf.function they break mirroring.
        optimizer.build(model.trainable_variables)
        checkpointer = Checkpointer(
            model_dir, cluster.is_chief, cluster.name, config.keep_checkpoints, model=model, optimizer=optimizer
        )
    # What a step means; "model" names the task's model where its options have no field of that name.
    setup = {
        "model": task.describe(),
        **requested.to_dict(),  # the flags as given: a resize keeps --per-worker-batch-size as the user set it
        "global_batch_size": runner.global_batch_size,
        "train_data": datasets.fingerprint(inputs.source.train),
        "workers": cluster.num_workers,
        "steps_per_epoch": steps_per_epoch,
        "cache": inputs.cache,
    }
    recorded = checkpointer.check_run_setup(setup)
    start_step = checkpointer.restore_latest()
    runner.start(model, optimizer, start_step, steps_per_epoch)
    checkpointer.record_run_setup(setup)
    note = None if cluster.is_async else resume_note(recorded, setup, start_step)  # async is never exact anyway
    if note and cluster.is_chief:
        log.warning("%s", note)
    return Training(
        config,
        task,
        cluster,
        model_dir,
        inputs,
        steps_per_epoch,
        runner,
        model,
        optimizer,
        checkpointer,
        learning_rate,
        start_step,
    )


def train(training: Training, throughput: Throughput, reporter: Reporter) -> Trained:
    """The loop: calls of steps up to the last step, each epoch evaluated, checkpoints at their steps; a SIGTERM on
    any worker checkpoints every worker at the same step and raises Preempted."""
    config, runner, checkpointer = training.config, training.runner, training.checkpointer
    steps_per_epoch, total_steps = training.steps_per_epoch, training.total_steps
    stop = StopSignal()
    step = last_checkpoint = training.start_step
    names = metric_names(training.task)
    train, test, epoch_train = Totals(names), Totals(names), Totals(names)
    skipped_steps = 0
    try:
        while step < total_steps:
            epoch_end, next_checkpoint, steps = next_call(config, step, steps_per_epoch, throughput.ran_a_step)
            step += steps
            # A checkpoint, an evaluation and a stop hold exactly the steps before them; the first call is timed.
            boundary = step in (epoch_end, next_checkpoint)
            settle = boundary or stop.requested or not throughput.ran_a_step
            call = runner.run(steps, stop.requested, settle)
            finished = Totals(names, call.sums)
            # Before anything is saved: non-finite weights never reach a checkpoint or an export.
            check_finite(finished.health, call.skipped_in_a_row, config, (step - steps + 1, step), steps_per_epoch)
            train.add(finished)
            skipped_steps += int(finished.health["skipped"])
            throughput.ran(finished.examples // runner.global_batch_size)
            if call.stopping:
                checkpointer.save(step)
                reporter.preempted(step)
                raise Preempted(f"stopped at step {step} of {total_steps} after a checkpoint")
            if step % config.effective_log_every == 0 or step == epoch_end:
                reporter.trained(step, train.means(), skipped_steps, training.optimizer)
            if step == epoch_end:
                epoch_train, train = train, Totals(names)
                # --no-eval-in-loop (an evaluator task follows the checkpoints): only the last epoch is evaluated here.
                evaluated = config.eval_in_loop or step == total_steps
                if evaluated:
                    with throughput.paused():
                        test = Totals(names, runner.evaluate())
                reporter.evaluated(step, test if evaluated else None, epoch_train.means())
            if boundary:
                checkpointer.save(step)
                reporter.checkpointed(step)
                last_checkpoint = step
    except tf.errors.OpError as error:
        raise explained(error, training.cluster, training.inputs, step, last_checkpoint) from None
    return Trained(step, epoch_train, test, skipped_steps)


def finish(training: Training, trained: Trained, reporter: Reporter) -> dict[str, Any]:
    """The model exported (checked, chief-only) and the run's record: metrics.json, through the reporter."""
    config, cluster, runner, step = training.config, training.cluster, training.runner, trained.step
    test = trained.test
    if not test.examples:  # resumed after the last step: evaluate the restored model
        test = Totals(test.names, runner.evaluate())
    features = export_check.test_features(training.task, training.inputs.shards)
    exported = saving.save_model(
        training.model, training.task, training.model_dir, cluster.is_chief, version=step, features=features
    )
    training.checkpointer.close()
    shape = {"strategy": "async", "ps_tasks": cluster.num_ps} if cluster.is_async else {}
    run = {"workers": cluster.num_workers, **shape, "global_batch_size": runner.global_batch_size}
    run.update(learning_rate=training.learning_rate, steps=step, resumed_from_step=training.start_step)
    run.update(steps_per_epoch=training.steps_per_epoch, skipped_steps=trained.skipped_steps)
    run.update(**runner.corrupt_records_skipped())
    run.update({"export_check": exported} if exported is not None else {})
    source = training.inputs.source
    run.update({"class_names": list(source.names_of_classes)} if source.num_classes else {})
    return reporter.finished(config, training.model, step, trained.epoch_train, test, {**run, **training.inputs.sizes})


def explained(
    error: tf.errors.OpError, cluster: Cluster, inputs: Inputs, step: int, last_checkpoint: int
) -> BaseException:
    """What a failed call raises: a lost group as it was (said in one line), a corrupt record named with its file
    (trainer/data/corrupt_records.py), anything else as it was."""
    if is_group_failure(error):
        log.warning("%s lost the group after step %d (last checkpoint at step %d)", cluster.name, step, last_checkpoint)
        return error
    return (
        corrupt_records.named(
            error, inputs.shards, f"{cluster.name}: reading the input failed in the steps after step {step}"
        )
        or error
    )


def first_line(task: Task, training: Training, learning_rate: float, start_step: int) -> str:
    """The run's first line: what trains on what, how the work is split, the epochs and the learning rate."""
    config = training.config
    return (
        f"training {task.describe()} on {config.dataset}: {training.inputs.sizes['train_examples']} examples, "
        f"{training.runner.describe()}, {training.steps_per_epoch} steps/epoch x {config.epochs} epochs, "
        f"{learning_rate_words(config, learning_rate)}"
        + (f", {config.precision}" if config.precision != "float32" else "")
        + (f", resuming at step {start_step}" if start_step else "")
    )


def resumed_batch_and_rate(config: Config, cluster: Cluster, model_dir: ModelDir) -> tuple[Config, float]:
    """The config with the per-worker batch a resume keeps (sync checkpoints of another worker count keep their
    global batch), and the learning rate: linear scaling follows the global batch that the run that set it had."""
    requested = config
    if not cluster.is_async:
        per_worker = resumed_per_worker_batch(
            recorded_run_setup(model_dir), config.per_worker_batch_size, cluster.num_workers
        )
        config = dataclasses.replace(config, per_worker_batch_size=per_worker)
    scale = cluster.num_workers * config.per_worker_batch_size // requested.per_worker_batch_size
    return config, config.learning_rate * (scale if config.scale_learning_rate else 1)


def next_call(config: Config, step: int, steps_per_epoch: int, warmed_up: bool) -> tuple[int, int, int]:
    """(the step that ends this epoch, the next periodic checkpoint's step, how many steps the next call runs):
    a call stops at an epoch end, a log point or a checkpoint, whichever comes first."""
    epoch_end = (step // steps_per_epoch + 1) * steps_per_epoch
    next_log = (step // config.effective_log_every + 1) * config.effective_log_every
    every = config.checkpoint_every
    next_checkpoint = (step // every + 1) * every if every else epoch_end
    # The first call runs one step, so the time to the first finished step is measured exactly.
    steps = min(config.steps_per_loop, epoch_end - step, next_log - step, next_checkpoint - step) if warmed_up else 1
    return epoch_end, next_checkpoint, steps
