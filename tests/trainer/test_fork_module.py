"""One name for a fork: `--module` alone trains a module that registers one task and one dataset; a module that
registers several datasets is refused, naming them and the flag that picks one; the older --task-module and
--dataset-module keep working but are not in --help."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

from trainer import context
from trainer.settings import flags

ROOT = pathlib.Path(__file__).resolve().parents[2]
TINY = {  # a small run through variables, so the command line holds --module and nothing else
    "TRAINER_EPOCHS": "1",
    "TRAINER_TRAIN_EXAMPLES": "256",
    "TRAINER_TEST_EXAMPLES": "64",
    "TRAINER_PER_WORKER_BATCH_SIZE": "32",
}


def trainer_environment(**variables: str) -> dict[str, str]:
    """This process's environment without TF_CONFIG or any TRAINER_* variable, plus `variables`."""
    kept = {key: value for key, value in os.environ.items() if not key.startswith("TRAINER_") and key != "TF_CONFIG"}
    return {**kept, **variables}


def run_trainer(args: list[str], environ: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainer", *args], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=timeout
    )


def test_a_module_that_registers_one_task_and_one_dataset_trains_with_module_alone(tmp_path):
    model_dir = tmp_path / "model"
    result = run_trainer(
        ["--module", "examples.regression"], trainer_environment(**TINY, TRAINER_MODEL_DIR=str(model_dir))
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    record = json.loads((model_dir / "metrics.json").read_text())
    assert (record["config"]["dataset"], record["config"]["task"]) == ("linear_features", "regression")


def test_a_module_that_registers_two_datasets_is_refused_naming_them_and_the_flag(tmp_path):
    (tmp_path / "two_datasets.py").write_text(
        "from trainer.api import datasets\n\n"
        "@datasets.register('first_rows')\ndef first(config):\n    raise AssertionError('not loaded')\n\n"
        "@datasets.register('second_rows')\ndef second(config):\n    raise AssertionError('not loaded')\n"
    )
    environ = trainer_environment(PYTHONPATH=str(tmp_path), TRAINER_MODEL_DIR=str(tmp_path / "model"))
    result = run_trainer(["--module", "two_datasets"], environ)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "registers the datasets first_rows, second_rows: choose one with --dataset" in result.stderr


def test_the_older_module_flags_still_work_out_of_help():
    argv = ["--task-module", "examples.regression", "--dataset-module", "examples.regression"]
    config = context.parse_config([*argv, "--task", "regression", "--dataset", "linear_features"], {})
    assert (config.task, config.dataset) == ("regression", "linear_features")
    shown = flags.build_parser({}).format_help()
    assert "--module" in shown and "--task-module" not in shown and "--dataset-module" not in shown


def test_a_given_dataset_wins_over_the_modules_own():
    config = context.parse_config(["--module", "examples.regression", "--dataset", "synthetic"], {})
    assert config.dataset == "synthetic"
    assert context.parse_config(["--module", "examples.regression"], {"TRAINER_DATASET": "synthetic"}).dataset == (
        "synthetic"
    )
