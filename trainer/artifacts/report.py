"""What both training loops (sync and async) report: progress lines, TensorBoard scalars, the live status, and
metrics.json with the fingerprint of the final weights."""

from __future__ import annotations

import hashlib
import platform
import time
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.artifacts.atomic_file import write_json
from trainer.config import Config
from trainer.artifacts.layout import ModelDir
from trainer.artifacts.progress import Progress, Throughput
from trainer.artifacts.status import StatusReporter


def metrics_record(
    config: Config, model: keras.Model, throughput: Throughput, results: dict[str, float], **run: int | float | str
) -> dict[str, Any]:
    """What metrics.json holds: the last epoch's results, throughput, the run's shape, config and versions."""
    return {
        **results,
        "examples_per_second": throughput.steady_examples_per_second,
        "time_to_first_step_seconds": throughput.time_to_first_step,
        # Seconds from process start to each milestone (tensorflow_imported, group_formed, ... first_step).
        "startup_seconds": throughput.startup.seconds,
        "duration_seconds": time.time() - throughput.startup.started_at,
        **run,
        "weights_sha256": weights_digest(model),
        "config": config.to_dict(),
        "versions": {"python": platform.python_version(), "tensorflow": tf.__version__, "keras": keras.__version__},
    }


def report_running(status: StatusReporter, progress: Progress, workers: int, start_step: int) -> None:
    """The status as the loop starts, from a fresh run or a checkpoint."""
    status.update(
        state="running",
        workers=workers,
        global_step=start_step,
        total_steps=progress.total_steps,
        epochs=progress.epochs,
        epoch=progress.epoch_of(start_step + 1),
    )


def report_training(
    progress: Progress,
    status: StatusReporter,
    writer: Any,
    throughput: Throughput,
    optimizer: keras.optimizers.Optimizer,
    step: int,
    train_metrics: Callable[[], dict[str, float]],
) -> None:
    """A progress line, TensorBoard scalars and the status, from the training metrics since the epoch began
    (read after the interval closes, so a metric read counts in the next interval, as a checkpoint does)."""
    speed = throughput.end_interval()
    metrics = train_metrics()
    loss, accuracy = metrics["train_loss"], metrics["train_accuracy"]
    progress.step(step, loss, accuracy, speed)
    write_scalars(
        writer,
        step,
        loss=loss,
        accuracy=accuracy,
        examples_per_second=speed,
        learning_rate=float(keras.ops.convert_to_numpy(optimizer.learning_rate)),
    )
    status.update(
        global_step=step,
        epoch=progress.epoch_of(step),
        loss=loss,
        accuracy=accuracy,
        examples_per_second=speed,
        eta_seconds=(progress.total_steps - step) * throughput.global_batch_size / speed if speed else None,
    )


def report_epoch(
    progress: Progress,
    status: StatusReporter,
    writer: Any,
    step: int,
    train_metrics: dict[str, float],
    test_metrics: dict[str, float],
) -> None:
    """The line that closes an epoch, with its test scalars and status; with no test metrics (--no-eval-in-loop:
    an evaluator task follows the checkpoints), the training figures alone."""
    epoch = progress.epoch_of(step)
    if not test_metrics:
        progress.line(
            f"epoch {epoch}/{progress.epochs} done: train loss {train_metrics['train_loss']:.4f} "
            f"accuracy {train_metrics['train_accuracy']:.4f} (test pass left to the evaluator)"
        )
        return
    write_scalars(writer, step, loss=test_metrics["test_loss"], accuracy=test_metrics["test_accuracy"])
    status.update(**test_metrics)
    progress.epoch_done(epoch, {**train_metrics, **test_metrics})


def report_finished(
    model_dir: str,
    task_name: str,
    is_chief: bool,
    status: StatusReporter,
    step: int,
    test_metrics: dict[str, float],
    record: dict[str, Any],
) -> None:
    """metrics.json (the chief's), the final status, and the one line every training task prints at the end."""
    if is_chief:
        write_json(ModelDir(model_dir).metrics, record)
    status.update(state="succeeded", global_step=step, **test_metrics)
    # Every worker prints this one line, so a reader can compare the replicas' weights.
    print(
        f"{task_name} finished: test accuracy {record.get('test_accuracy', float('nan')):.4f}, "
        f"weights sha256 {record['weights_sha256']}",
        flush=True,
    )


def summary_writers(model_dir: str, is_chief: bool) -> tuple[Any, Any]:
    """TensorBoard writers under <model-dir>/logs on the chief; None elsewhere (others write nothing)."""
    if not is_chief:
        return None, None
    layout = ModelDir(model_dir)
    return tf.summary.create_file_writer(layout.logs("train")), tf.summary.create_file_writer(layout.logs("test"))


def write_scalars(writer: Any, step: int, **values: float | None) -> None:
    if writer is None:
        return
    with writer.as_default(step=step):
        for name, value in values.items():
            if value is not None:
                tf.summary.scalar(name, value)
    writer.flush()


def weights_digest(model: keras.Model) -> str:
    """A fingerprint of every weight, identical on workers that hold identical weights."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight.value)).tobytes())
    return digest.hexdigest()
