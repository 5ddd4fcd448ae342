"""The CNN family, chosen by name from MODELS.

Every model takes raw uint8 images and scales them itself, so the saved model
and its serving signature accept exactly what the dataset holds. Models output
logits; the serving signature adds the softmax.

To add a model: write a function (input_shape, num_classes) -> keras.Model
below and decorate it with @register("name"). Nothing else changes.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
from keras import layers

from trainer.config import Registry
from trainer.errors import ConfigError

ModelBuilder = Callable[[tuple[int, ...], int], keras.Model]
MODELS: Registry[ModelBuilder] = Registry()
register = MODELS.register


def _scaled_input(input_shape: tuple[int, ...]) -> tuple[keras.KerasTensor, keras.KerasTensor]:
    images = keras.Input(shape=input_shape, dtype="uint8", name="images")
    return images, layers.Rescaling(1.0 / 255, name="scale")(images)


def _head(x: keras.KerasTensor, num_classes: int, dropout: float = 0.0) -> keras.KerasTensor:
    x = layers.Flatten()(x)
    x = layers.Dense(64, activation="relu")(x)
    if dropout:
        x = layers.Dropout(dropout)(x)
    return layers.Dense(num_classes, name="logits")(x)


@register("cnn")
def cnn(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """The book's CNN: Conv32-Pool-Conv64-Pool-Conv64-Flatten-Dense64-Dense10."""
    images, x = _scaled_input(input_shape)
    x = layers.Conv2D(32, 3, activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(64, 3, activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(64, 3, activation="relu")(x)
    return keras.Model(images, _head(x, num_classes), name="cnn")


@register("dropout")
def cnn_dropout(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """The book's CNN with dropout after each pooling and before the classifier."""
    images, x = _scaled_input(input_shape)
    x = layers.Conv2D(32, 3, activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Dropout(0.25)(x)
    x = layers.Conv2D(64, 3, activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Dropout(0.25)(x)
    x = layers.Conv2D(64, 3, activation="relu")(x)
    return keras.Model(images, _head(x, num_classes, dropout=0.5), name="dropout")


@register("batch_norm")
def cnn_batch_norm(input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """The book's CNN with batch normalization after each convolution."""
    images, x = _scaled_input(input_shape)
    for filters, pool in ((32, True), (64, True), (64, False)):
        x = layers.Conv2D(filters, 3, use_bias=False)(x)
        # Synchronized: statistics over the global batch, so every worker keeps the same moving averages.
        x = layers.BatchNormalization(synchronized=True)(x)
        x = layers.Activation("relu")(x)
        if pool:
            x = layers.MaxPooling2D()(x)
    return keras.Model(images, _head(x, num_classes), name="batch_norm")


def check_model_name(name: str) -> None:
    if name not in MODELS:
        raise ConfigError(
            f"--model: unknown model {name!r}; choose one of {', '.join(sorted(MODELS))} "
            f"or register a new one in trainer/model.py"
        )


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> keras.Model:
    """Builds a registered model; call it inside strategy.scope() so its variables are mirrored."""
    check_model_name(name)
    return MODELS[name](input_shape, num_classes)


def build_optimizer(learning_rate: float) -> keras.optimizers.Optimizer:
    return keras.optimizers.Adam(learning_rate=learning_rate)
