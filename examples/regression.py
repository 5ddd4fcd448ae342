"""A fork's task in one file: regression on generated features (mean squared error, reports mean absolute error).

Nothing under trainer/ changes, nor the Dockerfile: copy it into modules/, the folder for the project's own
modules (importable from the project root, and in the image, which ships modules/ on PYTHONPATH):

    cp examples/regression.py modules/
    python -m trainer --module modules.regression --epochs 3

It registers two things, each the only one of its kind here, so --module alone picks both: the dataset
`linear_features` (examples generated in the graph from --seed, so any number of workers reads disjoint parts and
nothing is downloaded) and the task `regression` (its model, loss, metric and serving signature). docs/fork.md walks
through it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.api import Config, Objective, Task, datasets, option, register

FEATURES = 8


def linear_features_example(seed: int) -> Any:
    """Example i as a pure function of (seed, i): FEATURES floats in [-1, 1) and a target that is a fixed linear
    function of them plus a bend and a little noise."""
    weights = tf.constant(np.random.default_rng(seed).normal(size=FEATURES), tf.float32)

    def example(index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        key = tf.stack([tf.constant(seed, tf.int64), tf.cast(index, tf.int64)])
        features = tf.random.stateless_uniform((FEATURES,), key, minval=-1.0, maxval=1.0)
        noise = 0.05 * tf.random.stateless_normal((), key + [0, 1 << 60])
        target = tf.tensordot(features, weights, 1) + 0.5 * tf.sin(3.0 * features[0]) + noise
        return features, target

    return example


@datasets.register("linear_features")
def linear_features(config: Config) -> datasets.Source:
    example = linear_features_example(config.seed)
    return datasets.Source(
        train=datasets.Generated(example, config.train_examples or 8192),
        test=datasets.Generated(example, config.test_examples or 1024, datasets.TEST_INDEX_OFFSET),
        # One example: FEATURES floats and one float target (no num_classes: a regression has no classes).
        element_spec=(tf.TensorSpec((FEATURES,), tf.float32), tf.TensorSpec((), tf.float32)),
    )


@dataclasses.dataclass(frozen=True)
class RegressionOptions:
    hidden_units: int = option(32, "units of each hidden layer", at_least=1)
    hidden_layers: int = option(2, "hidden layers", at_least=0)


@register("regression")
class Regression(Task):
    """A small MLP from the features to one number."""

    Options = RegressionOptions
    metric_names = ("mae",)
    objective = Objective("loss", higher_is_better=False)  # model selection keeps the lowest test loss

    def describe(self) -> str:
        return f"a {self.options.hidden_layers}x{self.options.hidden_units} MLP regression"

    def build_model(self, source: datasets.Source) -> keras.Model:
        features_spec, _ = source.element_spec
        features = keras.Input(shape=features_spec.shape, name="features")
        x = features
        for _ in range(self.options.hidden_layers):
            x = keras.layers.Dense(self.options.hidden_units, activation="relu")(x)
        prediction = keras.layers.Dense(1, dtype="float32")(x)  # float32 under a mixed --precision too
        return keras.Model(features, keras.layers.Reshape(())(prediction), name="regression")

    def loss(self, targets: tf.Tensor, predictions: tf.Tensor) -> tf.Tensor:
        return tf.square(predictions - tf.cast(targets, predictions.dtype))

    def metrics(self, targets: tf.Tensor, predictions: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"mae": tf.abs(predictions - tf.cast(targets, predictions.dtype))}

    def serving_signature(self, model: keras.Model) -> list[Any]:
        return [tf.TensorSpec((None, FEATURES), tf.float32, name="features")]

    def serve(self, model: keras.Model, features: tf.Tensor) -> dict[str, tf.Tensor]:
        return {"prediction": tf.cast(model(features, training=False), tf.float32)}
