"""The one reporter: a run tells it what happened, one call per event, and it fans each event out to the progress
line, the live status (status.json, HTTP /status, Prometheus: status.py), TensorBoard and metrics.json.

The entry point tells it that the run is starting and, at the end, that it failed; the training loop (in both modes,
sync and async) that it started, trained to a step, evaluated, checkpointed, was preempted or finished; the
evaluator task that it evaluated a checkpoint (its TensorBoard stream is logs/eval, its record evaluations.json).
Only the chief writes status, TensorBoard and metrics.json; every training task prints the final line, so a reader
can compare the replicas' weights. TensorFlow is imported where it is used: the status says "starting" before it is.
"""

from __future__ import annotations

import hashlib
import os
import platform
import time
from typing import TYPE_CHECKING, Any

from trainer.artifacts.layout import ModelDir
from trainer.base.atomic_file import write_json
from trainer.reporting.progress import Progress, Throughput, figures
from trainer.reporting.status import StatusReporter
from trainer.settings.config import Config

if TYPE_CHECKING:
    import keras

    from trainer.step import Totals


class Reporter:
    """What one task of the run reports. is_chief: it writes the status, TensorBoard and metrics.json; lines: it
    prints the progress lines (the chief, or every worker under --verbose-workers); evaluator: the evaluator task,
    which writes its own TensorBoard stream and evaluations.json and prints a line for each checkpoint."""

    def __init__(
        self, model_dir: ModelDir, name: str, is_chief: bool, lines: bool = False, evaluator: bool = False
    ) -> None:
        self.layout, self.name, self.is_chief, self.evaluator = model_dir, name, is_chief, evaluator
        self.lines = is_chief or lines
        self.status = StatusReporter(model_dir, enabled=is_chief)
        self.progress = Progress(1, 1, 1, enabled=False)  # the run's shape arrives with started()
        self.throughput: Throughput | None = None
        self.writers: dict[str, Any] = {}  # TensorBoard, one writer per stream
        self.evaluations: list[dict[str, Any]] = []

    def starting(self, workers: int, status_host: str, status_port: int) -> None:
        """Before the group forms: the status says so, and its server is bound (a taken port fails fast); it
        answers once the wait is over."""
        self.status.update(state="starting", workers=workers)
        self.status.serve(status_host, status_port)

    def started(
        self,
        first_line: str,
        start_step: int,
        total_steps: int,
        steps_per_epoch: int,
        epochs: int,
        workers: int,
        metric_names: tuple[str, ...],
        throughput: Throughput,
    ) -> None:
        """The loop starts, from a fresh run or a checkpoint at start_step. A metrics.json left by an earlier run
        goes: until this run writes its own, none in the model dir may pass for this run's."""
        self.progress = Progress(total_steps, steps_per_epoch, epochs, enabled=self.lines)
        self.throughput = throughput
        self.progress.line(first_line)
        if start_step >= total_steps:
            self.progress.line(f"training already reached step {start_step} of {total_steps}; evaluating and saving")
        for stream in ("train", "test"):
            self._writer(stream)  # the chief's TensorBoard streams exist from the start
        if self.is_chief and os.path.exists(self.layout.metrics):
            os.remove(self.layout.metrics)
        self.status.update(
            state="running",
            workers=workers,
            global_step=start_step,
            total_steps=total_steps,
            epochs=epochs,
            epoch=self.progress.epoch_of(start_step + 1),
            metric_names=list(metric_names),
        )

    def trained(
        self, step: int, metrics: dict[str, float], skipped_steps: int, optimizer: keras.optimizers.Optimizer
    ) -> None:
        """Training reached `step`: the training metrics since the epoch began, and the steps skipped for non-finite
        values so far (shown where there are any)."""
        import keras

        assert self.throughput is not None, "started() comes first"
        speed = self.throughput.end_interval()
        self.progress.step(step, metrics, speed, skipped_steps)
        learning_rate = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        self._scalars("train", step, **metrics, examples_per_second=speed, learning_rate=learning_rate)
        batch = self.throughput.global_batch_size
        self.status.update(
            global_step=step,
            epoch=self.progress.epoch_of(step),
            **metrics,
            examples_per_second=speed,
            eta_seconds=(self.progress.total_steps - step) * batch / speed if speed else None,
            skipped_steps=skipped_steps,
        )

    def evaluated(self, step: int, test: Totals | None, train: dict[str, float] | None = None) -> None:
        """A test pass of the weights at `step`. From the loop, at an epoch's end, with the epoch's training metrics
        (test None: the pass is left to the evaluator task, --no-eval-in-loop); from the evaluator, a checkpoint's."""
        if self.evaluator:
            assert test is not None
            means = test.means()
            self._scalars("eval", step, **means)
            self.evaluations.append({"global_step": step, **test_record(test)})
            write_json(self.layout.evaluations, {"evaluations": self.evaluations}, sort_keys=False)
            print(f"{self.name} evaluated checkpoint at step {step}: test {figures(means)}", flush=True)
            return
        epoch, train = self.progress.epoch_of(step), train or {}
        if test is None:
            self.progress.line(
                f"epoch {epoch}/{self.progress.epochs} done: train {figures(train)} (test pass left to the evaluator)"
            )
            return
        self._scalars("test", step, **test.means())
        # Which epoch the test figures are of: a tuner prunes a trial by them, epoch by epoch (scripts/tune).
        self.status.update(**test_record(test), tested_epoch=epoch)
        self.progress.epoch_done(epoch, train, test.means())

    def checkpointed(self, step: int) -> None:
        """A checkpoint holds the weights at `step`: where a restart resumes."""
        self.status.update(checkpoint_step=step)

    def preempted(self, step: int) -> None:
        """SIGTERM: the group checkpointed `step` and stops, to resume there after the restart."""
        self.status.update(state="preempted", global_step=step, checkpoint_step=step)

    def finished(
        self, config: Config, model: keras.Model, step: int, train: Totals, test: Totals, run: dict[str, Any]
    ) -> dict[str, Any]:
        """metrics.json (the chief's), the final status, and the one line every training task prints at the end;
        returns the record."""
        from trainer.step import keyed

        assert self.throughput is not None, "started() comes first"
        trained = keyed("train", train.means()) if train.examples else {}  # none when resumed after the last step
        results = {**trained, **test_record(test)}
        record = metrics_record(config, model, self.throughput, results, **run, restarts=self.status.restarts)
        if self.is_chief:
            write_json(self.layout.metrics, record)
        self.status.update(state="succeeded", global_step=step, **test_record(test))
        print(
            f"{self.name} finished: test {figures(test.means())}, weights sha256 {record['weights_sha256']}", flush=True
        )
        # The results as name=value, the form a tuner reads from the output (Katib's StdOut metrics collector).
        print(" ".join(f"{name}={value!r}" for name, value in results.items()), flush=True)
        return record

    def failed(self, error: str, exit_code: int, state: str = "failed") -> None:
        """The run stops with this error and exit code (the status's; the entry point prints the error)."""
        self.status.failed(error, exit_code, state)

    def close(self) -> None:
        self.status.close()

    def _writer(self, stream: str) -> Any:
        """The TensorBoard writer of <model-dir>/logs/<stream>: the chief's train and test, the evaluator's eval;
        None where this task writes none."""
        if not (self.is_chief or (self.evaluator and stream == "eval")):
            return None
        if stream not in self.writers:
            import tensorflow as tf

            self.writers[stream] = tf.summary.create_file_writer(self.layout.logs(stream))
        return self.writers[stream]

    def _scalars(self, stream: str, step: int, **values: float | None) -> None:
        writer = self._writer(stream)
        if writer is None:
            return
        import tensorflow as tf

        with writer.as_default(step=step):
            for name, value in values.items():
                if value is not None:
                    tf.summary.scalar(name, value)
        writer.flush()


def metrics_record(
    config: Config, model: keras.Model, throughput: Throughput, results: dict[str, float], **run: int | float | str
) -> dict[str, Any]:
    """What metrics.json holds: the last epoch's results, throughput, the run's shape, config and versions."""
    import keras
    import tensorflow as tf

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


def test_record(test: Totals) -> dict[str, Any]:
    """test_<name> of every metric and test_examples_evaluated: the status fields, metrics.json and evaluations.json
    keys."""
    from trainer.step import keyed

    return keyed("test", {**test.means(), "examples_evaluated": test.examples})


def weights_digest(model: keras.Model) -> str:
    """A fingerprint of every weight, identical on workers that hold identical weights."""
    import keras
    import numpy as np

    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight.value)).tobytes())
    return digest.hexdigest()
