"""The model registry: every variant builds, takes raw uint8 images, and trains under a mirrored strategy."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from multiworker import ROOT
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
    assert kinds == ["InputLayer", "Rescaling", "Conv2D", "MaxPooling2D", "Conv2D", "MaxPooling2D", "Conv2D",
                     "Flatten", "Dense", "Dense"]


def test_unknown_model_names_the_choices():
    with pytest.raises(ConfigError, match="unknown model 'resnet'; choose one of batch_norm, cnn, dropout"):
        model.build_model("resnet", (28, 28, 1), 10)


def test_variants_train_with_variables_mirrored_across_two_replicas(tmp_path):
    # Two logical CPUs give two replicas in one process: dropout and batch norm update state in replica context.
    script = textwrap.dedent(f"""
        import tensorflow as tf
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        from trainer.cluster import SINGLE_PROCESS
        from trainer.config import parse_config
        from trainer.train import train_and_evaluate
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        assert strategy.num_replicas_in_sync == 2
        for name in ("cnn", "dropout", "batch_norm"):
            config = parse_config(["--dataset", "synthetic", "--model", name, "--epochs", "1",
                                   "--train-examples", "512", "--test-examples", "128",
                                   "--model-dir", r"{tmp_path}/" + name], {{}})
            metrics = train_and_evaluate(config, SINGLE_PROCESS, strategy, 0.0)
            print(name, "accuracy", metrics["test_accuracy"])
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    for name in ("cnn", "dropout", "batch_norm"):
        assert f"{name} accuracy" in result.stdout
        assert (tmp_path / name / "model.keras").exists()
