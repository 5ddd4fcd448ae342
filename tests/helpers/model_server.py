"""The serving tests' real pieces: tiny models trained by the real trainer, a real `python -m trainer.serving`
process on free ports, and the export check record metrics.json carries once training checks its export."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import httpx

from scripts.common.ports import free_ports

ROOT = pathlib.Path(__file__).resolve().parents[2]
REGRESSION = ["--task-module", "examples.regression", "--task", "regression", "--dataset-module", "examples.regression"]
REGRESSION_DATA = ["--dataset", "linear_features", "--train-examples", "256", "--test-examples", "64"]
IMAGE_DATA = ["--dataset", "synthetic", "--train-examples", "128", "--test-examples", "64"]
EXAMPLES = 8


def train(model_dir: pathlib.Path, *flags: str, timeout: float = 300) -> pathlib.Path:
    """One short real training run into model_dir; returns it."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "--epochs",
            "1",
            "--per-worker-batch-size",
            "32",
            "--model-dir",
            str(model_dir),
        ]
        + list(flags),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return model_dir


def add_export_check(model_dir: pathlib.Path, passed: bool = True) -> None:
    """The record the export check writes into metrics.json (its shape as the trainer writes it)."""
    path = model_dir / "metrics.json"
    record = json.loads(path.read_text())
    record.setdefault(
        "export_check",
        {"passed": passed, "examples": 64, "max_abs_diff": 0.0, "tolerance": 1e-5, "signature": "serve"},
    )
    path.write_text(json.dumps(record))


def image_examples(count: int = EXAMPLES):
    """`count` test images of the synthetic dataset the image model was trained on, each different."""
    import numpy as np
    import tensorflow as tf

    from trainer.data.datasets import TEST_INDEX_OFFSET
    from trainer.data.synthetic import example_fn

    example = example_fn(42)
    return np.stack([example(tf.constant(TEST_INDEX_OFFSET + i))[0].numpy() for i in range(count)])


def in_process(base_path: pathlib.Path, **inputs) -> dict:
    """What version 1's serve signature computes for these inputs, called in this process."""
    import tensorflow as tf

    signature = tf.saved_model.load(str(base_path / "1")).signatures["serve"]
    return {
        name: tensor.numpy() for name, tensor in signature(**{k: tf.constant(v) for k, v in inputs.items()}).items()
    }


def copy_versions(model_dir: pathlib.Path, base_path: pathlib.Path) -> pathlib.Path:
    """A served base path holding the model dir's SavedModel as version 1."""
    (version,) = [path for path in (model_dir / "serving").iterdir() if path.name.isdigit()]
    base_path.mkdir(parents=True, exist_ok=True)
    shutil.copytree(version, base_path / "1")
    return base_path


def publish_version(source: pathlib.Path, base_path: pathlib.Path, version: int | str) -> None:
    """A new version, whole or not at all: copied beside the others under a hidden name, then renamed."""
    partial = base_path / f".{version}.partial"
    shutil.copytree(source, partial)
    os.replace(partial, base_path / str(version))


class ServerProcess:
    """`python -m trainer.serving` on free ports, ready before start() returns."""

    def __init__(self, base_path: pathlib.Path, name: str, log: pathlib.Path, *flags: str) -> None:
        self.rest_port, self.grpc_port = free_ports(2)
        self.name, self.log = name, log
        self.url = f"http://127.0.0.1:{self.rest_port}"
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"
        command = [
            sys.executable,
            "-m",
            "trainer.serving",
            "--model-base-path",
            str(base_path),
            "--model-name",
            name,
            "--rest-port",
            str(self.rest_port),
            "--grpc-port",
            str(self.grpc_port),
            "--poll-seconds",
            "0.2",
            *flags,
        ]
        with log.open("w") as out:
            self.process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/v2/models/{self.name}/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"the server was not ready in {timeout} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def save_rows_model(path: pathlib.Path, factor: float) -> pathlib.Path:
    """A SavedModel whose every row is easy to check and whose call time a client picks: `serve` takes x (float32
    [-1, 1]) and pause_us (int64 [-1]), sleeps the largest pause_us (a timer, no CPU), refuses a negative x when called
    (the model's own error, after any checks of the request) and returns y = factor * x."""
    import tensorflow as tf

    class Rows(tf.Module):
        @tf.function(
            input_signature=[
                tf.TensorSpec((None, 1), tf.float32, name="x"),
                tf.TensorSpec((None,), tf.int64, name="pause_us"),
            ]
        )
        def serve(self, x, pause_us):
            tf.debugging.assert_non_negative(x, message="x must not be negative")
            sleeping = tf.raw_ops.SleepDataset(
                input_dataset=tf.data.experimental.to_variant(tf.data.Dataset.range(1)),
                sleep_microseconds=tf.reduce_max(tf.concat([pause_us, [0]], 0)),
                output_types=[tf.int64],
                output_shapes=[[]],
            )
            # take(1): the sleep runs before each element asked for, and reduce would ask once more for the end.
            slept = (
                tf.data.experimental.from_variant(sleeping, tf.TensorSpec([], tf.int64))
                .take(1)
                .reduce(tf.constant(0, tf.int64), lambda total, value: total + value)
            )
            return {"y": factor * x + tf.cast(slept, tf.float32)}

    module = Rows()
    tf.saved_model.save(module, str(path), signatures={"serve": module.serve})
    return path


def metrics(server: ServerProcess) -> dict[str, float]:
    """The server's Prometheus samples by name, labels included as written (serving_batch_requests_bucket{le="4.0"})."""
    samples = {}
    for line in httpx.get(f"{server.url}/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples
