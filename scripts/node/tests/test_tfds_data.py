"""make submit's default dataset on the node: the data Job runs TFDS's preparation of fashion_mnist in the image
against a prepared copy on the volume (nothing can be downloaded here, so the copy stands where a download would
land), and the TFJob's two workers train from it. Every other cluster test trains `synthetic`, the one dataset that
never enters TFDS's code in the image.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess
import sys

import pytest

from scripts.node.tests.node import ROOT, SETTINGS, SHORT_JOB, clear_model_dir, fetch_model, make, volume_on_node

pytestmark = pytest.mark.cluster

JOB_NAME = "e2e-tfds"
DATA_DIR = SETTINGS["TRAINER_DATA_DIR"]


def volume() -> pathlib.Path:
    """The claim on the node's disk; local-path binds it on first use, so a short job binds it when nothing has."""
    root = volume_on_node()
    if root is None:
        make("submit", f"JOB_NAME={JOB_NAME}", *SHORT_JOB)
        make("delete", f"JOB_NAME={JOB_NAME}")
        clear_model_dir(JOB_NAME)
        root = volume_on_node()
    assert root is not None, "the volume claim is not bound after a job used it"
    return root


def test_the_default_datasets_data_job_finds_it_prepared_on_the_volume_and_the_tfjob_trains_on_it(tmp_path) -> None:
    job = f"JOB_NAME={JOB_NAME}"
    make("delete", job, check=False)
    clear_model_dir(JOB_NAME)
    data_dir = volume() / pathlib.PurePosixPath(DATA_DIR).relative_to(SETTINGS["MOUNT_PATH"])
    shutil.rmtree(data_dir / "fashion_mnist", ignore_errors=True)
    made = subprocess.run(
        [sys.executable, str(ROOT / "tests/helpers/prepared_tfds.py"), str(data_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert made.returncode == 0, made.stderr[-3000:]

    submitted = make("submit", job, "DATASET=fashion_mnist", "EPOCHS=1")
    # The data Job's own line, from TFDS's builder in the image, before the TFJob was created.
    assert f"dataset fashion_mnist is ready at {DATA_DIR}/fashion_mnist/3.0.1" in submitted.stdout, submitted.stdout
    metrics = json.loads((fetch_model(tmp_path, JOB_NAME) / "metrics.json").read_text())
    assert metrics["config"]["dataset"] == "fashion_mnist" and metrics["workers"] == 2
    # The prepared images are learnable (a band per class): read through TFDS with their labels, they are learned.
    assert metrics["test_accuracy"] > 0.5, metrics
    make("delete", job)
