"""The default task: image classification with the book's CNN family (cnn, dropout, batch_norm).

A batch is (uint8 images HxWxC, int64 labels): the dataset's element_spec gives the image shape, its num_classes
the classes. Every model takes raw uint8 images and scales them itself, so the saved model accepts exactly what the
dataset holds; models output logits (float32 under every --precision), and the serving signature adds the softmax,
the class id and the class's name (the dataset's names, else the id). The export also takes image files
(`serve_image_bytes`: PNG, JPEG, GIF or BMP bytes, decoded and resized by the same ops as the input pipeline,
trainer/data/images.py) and lists the classes (`class_names`).

It imports only trainer.api, as a fork's task does: it is the model a fork copies (docs/fork.md). To add a model,
copy it into modules/ under a task name of yours, write a function (input_shape, num_classes, options) ->
keras.Model there and decorate it with @model("name"); its hyperparameters are the task's Options. trainer/ itself
is updated from upstream, never edited (docs/design.md).

Keras and TensorFlow are imported where they are used, not at the top: the flags are parsed (and a bad one refused)
with this module imported, and that stays a fraction of a second. Your own task module may import them at the top;
its runs then pay a TensorFlow import while their flags are read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from trainer.api import ConfigError, DataError, Objective, Registry, Task, option, register

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from trainer.api import datasets

ModelBuilder = Callable[[tuple[int, ...], int, Any], Any]  # -> keras.Model
MODELS: Registry[ModelBuilder] = Registry()
model = MODELS.register


@dataclasses.dataclass(frozen=True)
class ImageClassificationOptions:
    model: str = option("cnn", "the model, one of this task's MODELS (cnn, dropout, batch_norm)")
    dense_units: int = option(64, "units of the dense layer before the classifier", at_least=1)
    conv_dropout: float = option(0.25, "dropout after each pooling (model dropout)", at_least=0, below=1)
    dense_dropout: float = option(0.5, "dropout before the classifier (model dropout)", at_least=0, below=1)


@register("image_classification")
class ImageClassification(Task):
    """Softmax cross-entropy over integer classes; reports accuracy."""

    Options = ImageClassificationOptions
    metric_names = ("accuracy",)
    objective = Objective("accuracy", higher_is_better=True)

    @classmethod
    def check_options(cls, options: ImageClassificationOptions) -> None:
        if options.model not in MODELS:
            raise ConfigError(
                f"--model: unknown model {options.model!r}; choose one of {', '.join(sorted(MODELS))} "
                f"or add one to your copy of this task (docs/fork.md)"
            )

    def __init__(self, options: ImageClassificationOptions) -> None:
        super().__init__(options)
        import keras

        self._cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction=None)
        # The dataset's class names in id order, kept by build_model for the export (empty: the ids, in words).
        self.class_names: tuple[str, ...] = ()

    def describe(self) -> str:
        return str(self.options.model)

    def build_model(self, source: datasets.Source) -> keras.Model:
        images, _ = source.element_spec
        if source.num_classes < 2:
            raise DataError(
                f"task image_classification needs a dataset of class ids (2 or more classes); this one has "
                f"{source.num_classes}: pick another --task, or give its classes (--num-classes for tfrecord)"
            )
        self.class_names = source.names_of_classes
        shape = tuple(images.shape)
        try:
            return MODELS[self.options.model](shape, source.num_classes, self.options)
        except ValueError as error:  # Keras's words for a layer the image is too small for
            raise DataError(
                f"model {self.options.model} cannot take {'x'.join(map(str, shape))} images "
                f"({str(error).splitlines()[0][:200]}): give a larger --image-shape (e.g. 32x32x{shape[-1]}) "
                f"or another --model"
            ) from None

    def loss(self, labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
        return self._cross_entropy(labels, logits)

    def metrics(self, labels: tf.Tensor, logits: tf.Tensor) -> dict[str, tf.Tensor]:
        import keras

        return {"accuracy": keras.metrics.sparse_categorical_accuracy(labels, logits)}

    def serving_signature(self, model: keras.Model) -> list[Any]:
        import tensorflow as tf

        return [tf.TensorSpec((None, *model.inputs[0].shape[1:]), tf.uint8, name="images")]

    def serve(self, model: keras.Model, images: tf.Tensor) -> dict[str, tf.Tensor]:
        import tensorflow as tf

        probabilities = tf.nn.softmax(tf.cast(model(images, training=False), tf.float32))
        return self._answer(model, probabilities)

    def serving_endpoints(self, model: keras.Model) -> dict[str, tuple[Callable[..., Any], list[Any]]]:
        import tensorflow as tf

        from trainer.api import images as image_files

        shape = tuple(model.inputs[0].shape[1:])

        def from_files(image_bytes: tf.Tensor) -> dict[str, tf.Tensor]:
            with tf.control_dependencies([image_files.assert_image_files(image_bytes, "image_bytes")]):
                with tf.control_dependencies([image_files.assert_sizes(image_bytes, "image_bytes")]):
                    image_bytes = tf.identity(image_bytes)
            decoded = tf.map_fn(
                lambda encoded: image_files.decoded(encoded, shape),
                image_bytes,
                fn_output_signature=tf.TensorSpec(shape, tf.uint8),
            )
            return self.serve(model, decoded)

        return {
            "serve_image_bytes": (from_files, [tf.TensorSpec((None,), tf.string, name="image_bytes")]),
            "class_names": (lambda: {"class_names": tf.constant(self._names(model))}, []),
        }

    def serving_reference(self, model: keras.Model, images: tf.Tensor) -> dict[str, tf.Tensor]:
        import tensorflow as tf

        # From the model called as evaluation calls it, not through serve(): a skew in serve() shows.
        probabilities = tf.nn.softmax(tf.cast(model(images, training=False), tf.float32))
        return self._answer(model, probabilities)

    def _answer(self, model: keras.Model, probabilities: tf.Tensor) -> dict[str, tf.Tensor]:
        import tensorflow as tf

        class_id = tf.argmax(probabilities, axis=-1)
        class_name = tf.gather(tf.constant(self._names(model)), class_id)
        return {"probabilities": probabilities, "class_id": class_id, "class_name": class_name}

    def _names(self, model: keras.Model) -> tuple[str, ...]:
        return self.class_names or tuple(str(class_id) for class_id in range(model.outputs[0].shape[-1]))


def _scaled_input(input_shape: tuple[int, ...]) -> tuple[keras.KerasTensor, keras.KerasTensor]:
    import keras

    images = keras.Input(shape=input_shape, dtype="uint8", name="images")
    return images, keras.layers.Rescaling(1.0 / 255, name="scale")(images)


def _head(
    x: keras.KerasTensor, num_classes: int, options: ImageClassificationOptions, dropout: float = 0.0
) -> keras.KerasTensor:
    from keras import layers

    x = layers.Flatten()(x)
    x = layers.Dense(options.dense_units, activation="relu")(x)
    if dropout:
        x = layers.Dropout(dropout)(x)
    # float32 under a mixed --precision too: the softmax and the loss need the range.
    return layers.Dense(num_classes, name="logits", dtype="float32")(x)


@model("cnn")
def cnn(input_shape: tuple[int, ...], num_classes: int, options: ImageClassificationOptions) -> keras.Model:
    """The book's CNN: Conv32-Pool-Conv64-Pool-Conv64-Flatten-Dense64-Dense10."""
    import keras
    from keras import layers

    images, x = _scaled_input(input_shape)
    x = layers.Conv2D(32, 3, activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(64, 3, activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Conv2D(64, 3, activation="relu")(x)
    return keras.Model(images, _head(x, num_classes, options), name="cnn")


@model("dropout")
def cnn_dropout(input_shape: tuple[int, ...], num_classes: int, options: ImageClassificationOptions) -> keras.Model:
    """The book's CNN with dropout after each pooling and before the classifier."""
    import keras
    from keras import layers

    images, x = _scaled_input(input_shape)
    x = layers.Conv2D(32, 3, activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Dropout(options.conv_dropout)(x)
    x = layers.Conv2D(64, 3, activation="relu")(x)
    x = layers.MaxPooling2D()(x)
    x = layers.Dropout(options.conv_dropout)(x)
    x = layers.Conv2D(64, 3, activation="relu")(x)
    return keras.Model(images, _head(x, num_classes, options, dropout=options.dense_dropout), name="dropout")


@model("batch_norm")
def cnn_batch_norm(input_shape: tuple[int, ...], num_classes: int, options: ImageClassificationOptions) -> keras.Model:
    """The book's CNN with batch normalization after each convolution."""
    import keras
    from keras import layers

    images, x = _scaled_input(input_shape)
    for filters, pool in ((32, True), (64, True), (64, False)):
        x = layers.Conv2D(filters, 3, use_bias=False)(x)
        # Synchronized: statistics over the global batch, so every worker keeps the same moving averages.
        x = layers.BatchNormalization(synchronized=True)(x)
        x = layers.Activation("relu")(x)
        if pool:
            x = layers.MaxPooling2D()(x)
    return keras.Model(images, _head(x, num_classes, options), name="batch_norm")
