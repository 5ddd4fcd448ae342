"""Verified exports: before serving/<version>/ is published, the SavedModel is loaded back and its serving signature
answers a few test examples like the model in memory; a deliberately skewed serve() (tests/helpers/skewed_serving.py)
fails the run with exit 2 and publishes nothing. Real `python -m trainer` processes."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

from multiworker import run_group, start, wait_all
from trainer.artifacts import export_check, layout
from trainer.base.errors import ExitCode, ExportCheckError

TINY = ["--dataset", "synthetic", "--train-examples", "256", "--test-examples", "64", "--epochs", "1",
        "--per-worker-batch-size", "32", "--task-module", "skewed_serving"]  # fmt: skip


def train_alone(model_dir: pathlib.Path, task: str) -> tuple[int, str]:
    process = start([*TINY, "--task", task, "--model-dir", str(model_dir)], None)
    finished = wait_all({"alone": process}, timeout=240)["alone"]
    return finished.returncode, finished.output


def published_versions(model_dir: pathlib.Path) -> list[str]:
    serving = model_dir / layout.SERVING
    return sorted(path.name for path in serving.iterdir()) if serving.is_dir() else []


def assert_refused(model_dir: pathlib.Path, output: str) -> None:
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    assert "serving_default" in line and "serving skew" in line and "'probabilities' by" in line, line
    assert published_versions(model_dir) == []  # not even a partial folder left
    assert not (model_dir / layout.KERAS_MODEL).exists() and not (model_dir / layout.METRICS).exists()
    status = json.loads((model_dir / layout.STATUS).read_text())
    assert status["state"] == "failed" and status["exit_code"] == ExitCode.BAD_CONFIG


def test_a_serving_skew_fails_the_run_and_publishes_nothing(tmp_path):
    code, output = train_alone(tmp_path / "model", "skewed_serving")
    assert code == ExitCode.BAD_CONFIG, output[-3000:]
    assert_refused(tmp_path / "model", output)


@pytest.mark.slow  # two runs to their export: make test-slow (the skew's run stays quick)
@pytest.mark.parametrize("task", ["image_classification", "faithful_serving"])
def test_a_faithful_export_is_published_with_its_check_in_metrics_json(tmp_path, task):
    code, output = train_alone(tmp_path / "model", task)
    assert code == ExitCode.OK, output[-3000:]
    metrics = json.loads((tmp_path / "model" / layout.METRICS).read_text())
    check = metrics["export_check"]
    assert set(check) == {"passed", "examples", "max_abs_diff", "tolerance", "signature"}  # selection reads these
    assert check["passed"] is True and check["examples"] == export_check.EXAMPLES
    assert check["signature"] == "serving_default" and check["tolerance"] == export_check.TOLERANCE
    assert 0 <= check["max_abs_diff"] <= check["tolerance"]
    assert published_versions(tmp_path / "model") == [str(metrics["steps"])]


class OneInput:
    """The one thing check() asks of a task here: its serving inputs."""

    def serving_signature(self, model):
        return [tf.TensorSpec((None, 1), tf.float32, name="x")]


class TwoOutputs(tf.Module):
    @tf.function(input_signature=[tf.TensorSpec((None, 1), tf.float32, name="x")])
    def serve(self, x):
        return {"exact": x, "not_a_number": x * float("nan")}


def test_a_nan_in_any_output_fails_the_check_wherever_it_comes(tmp_path):
    # Before: max() over the outputs' differences kept the 0.0 of the output before the NaN, and the check passed.
    module = TwoOutputs()
    tf.saved_model.save(module, str(tmp_path), signatures={export_check.SIGNATURE: module.serve})
    features = np.ones((2, 1), np.float32)
    expected = {"exact": features, "not_a_number": features}  # the NaN's difference comes second
    with pytest.raises(ExportCheckError, match="'not_a_number' by nan"):
        export_check.check(str(tmp_path), OneInput(), None, features, expected)


@pytest.mark.slow
def test_two_workers_the_chief_refuses_the_skewed_export_and_no_worker_hangs(tmp_path):
    model_dir = tmp_path / "model"
    finished = run_group(2, [*TINY, "--task", "skewed_serving", "--model-dir", str(model_dir)], timeout=240)
    chief = finished["worker-0"]
    assert chief.returncode == ExitCode.BAD_CONFIG, chief.output[-3000:]
    assert_refused(model_dir, chief.output)
    # The other worker checks nothing (its save goes to a scratch folder) and is not left waiting in a collective.
    assert finished["worker-1"].returncode in (ExitCode.OK, ExitCode.GROUP_FAILED), finished["worker-1"].output[-3000:]
