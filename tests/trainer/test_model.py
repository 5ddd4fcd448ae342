"""The default task's models: every variant builds and maps raw uint8 images to float32 class logits (test_train.py
trains each)."""

import numpy as np
import pytest

from trainer.base.errors import ConfigError, DataError
from trainer.context import parse_config
from trainer.data.datasets import Source, image_spec
from trainer.task import task_of
from trainer.tasks.image_classification import MODELS


def build(name, shape, classes=10, *flags):
    task = task_of(parse_config(["--model", name, *flags], {}))
    return task.build_model(Source(train=None, test=None, element_spec=image_spec(shape), num_classes=classes))


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("shape", [(28, 28, 1), (32, 32, 3)])
def test_every_variant_maps_raw_images_to_class_logits(name, shape):
    network = build(name, shape)
    assert network.inputs[0].dtype == "uint8"
    logits = network.predict(np.zeros((3, *shape), np.uint8), verbose=0)
    assert logits.shape == (3, 10)


def test_each_variant_behaves_as_its_name_says():
    images = np.random.default_rng(0).integers(0, 256, (16, 28, 28, 1), dtype=np.uint8)
    cnn, dropout, batch_norm = (build(name, (28, 28, 1)) for name in ("cnn", "dropout", "batch_norm"))
    # cnn: training and serving compute the same logits.
    assert np.allclose(cnn(images, training=True), cnn(images, training=False))
    # dropout: each training call drops other units; serving is deterministic.
    assert not np.allclose(dropout(images, training=True), dropout(images, training=True))
    assert np.allclose(dropout(images, training=False), dropout(images, training=False))

    # batch_norm: a training call moves the moving statistics that serving uses; a serving call leaves them.
    def statistics():
        return np.concatenate([variable.numpy().ravel() for variable in batch_norm.non_trainable_variables])

    before = statistics()
    batch_norm(images, training=False)
    assert np.array_equal(statistics(), before)
    batch_norm(images, training=True)
    assert not np.array_equal(statistics(), before)


def test_the_models_hyperparameters_are_the_tasks_options():
    network = build("dropout", (28, 28, 1), 10, "--dense-units", "32", "--dense-dropout", "0")
    assert [layer.units for layer in network.layers if type(layer).__name__ == "Dense"] == [32, 10]
    assert [layer.rate for layer in network.layers if type(layer).__name__ == "Dropout"] == [0.25, 0.25]


def test_unknown_model_names_the_choices():
    with pytest.raises(ConfigError, match="unknown model 'resnet'; choose one of batch_norm, cnn, dropout"):
        parse_config(["--model", "resnet"], {})


def test_the_image_classifier_refuses_a_dataset_without_classes():
    # A Source says whether its targets are classes (num_classes 0: a regression's); the default task needs them.
    with pytest.raises(DataError, match="needs a dataset of class ids"):
        build("cnn", (28, 28, 1), 0)
