"""run-local end to end: the project's own manifest (`kubectl kustomize k8s`) and the real trainer."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from local_runner import job_model_dir, runner_status, wait_for_runner
from record_files import write_records
from trainer.artifacts.layout import ModelDir

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNNER = ["-m", "scripts.localrun.run_local"]
SMALL = ["--train-examples", "2048", "--test-examples", "512"]


def start(
    job_dir: pathlib.Path, console: pathlib.Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen:
    with console.open("w") as out:
        return subprocess.Popen(
            [sys.executable, *RUNNER, "--job-dir", str(job_dir), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
        )


@pytest.mark.slow  # several processes for long: make test-slow
def test_two_workers_of_the_project_manifest_train_one_model_into_the_job_directory(tmp_path):
    job_dir, console = tmp_path / "job", tmp_path / "console.txt"
    proc = start(job_dir, console, "--workers", "2", "--dataset", "synthetic", "--epochs", "1", "--", *SMALL)
    assert wait_for_runner(proc, console, timeout=240) == 0, console.read_text()[-5000:]
    result = runner_status(job_dir)
    assert result["state"] == "Succeeded"
    assert result["condition"]["message"] == "TFJob default/multi-worker successfully completed."
    assert {name: r["exit_codes"] for name, r in result["replicas"].items()} == {"worker-0": [0], "worker-1": [0]}
    # The manifest's MODEL_ROOT/JOB_NAME is under the job directory, and only the chief wrote there.
    model_dir = ModelDir(str(job_model_dir(job_dir).resolve()))
    assert result["model_dir"] == model_dir.root
    assert [str(p) for p in job_dir.resolve().rglob("model.keras")] == [model_dir.keras_model]
    assert [str(p.parent) for p in job_dir.resolve().rglob("saved_model.pb")] == [model_dir.latest_saved_model()]
    metrics = json.loads(pathlib.Path(model_dir.metrics).read_text())
    assert metrics["workers"] == 2
    text = console.read_text()
    assert re.search(r"^worker-0 +\| ", text, re.M) and re.search(r"^worker-1 +\| ", text, re.M)
    assert "Succeeded: TFJob default/multi-worker successfully completed." in text


@pytest.mark.slow
def test_a_worker_killed_mid_training_is_recreated_and_the_group_resumes(tmp_path):
    job_dir, console = tmp_path / "job", tmp_path / "console.txt"
    proc = start(
        job_dir,
        console,
        "--workers",
        "2",
        "--dataset",
        "synthetic",
        "--epochs",
        "2",
        "--",
        "--train-examples",
        "16384",
        "--test-examples",
        "512",
        "--checkpoint-every",
        "16",
        "--log-every",
        "16",
    )
    chief_log = job_dir / "run-local" / "logs" / "worker-0.log"
    deadline = time.monotonic() + 180
    while not (chief_log.exists() and "step 32/" in chief_log.read_text()):
        assert proc.poll() is None and time.monotonic() < deadline, console.read_text()[-5000:]
        time.sleep(0.2)
    worker_1 = next(
        p
        for p in psutil.Process(proc.pid).children()
        if json.loads(p.environ().get("TF_CONFIG", "{}")).get("task", {}).get("index") == 1
    )
    os.kill(worker_1.pid, signal.SIGKILL)
    assert wait_for_runner(proc, console, timeout=300) == 0, console.read_text()[-5000:]
    result = runner_status(job_dir)
    assert result["state"] == "Succeeded"
    assert result["replicas"]["worker-1"]["exit_codes"][0] == 137
    assert result["replicas"]["worker-1"]["recreations"] >= 1
    assert "resumed from" in chief_log.read_text()


def tfrecord_settings(out: pathlib.Path) -> dict[str, str]:
    """A small trainer.data.records dataset; returns the settings that point the manifests at it."""
    write_records(out, 256, 2, 64, 1, seed=42)
    return {
        "TRAINER_TRAIN_FILES": str(out / "train-*"),
        "TRAINER_TEST_FILES": str(out / "test-*"),
        "TRAINER_IMAGE_SHAPE": "28x28x1",
        "TRAINER_NUM_CLASSES": "10",
    }


@pytest.mark.slow  # several processes for long: make test-slow
def test_a_tfrecord_dataset_in_settings_is_checked_by_the_data_job_then_trained(tmp_path):
    # The settings route (k8s/base/settings.env, or the environment as make exports it) reaches both Jobs' env.
    job_dir, console = tmp_path / "job", tmp_path / "console.txt"
    env = {**os.environ, **tfrecord_settings(tmp_path / "data")}
    args = ["--workers", "1", "--dataset", "tfrecord", "--epochs", "1", "--", "--per-worker-batch-size", "32"]
    proc = start(job_dir, console, *args, env=env)
    assert wait_for_runner(proc, console, timeout=240) == 0, console.read_text()[-5000:]
    text = console.read_text()
    ready = "dataset tfrecord is ready: train 2 files 256 examples, test 1 files 64 examples"
    assert ready in text and text.index(ready) < text.index("worker-0 reads its own 2 of 2 files"), text[-5000:]
    assert runner_status(job_dir)["state"] == "Succeeded"


def test_a_glob_matching_no_file_stops_at_the_data_job_before_any_worker_starts(tmp_path):
    job_dir, console = tmp_path / "job", tmp_path / "console.txt"
    missing = str(tmp_path / "nothing-*")
    # The ARGS route (flags after --) reaches the data Job too: it reads the trainer's flags.
    proc = start(
        job_dir,
        console,
        "--workers",
        "1",
        "--dataset",
        "tfrecord",
        "--epochs",
        "1",
        "--",
        "--train-files",
        missing,
        "--test-files",
        missing,
        "--image-shape",
        "28x28x1",
        "--num-classes",
        "10",
    )
    code = wait_for_runner(proc, console, timeout=240)
    text = console.read_text()
    assert code == 1, text[-5000:]  # the data Job Failed (its exit code 2 is in the table), so run-local did
    assert re.search(r"prepare-data +Failed +2 ", text), text[-5000:]
    assert f"error: --train-files '{missing}' matches no file" in text, text[-5000:]
    assert "the TFJob is not started" in text and not re.search(r"^worker-0 +\| ", text, re.M), text[-5000:]
