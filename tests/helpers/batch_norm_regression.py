"""examples/regression.py's task with a BatchNormalization layer, whose moving statistics a forward pass in training
mode updates: `--task-module batch_norm_regression --task batch_norm_regression`. With poisoned_rows and
`--on-nonfinite skip`, a skipped step must leave no NaN in them."""

from __future__ import annotations

import keras

from examples.regression import Regression
from trainer.task import register


@register("batch_norm_regression")
class BatchNormRegression(Regression):
    def build_model(self, source):
        features_spec, _ = source.element_spec
        features = keras.Input(shape=features_spec.shape, name="features")
        x = keras.layers.BatchNormalization()(features)
        x = keras.layers.Dense(self.options.hidden_units, activation="relu")(x)
        prediction = keras.layers.Dense(1, dtype="float32")(x)
        return keras.Model(features, keras.layers.Reshape(())(prediction), name="batch_norm_regression")
