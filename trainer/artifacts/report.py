"""What both training loops (sync and async) report: progress lines, TensorBoard scalars, the live status, and
metrics.json with the fingerprint of the final weights."""

from __future__ import annotations

import hashlib
import os
import platform
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.artifacts.atomic_file import write_json
from trainer.artifacts.layout import ModelDir
from trainer.artifacts.progress import Progress, Throughput, figures
from trainer.artifacts.status import StatusReporter
from trainer.settings.config import Config
from trainer.step import Totals, keyed


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


class Report:
    """What the loop reports, by the task's metric names: progress lines, TensorBoard scalars (the chief's, under
    <model-dir>/logs), the live status, and at the end metrics.json."""

    def __init__(
        self,
        model_dir: str,
        is_chief: bool,
        status: StatusReporter,
        progress: Progress,
        throughput: Throughput,
        metric_names: tuple[str, ...],
    ) -> None:
        self.model_dir, self.is_chief, self.status = model_dir, is_chief, status
        self.progress, self.throughput, self.metric_names = progress, throughput, metric_names
        self.train_log, self.test_log = summary_writers(model_dir, is_chief)

    def running(self, workers: int, start_step: int) -> None:
        """The status as the loop starts, from a fresh run or a checkpoint. A metrics.json left by an earlier run
        goes: until this run writes its own, none in the model dir may pass for this run's."""
        if self.is_chief and os.path.exists(ModelDir(self.model_dir).metrics):
            os.remove(ModelDir(self.model_dir).metrics)
        self.status.update(
            state="running",
            workers=workers,
            global_step=start_step,
            total_steps=self.progress.total_steps,
            epochs=self.progress.epochs,
            epoch=self.progress.epoch_of(start_step + 1),
            metric_names=list(self.metric_names),
        )

    def training(
        self, optimizer: keras.optimizers.Optimizer, step: int, metrics: dict[str, float], skipped_steps: int = 0
    ) -> None:
        """A progress line, TensorBoard scalars and the status, from the training metrics since the epoch began
        (and the steps skipped for non-finite values so far, where there are any)."""
        speed = self.throughput.end_interval()
        self.progress.step(step, metrics, speed, skipped_steps)
        learning_rate = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        write_scalars(self.train_log, step, **metrics, examples_per_second=speed, learning_rate=learning_rate)
        total_steps, batch = self.progress.total_steps, self.throughput.global_batch_size
        self.status.update(
            global_step=step,
            epoch=self.progress.epoch_of(step),
            **metrics,
            examples_per_second=speed,
            eta_seconds=(total_steps - step) * batch / speed if speed else None,
            skipped_steps=skipped_steps,
        )

    def epoch(self, step: int, train: dict[str, float], test: Totals | None) -> None:
        """The line that closes an epoch, with its test scalars and status; with no test pass (--no-eval-in-loop:
        an evaluator task follows the checkpoints), the training figures alone."""
        epoch = self.progress.epoch_of(step)
        if test is None:
            self.progress.line(
                f"epoch {epoch}/{self.progress.epochs} done: train {figures(train)} (test pass left to the evaluator)"
            )
            return
        write_scalars(self.test_log, step, **test.means())
        self.status.update(**test_record(test))
        self.progress.epoch_done(epoch, train, test.means())

    def finished(
        self,
        task_name: str,
        config: Config,
        model: keras.Model,
        step: int,
        train: Totals,
        test: Totals,
        run: dict[str, Any],
    ) -> dict[str, Any]:
        """metrics.json (the chief's), the final status, and the one line every training task prints at the end;
        returns the record."""
        trained = keyed("train", train.means()) if train.examples else {}  # none when resumed after the last step
        record = metrics_record(config, model, self.throughput, {**trained, **test_record(test)}, **run)
        if self.is_chief:
            write_json(ModelDir(self.model_dir).metrics, record)
        self.status.update(state="succeeded", global_step=step, **test_record(test))
        # Every worker prints this one line, so a reader can compare the replicas' weights.
        print(
            f"{task_name} finished: test {figures(test.means())}, weights sha256 {record['weights_sha256']}", flush=True
        )
        return record


def test_record(test: Totals) -> dict[str, Any]:
    """test_<name> of every metric and test_examples_evaluated: the status fields and metrics.json keys."""
    return keyed("test", {**test.means(), "examples_evaluated": test.examples})


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
