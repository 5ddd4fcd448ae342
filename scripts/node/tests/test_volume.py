"""One volume, several jobs: each job name keeps its own model directory on the claim, and a job submitted again
under its name resumes from its own checkpoint rather than starting over.
"""

from __future__ import annotations

import json

import pytest

from scripts.node.tests.node import clear_model_dir, fetch_model, make

pytestmark = pytest.mark.cluster

TINY = ["DATASET=synthetic", "ARGS=--train-examples 1024 --test-examples 256"]


def metrics_of(job_name: str, destination) -> dict:
    return json.loads((fetch_model(destination, job_name) / "metrics.json").read_text())


def test_two_jobs_keep_separate_model_dirs_and_a_resubmit_resumes_from_its_own_checkpoint(tmp_path) -> None:
    alpha, beta = ["JOB_NAME=e2e-alpha"], ["JOB_NAME=e2e-beta"]
    for job in (alpha, beta):
        make("delete", *job, check=False)
        clear_model_dir(job[0].removeprefix("JOB_NAME="))
    make("submit", *alpha, "EPOCHS=1", *TINY)
    make("submit", *beta, "EPOCHS=2", *TINY)
    first_alpha, first_beta = metrics_of("e2e-alpha", tmp_path / "a1"), metrics_of("e2e-beta", tmp_path / "b1")
    # Each directory holds its own run: one epoch under alpha's name, two under beta's, both from step 0.
    assert first_alpha["steps"] == first_alpha["steps_per_epoch"]
    assert first_beta["steps"] == 2 * first_beta["steps_per_epoch"]
    assert first_alpha["resumed_from_step"] == first_beta["resumed_from_step"] == 0

    # Submitted again for two epochs, alpha resumes at the end of its first and trains only the second.
    make("submit", *alpha, "EPOCHS=2", *TINY)
    again = metrics_of("e2e-alpha", tmp_path / "a2")
    assert again["resumed_from_step"] == first_alpha["steps"]
    assert again["steps"] == 2 * first_alpha["steps_per_epoch"]
    # And beta's directory is as beta left it.
    assert metrics_of("e2e-beta", tmp_path / "b2") == first_beta
    for job in (alpha, beta):
        make("delete", *job)
