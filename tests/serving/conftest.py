"""Tiny models trained once per session by the real trainer, and a classifier's SavedModel built directly, for the
serving tests."""

from __future__ import annotations

import pytest

from classes_model import save_classes_model
from model_server import IMAGE_DATA, REGRESSION, REGRESSION_DATA, add_export_check, train


@pytest.fixture(scope="session")
def image_model(tmp_path_factory):
    """The default task (uint8 images in; probabilities and class_id out), trained on synthetic data."""
    model_dir = train(tmp_path_factory.mktemp("image") / "model", *IMAGE_DATA)
    add_export_check(model_dir)
    return model_dir


@pytest.fixture(scope="session")
def regression_models(tmp_path_factory):
    """Two variants of examples/regression.py (one float input, one float output), as a pipeline trains them."""
    root = tmp_path_factory.mktemp("regression")
    models = []
    for units in (4, 16):
        model_dir = train(root / f"units-{units}", *REGRESSION, *REGRESSION_DATA, "--hidden-units", str(units))
        add_export_check(model_dir)
        models.append(model_dir)
    return models


@pytest.fixture(scope="session")
def classes_model(tmp_path_factory):
    """A SavedModel with a classifier's signatures (serve, serve_image_bytes, class_names), built in a few seconds."""
    return save_classes_model(tmp_path_factory.mktemp("classes") / "saved_model")
