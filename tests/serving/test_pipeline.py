"""make pipeline end to end, in a copy of the project: run-local trains the cnn, dropout and batch_norm variants
(each its own JOB_NAME and model dir), make select publishes the one with the highest test accuracy, and the
server answers one request for it."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess

import pytest

from project_copy import VENV, copy_project, venv_trainer

ROOT = pathlib.Path(__file__).resolve().parents[2]
VARIANTS = {"cnn": "pipe-cnn", "dropout": "pipe-dropout", "batch_norm": "pipe-batch-norm"}


def make(project: pathlib.Path, *goals: str, timeout: float) -> subprocess.CompletedProcess:
    from scripts.common.ports import free_ports

    rest, grpc = free_ports(2)
    variables = [
        f"VENV={VENV}",
        "JOB_NAME=pipe",
        "DATASET=synthetic",
        "WORKERS=1",
        "EPOCHS=1",
        "ARGS=--train-examples 128 --test-examples 64 --per-worker-batch-size 32",
        f"SERVE_PORT={rest}",
        f"SERVE_GRPC_PORT={grpc}",
    ]
    # -o: the venv running this test is the one installed; make must not reinstall into it from the copy.
    return subprocess.run(
        ["make", "-o", f"{VENV}/.installed", *goals, *variables],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ),
    )


@pytest.mark.slow
def test_make_pipeline_trains_three_variants_selects_the_best_and_serves_it(tmp_path):
    project = copy_project(tmp_path / "project", files=("Makefile",), folders=("trainer", "scripts", "modules", "k8s"))
    done = make(project, "pipeline", timeout=1800)
    # The copy's makes (pipeline starts one per step) left the venv's trainer where it was.
    assert venv_trainer() == ROOT / "trainer"
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # run-local's model dir for each variant: MODEL_ROOT/JOB_NAME on the job's volume, runs/<job>/models/<job>.
    model_dirs = {model: project / "runs" / job / "models" / job for model, job in VARIANTS.items()}
    for model, model_dir in model_dirs.items():
        record = json.loads((model_dir / "metrics.json").read_text())
        assert record["config"]["model"] == model and record["export_check"]["passed"] is True
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    selection = json.loads((project / "runs" / "pipe-selected" / "selection.json").read_text())
    values = {c["model_dir"]: c["value"] for c in selection["candidates"]}
    assert len(values) == 3 and all(c["refused"] is None for c in selection["candidates"])
    assert selection["winner"].endswith(max(values, key=values.get))
    assert (project / "runs" / "pipe-selected" / "serving" / "1" / "saved_model.pb").exists()
    assert '"predictions": [{' in done.stdout and "class_id" in done.stdout
