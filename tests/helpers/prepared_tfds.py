"""A prepared copy of TFDS's fashion_mnist (the default --dataset) written without a download: nothing can be
downloaded here. TFDS's own FashionMNIST builder writes it, reading MNIST-format files made here instead of the
downloaded ones, so the directory is what `python -m trainer.data` leaves on a volume and the trainer reads it through
TFDS as it reads the real one. The images are learnable: class k is a bright band at rows 2k to 2k+4, plus noise.

Usage: python tests/helpers/prepared_tfds.py DATA_DIR [TRAIN_EXAMPLES TEST_EXAMPLES]
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

NAME, VERSION = "fashion_mnist", "3.0.1"
SIDE, CLASSES = 28, 10


def images_and_labels(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, size=count, dtype=np.uint8)
    images = rng.integers(0, 64, size=(count, SIDE, SIDE), dtype=np.uint8)
    for image, label in zip(images, labels, strict=True):
        image[2 * label : 2 * label + 4, :] = 255
    return images, labels


def write_mnist_files(directory: pathlib.Path, split: str, count: int, seed: int) -> tuple[str, str]:
    """The two uncompressed MNIST-format files (idx3 images, idx1 labels) TFDS's builder reads for a split."""
    images, labels = images_and_labels(count, seed)
    image_path, label_path = directory / f"{split}-images-idx3-ubyte", directory / f"{split}-labels-idx1-ubyte"
    image_path.write_bytes(bytes(16) + images.tobytes())  # the builder skips the 16-byte header
    label_path.write_bytes(bytes(8) + labels.tobytes())
    return str(image_path), str(label_path)


def prepare(data_dir: pathlib.Path, train_examples: int = 2048, test_examples: int = 512) -> pathlib.Path:
    """Writes DATA_DIR/fashion_mnist/3.0.1 as a finished TFDS preparation; returns that directory."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.image_classification.mnist import FashionMNIST

    sources = data_dir / "downloads" / "made-here"
    sources.mkdir(parents=True, exist_ok=True)
    files = {
        "train": (*write_mnist_files(sources, "train", train_examples, seed=1), train_examples),
        "test": (*write_mnist_files(sources, "test", test_examples, seed=2), test_examples),
    }

    class MadeHere(FashionMNIST, skip_registration=True):  # type: ignore[misc, valid-type]
        name = NAME

        def _split_generators(self, dl_manager):
            return [
                tfds.core.SplitGenerator(
                    name=split, gen_kwargs={"num_examples": count, "data_path": images, "label_path": labels}
                )
                for split, (images, labels, count) in files.items()
            ]

    MadeHere(data_dir=str(data_dir)).download_and_prepare()
    return data_dir / NAME / VERSION


def prepare_in_a_process(data_dir: pathlib.Path, *counts: int) -> None:
    """prepare() in a process of its own, so TFDS and TensorFlow stay out of the caller's; fails with its stderr."""
    made = subprocess.run(
        [sys.executable, __file__, str(data_dir), *map(str, counts)], capture_output=True, text=True, timeout=300
    )
    assert made.returncode == 0, made.stderr[-3000:]


if __name__ == "__main__":
    counts = [int(value) for value in sys.argv[2:4]]
    print(prepare(pathlib.Path(sys.argv[1]), *counts))
