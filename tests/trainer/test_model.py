"""The model registry: every variant builds and maps raw uint8 images to logits (test_train.py trains each)."""

import numpy as np
import pytest

from trainer import model
from trainer.errors import ConfigError


@pytest.mark.parametrize("name", sorted(model.MODELS))
@pytest.mark.parametrize("shape", [(28, 28, 1), (32, 32, 3)])
def test_every_variant_maps_raw_images_to_class_logits(name, shape):
    network = model.build_model(name, shape, 10)
    assert network.inputs[0].dtype == "uint8"
    logits = network.predict(np.zeros((3, *shape), np.uint8), verbose=0)
    assert logits.shape == (3, 10)


def test_the_book_cnn_has_the_book_layers():
    kinds = [type(layer).__name__ for layer in model.build_model("cnn", (28, 28, 1), 10).layers]
    assert kinds == [
        "InputLayer",
        "Rescaling",
        "Conv2D",
        "MaxPooling2D",
        "Conv2D",
        "MaxPooling2D",
        "Conv2D",
        "Flatten",
        "Dense",
        "Dense",
    ]


def test_unknown_model_names_the_choices():
    with pytest.raises(ConfigError, match="unknown model 'resnet'; choose one of batch_norm, cnn, dropout"):
        model.build_model("resnet", (28, 28, 1), 10)
