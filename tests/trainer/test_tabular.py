"""docs/fork.md's second example, examples/tabular.py: a CSV of tabular rows (its own dataset with its own options,
held as datasets.Arrays) and a task over it, trained by two real workers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tensorflow as tf

from multiworker import run_group, trainer_flags
from trainer.artifacts import layout
from trainer.base.errors import DataError
from trainer.context import parse_config

MODULE = "examples.tabular"  # importable from the project root; a fork copies it into modules/
TASK = ["--task-module", MODULE, "--task", "tabular", "--dataset-module", MODULE, "--dataset", "csv"]


def write_csv(path, rows, seed):
    """Six columns on very different scales and a class that depends on three of them."""
    rng = np.random.default_rng(seed)
    features = rng.normal(size=(rows, 6)) * [1, 10, 100, 1, 1, 1] + [0, 5, 50, 0, 0, 0]
    label = (features[:, 0] + features[:, 1] / 10 - features[:, 2] / 100 + 0.3 * rng.normal(size=rows)) > 0.5
    np.savetxt(path, np.column_stack([features, label]), delimiter=",", header="a,b,c,d,e,f,label", comments="")
    return path


@pytest.fixture(scope="module")
def csv_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("csv")
    return write_csv(folder / "train.csv", 448, 1), write_csv(folder / "test.csv", 160, 2)


def test_the_datasets_options_are_flags_variables_and_help(csv_files):
    train, test = csv_files
    environ = {"TRAINER_CSV_TRAIN": str(train), "TRAINER_CSV_TEST": str(test)}
    config = parse_config([*TASK, "--csv-target", "label"], environ)
    from examples.tabular import CsvOptions, csv

    assert config.group(CsvOptions) == CsvOptions(str(train), str(test), "label")
    source = csv(config)
    assert source.num_classes == 2 and source.train.shard(0, 2).size == 224
    with pytest.raises(DataError, match="no column 'y'"):
        csv(parse_config([*TASK, "--csv-target", "y"], environ))


@pytest.mark.slow
def test_two_workers_train_the_csv_rows_and_serve_the_raw_columns(tmp_path, csv_files):
    train, test = csv_files
    model_dir = tmp_path / "model"
    flags = [*TASK, "--csv-train", str(train), "--csv-test", str(test), "--model-dir", str(model_dir)]
    flags += trainer_flags(epochs=8, per_worker_batch_size=16, log_every=8, weight_decay=0.01, warmup_steps=8)
    results = run_group(2, flags, timeout=300)
    for result in results.values():
        assert result.returncode == 0, result.output[-3000:]
    digests = {line.rsplit(" ", 1)[1] for r in results.values() for line in r.output.splitlines() if "sha256" in line}
    assert len(digests) == 1, "the two workers hold different weights"
    metrics = json.loads((model_dir / layout.METRICS).read_text())
    assert metrics["workers"] == 2 and metrics["train_examples"] == 448 and metrics["test_accuracy"] > 0.8
    # The export standardizes inside the model: raw columns in, the same classes as the in-memory model out.
    serve = tf.saved_model.load(layout.ModelDir(str(model_dir)).latest_saved_model()).signatures["serve"]
    rows = np.loadtxt(test, delimiter=",", skiprows=1, dtype=np.float32)
    predicted = serve(features=tf.constant(rows[:, :6]))["class_id"].numpy()
    assert (predicted == rows[:, 6]).mean() == pytest.approx(metrics["test_accuracy"], abs=1e-6)
