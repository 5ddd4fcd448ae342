"""The training loop: one function, readable top to bottom.

Keras 3 `model.fit` fails under MultiWorkerMirroredStrategy, so this is a
custom loop: `strategy.run` of a train step inside a `tf.function` that runs
several steps per call, the loss averaged over the global batch, metrics kept
per replica and reduced across workers only when they are read (log intervals,
epoch ends). Every worker runs exactly the same sequence of calls; only the
chief prints and persists.
"""

from __future__ import annotations

import hashlib
import logging
import platform
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer import data, saving
from trainer.cluster import Cluster
from trainer.config import Config
from trainer.model import build_model, build_optimizer
from trainer.progress import Progress

log = logging.getLogger(__name__)


def train_and_evaluate(config: Config, cluster: Cluster, strategy: tf.distribute.Strategy,
                       started_at: float) -> dict[str, Any]:
    """Trains and evaluates; the chief saves the model and metrics.json. Returns the metrics."""
    workers = cluster.num_workers
    global_batch_size = config.per_worker_batch_size * workers
    learning_rate = config.learning_rate * (workers if config.scale_learning_rate else 1)
    keras.utils.set_random_seed(config.seed)

    splits = data.load_splits(config.dataset, config.data_dir, config.seed, config.download,
                              config.train_examples, config.test_examples)
    steps_per_epoch = splits.train_size // global_batch_size
    total_steps = steps_per_epoch * config.epochs
    log_every = config.effective_log_every

    with strategy.scope():
        model = build_model(config.model, splits.image_shape, splits.num_classes)
        optimizer = build_optimizer(learning_rate)
        train_loss, train_accuracy = keras.metrics.Mean(), keras.metrics.SparseCategoricalAccuracy()
        test_loss, test_accuracy = keras.metrics.Mean(), keras.metrics.SparseCategoricalAccuracy()
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)

    train_batches = strategy.experimental_distribute_dataset(
        data.train_pipeline(splits.train, splits.train_size, global_batch_size, config.seed, config.epochs))
    test_batches = strategy.experimental_distribute_dataset(
        data.test_pipeline(splits.test, global_batch_size))
    iterator = iter(train_batches)

    def train_step(images: tf.Tensor, labels: tf.Tensor) -> None:
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            per_example_loss = loss_fn(labels, logits)
            # Divide by the global batch, not the local one: the all-reduce sums the workers' gradients.
            loss = tf.nn.compute_average_loss(per_example_loss, global_batch_size=global_batch_size)
            if model.losses:
                loss += tf.nn.scale_regularization_loss(tf.add_n(model.losses))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        train_loss.update_state(per_example_loss)
        train_accuracy.update_state(labels, logits)

    @tf.function
    def train_steps(iterator: Any, steps: tf.Tensor) -> None:
        for _ in tf.range(steps):
            strategy.run(train_step, args=next(iterator))

    def eval_step(images: tf.Tensor, labels: tf.Tensor) -> None:
        logits = model(images, training=False)
        test_loss.update_state(loss_fn(labels, logits))
        test_accuracy.update_state(labels, logits)

    @tf.function
    def evaluate() -> None:
        for images, labels in test_batches:
            strategy.run(eval_step, args=(images, labels))

    progress = Progress(total_steps, steps_per_epoch, config.epochs,
                        enabled=cluster.is_chief or config.verbose_workers)
    progress.line(f"training {config.model} on {config.dataset}: {splits.train_size} examples, "
                  f"{workers} worker(s) x {config.per_worker_batch_size} = global batch {global_batch_size}, "
                  f"{steps_per_epoch} steps/epoch x {config.epochs} epochs, learning rate {learning_rate:g}")

    step = 0
    time_to_first_step = None
    steady_seconds, steady_steps = 0.0, 0  # training time after the first log interval (warm-up)
    interval_seconds, interval_steps = 0.0, 0
    test_metrics: dict[str, float] = {}
    epoch_train_metrics: dict[str, float] = {}
    while step < total_steps:
        epoch_end = (step // steps_per_epoch + 1) * steps_per_epoch
        next_log = (step // log_every + 1) * log_every
        # The first call runs one step, so the time to the first finished step is measured exactly.
        steps = 1 if step == 0 else min(config.steps_per_loop, epoch_end - step, next_log - step)
        call_started = time.perf_counter()
        train_steps(iterator, tf.constant(steps))
        seconds = time.perf_counter() - call_started
        step += steps
        if time_to_first_step is None:
            time_to_first_step = time.time() - started_at
        elif step > log_every or total_steps <= log_every:
            steady_seconds += seconds
            steady_steps += steps
        interval_seconds += seconds
        interval_steps += steps

        if step % log_every == 0 or step == epoch_end:
            # Reading a metric all-reduces it across workers: every worker reads at the same steps.
            loss, accuracy = float(train_loss.result()), float(train_accuracy.result())
            speed = interval_steps * global_batch_size / interval_seconds if step > log_every else None
            progress.step(step, loss, accuracy, speed)
            interval_seconds, interval_steps = 0.0, 0

        if step == epoch_end:
            evaluate()
            epoch_train_metrics = {"train_loss": float(train_loss.result()),
                                   "train_accuracy": float(train_accuracy.result())}
            test_metrics = {"test_loss": float(test_loss.result()), "test_accuracy": float(test_accuracy.result())}
            progress.line(f"epoch {step // steps_per_epoch}/{config.epochs} done: "
                          f"train loss {epoch_train_metrics['train_loss']:.4f} "
                          f"accuracy {epoch_train_metrics['train_accuracy']:.4f} | "
                          f"test loss {test_metrics['test_loss']:.4f} accuracy {test_metrics['test_accuracy']:.4f}")
            for metric in (train_loss, train_accuracy, test_loss, test_accuracy):
                metric.reset_state()

    saving.save_model(model, config.model_dir, cluster.is_chief)
    metrics = {
        **epoch_train_metrics,
        **test_metrics,
        "examples_per_second": steady_steps * global_batch_size / steady_seconds if steady_seconds else None,
        "time_to_first_step_seconds": time_to_first_step,
        "duration_seconds": time.time() - started_at,
        "workers": workers,
        "global_batch_size": global_batch_size,
        "learning_rate": learning_rate,
        "steps": step,
        "steps_per_epoch": steps_per_epoch,
        "train_examples": splits.train_size,
        "test_examples": splits.test_size,
        "weights_sha256": weights_digest(model),
        "config": config.to_dict(),
        "versions": {"python": platform.python_version(), "tensorflow": tf.__version__,
                     "keras": keras.__version__},
    }
    if cluster.is_chief:
        saving.write_json(f"{config.model_dir}/{saving.METRICS}", metrics)
    # Every worker prints this one line, so a reader can compare the replicas' weights.
    print(f"{cluster.name} finished: test accuracy {metrics.get('test_accuracy', float('nan')):.4f}, "
          f"weights sha256 {metrics['weights_sha256']}", flush=True)
    return metrics


def weights_digest(model: keras.Model) -> str:
    """A fingerprint of every weight, identical on workers that hold identical weights."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight.value)).tobytes())
    return digest.hexdigest()
