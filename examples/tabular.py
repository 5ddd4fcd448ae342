"""A fork's task and data in one file: classification of tabular rows read from CSV files.

Copy it into modules/ and point it at two CSV files with a header row, numeric columns and an integer class
column:

    cp examples/tabular.py modules/
    python -m trainer --module modules.tabular --dataset csv --csv-train data/train.csv --csv-test data/test.csv \\
        --csv-target label --epochs 5

It registers the dataset `csv`, with its own options (--csv-train, --csv-test, --csv-target; also TRAINER_CSV_*
variables, listed under "dataset csv" in --help), which holds the rows in memory as `datasets.Arrays` (each
worker keeps only its range of rows), and the task `tabular`: an MLP whose first layer standardizes the
features with the training split's mean and variance, so the exported model takes the raw columns.
docs/fork.md walks through it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.api import Config, DataError, Task, datasets, option, register


@dataclasses.dataclass(frozen=True)
class CsvOptions:
    csv_train: str = option("", "CSV file of the training rows (a header row, then numbers)")
    csv_test: str = option("", "CSV file of the test rows, with the same columns")
    csv_target: str = option("label", "the column holding each row's class, 0..N-1")


@dataclasses.dataclass(frozen=True)
class TabularSource(datasets.Source):
    """A Source that also carries the training features' mean and variance, for the model's first layer."""

    feature_mean: Any = None
    feature_variance: Any = None


def read_csv(path: str, target: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(features float32 [rows, columns], class ids int64 [rows], the feature columns' names)."""
    try:
        with open(path) as handle:
            header = handle.readline().strip().split(",")
            rows = np.loadtxt(handle, delimiter=",", dtype=np.float64, ndmin=2)
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: cannot read it as CSV of numbers with a header row ({error})") from None
    if target not in header:
        raise DataError(f"{path} has no column {target!r} (columns: {', '.join(header)}); set --csv-target")
    if rows.shape[1] != len(header):
        raise DataError(f"{path}: the header names {len(header)} columns, the rows have {rows.shape[1]}")
    bad = np.argwhere(~np.isfinite(rows))
    if len(bad):
        cells = ", ".join(f"row {row + 1} column {header[column]!r}" for row, column in bad[:5])
        raise DataError(
            f"{path}: {len(bad)} cell(s) are not finite numbers (an empty cell or NaN reads as NaN): {cells}; "
            f"fill or drop them before training"
        )
    column = header.index(target)
    classes = rows[:, column]
    if not np.array_equal(classes, np.round(classes)) or classes.min() < 0:
        raise DataError(f"{path}: column {target!r} must hold class ids 0..N-1, found {sorted(set(classes))[:5]}")
    features = np.delete(rows, column, axis=1).astype(np.float32)
    return features, classes.astype(np.int64), [name for name in header if name != target]


@datasets.register("csv", options=CsvOptions)
def csv(config: Config) -> datasets.Source:
    options = config.group(CsvOptions)
    if not options.csv_train or not options.csv_test:
        raise DataError("--dataset csv needs --csv-train and --csv-test: CSV files with a header row")
    train_x, train_y, names = read_csv(options.csv_train, options.csv_target)
    test_x, test_y, test_names = read_csv(options.csv_test, options.csv_target)
    if test_names != names:
        raise DataError(f"{options.csv_test} has columns {test_names}, {options.csv_train} has {names}")
    return TabularSource(
        train=datasets.Arrays(train_x, train_y),
        test=datasets.Arrays(test_x, test_y),
        element_spec=datasets.arrays_spec(train_x, train_y),
        num_classes=int(max(train_y.max(), test_y.max())) + 1,
        feature_mean=train_x.mean(axis=0),
        feature_variance=train_x.var(axis=0),
    )


@dataclasses.dataclass(frozen=True)
class TabularOptions:
    hidden_units: int = option(32, "units of each hidden layer", at_least=1)
    hidden_layers: int = option(2, "hidden layers", at_least=0)
    weight_decay: float = option(0.0, "AdamW's decoupled weight decay (0 = Adam)", at_least=0)


@register("tabular")
class Tabular(Task):
    """An MLP over standardized columns; cross-entropy, accuracy."""

    Options = TabularOptions
    metric_names = ("accuracy",)

    def describe(self) -> str:
        return f"a {self.options.hidden_layers}x{self.options.hidden_units} MLP over tabular rows"

    def optimizer(self, learning_rate: Any) -> keras.optimizers.Optimizer:
        if self.options.weight_decay:
            return keras.optimizers.AdamW(learning_rate=learning_rate, weight_decay=self.options.weight_decay)
        return super().optimizer(learning_rate)

    def build_model(self, source: datasets.Source) -> keras.Model:
        if not isinstance(source, TabularSource) or source.num_classes < 2:
            raise DataError("task tabular needs --dataset csv (this file's) with 2 or more classes")
        features = keras.Input(shape=source.element_spec[0].shape, name="features")
        x = keras.layers.Normalization(mean=source.feature_mean, variance=source.feature_variance)(features)
        for _ in range(self.options.hidden_layers):
            x = keras.layers.Dense(self.options.hidden_units, activation="relu")(x)
        logits = keras.layers.Dense(source.num_classes, dtype="float32")(x)  # float32 under a mixed --precision
        return keras.Model(features, logits, name="tabular")

    def loss(self, targets: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
        return keras.losses.sparse_categorical_crossentropy(targets, logits, from_logits=True)

    def metrics(self, targets: tf.Tensor, logits: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"accuracy": keras.metrics.sparse_categorical_accuracy(targets, logits)}

    def serving_signature(self, model: keras.Model) -> list[Any]:
        return [tf.TensorSpec((None, *model.inputs[0].shape[1:]), tf.float32, name="features")]

    def serve(self, model: keras.Model, features: tf.Tensor) -> dict[str, tf.Tensor]:
        probabilities = tf.nn.softmax(tf.cast(model(features, training=False), tf.float32))
        return {"probabilities": probabilities, "class_id": tf.argmax(probabilities, axis=-1)}
