"""--dataset image_folder as a user meets it: class folders of image files in, class names out.

The shards are checked as test_sharding.py checks TFRecord files (each worker's images disjoint, together the split,
a resume exact), the layout as a user writes it (formats mixed, a held-out share when there is no test/), and a real
run: 2 workers train on the folder, metrics.json and the export name the classes, and the export's image-file
signature answers a PNG and a JPEG as the pixel signature answers the decoded pixels."""

from __future__ import annotations

import hashlib
import json
import pathlib

import numpy as np
import pytest
import tensorflow as tf

import image_folders
import multiworker
from trainer.data import image_folder, images, pipeline

BATCH, EPOCHS, SEED, SHAPE = 4, 2, 5, (28, 28, 3)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """3 classes x 13 training images in four formats, and a test/ split."""
    root = tmp_path_factory.mktemp("images")
    return image_folders.write(root, per_class=13, test_per_class=3, extensions=(".png", ".jpg", ".gif", ".bmp"))


def digest(image: np.ndarray) -> str:
    return hashlib.sha256(image.tobytes()).hexdigest()[:16]


def epochs_seen(split, workers, start_step=0):
    """Each worker's images (by digest) and labels per epoch: [epoch][worker] -> [(digest, label)]."""
    shards = [split.shard(rank, workers) for rank in range(workers)]
    steps = pipeline.steps_per_epoch([shard.size for shard in shards], BATCH)
    seen = []
    for rank, shard in enumerate(shards):
        batches = pipeline.train_batches(shard, rank, BATCH, steps * BATCH, SEED, EPOCHS, start_step, steps, 10, "none")
        seen.append(
            [
                (digest(image), int(label))
                for pictures, labels in batches
                for image, label in zip(pictures.numpy(), labels.numpy(), strict=True)
            ]
        )
    return seen, steps


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_each_worker_reads_its_own_files_and_together_they_are_the_split(folder, workers):
    listing = image_folder.list_folder(str(folder), 0.1, SEED)
    split = image_folder.ImageFiles(listing.train, SHAPE)
    per_worker = [[path for path, _ in split.files[rank::workers]] for rank in range(workers)]
    assert sorted(sum(per_worker, [])) == sorted(path for path, _ in listing.train)  # by file: disjoint, covering
    seen, steps = epochs_seen(split, workers)
    everything = {digest(images.decoded(tf.io.read_file(path), SHAPE).numpy()) for path, _ in listing.train}
    for epoch in range(EPOCHS):
        union = [item for ids in seen for item in ids[epoch * steps * BATCH : (epoch + 1) * steps * BATCH]]
        assert len(union) == len(set(union)) == workers * steps * BATCH
        assert {image for image, _ in union} <= everything
    assert seen[0][: steps * BATCH] != seen[0][steps * BATCH :]  # a new order each epoch


@pytest.mark.parametrize("start_step", [1, 3, 8])
def test_resuming_at_any_step_reads_what_an_uninterrupted_run_reads(folder, start_step):
    split = image_folder.ImageFiles(image_folder.list_folder(str(folder), 0.1, SEED).train, SHAPE)
    whole, _ = epochs_seen(split, 2)
    resumed, _ = epochs_seen(split, 2, start_step)
    assert resumed == [ids[start_step * BATCH :] for ids in whole]


def test_classes_are_the_sorted_train_folders_and_test_folders_map_by_name(tmp_path):
    root = image_folders.write(tmp_path, per_class=2, test_per_class=0, classes=("zebra", "ant", "moth"))
    image_folders.write(tmp_path / "test-only", per_class=0, test_per_class=2, classes=("moth",))
    (tmp_path / "test-only" / "test").rename(root / "test")
    listing = image_folder.list_folder(str(root), 0.1, SEED)
    assert listing.class_names == ("ant", "moth", "zebra")
    assert {label for _, label in listing.test} == {1} and listing.test_from == "test/"
    assert {(pathlib.Path(path).parent.name, label) for path, label in listing.train} == {
        ("ant", 0),
        ("moth", 1),
        ("zebra", 2),
    }


def test_without_test_folder_a_seeded_share_of_each_class_is_held_out(tmp_path):
    root = image_folders.write(tmp_path, per_class=10, test_per_class=0)
    first = image_folder.list_folder(str(root), 0.2, SEED)
    assert first == image_folder.list_folder(str(root), 0.2, SEED)
    assert first != image_folder.list_folder(str(root), 0.2, SEED + 1)
    assert not {path for path, _ in first.train} & {path for path, _ in first.test}
    assert sorted(label for _, label in first.test) == [0, 0, 1, 1, 2, 2] and len(first.train) == 24


def test_every_format_decodes_to_the_asked_shape_gray_or_rgb(folder):
    for path in sorted(folder.glob("train/star/*")):  # png, jpg, gif, bmp
        encoded = tf.io.read_file(str(path))
        assert images.decoded(encoded, (28, 28, 3)).shape == (28, 28, 3)
        gray = images.decoded(encoded, (14, 20, 1))
        assert gray.shape == (14, 20, 1) and gray.dtype == tf.uint8


def run_two_workers(folder, model_dir, *flags):
    args = multiworker.trainer_flags(epochs=2, per_worker_batch_size=4, model_dir=model_dir)
    return multiworker.run_group(2, [*args, "--dataset", "image_folder", "--image-dir", str(folder), *flags])


def test_two_workers_train_on_the_folder_and_the_model_answers_files_with_class_names(folder, tmp_path):
    finished = run_two_workers(folder, tmp_path / "model")
    assert all(done.returncode == 0 for done in finished.values()), {n: d.output[-2000:] for n, d in finished.items()}
    metrics = json.loads((tmp_path / "model" / "metrics.json").read_text())
    assert metrics["class_names"] == ["circle", "square", "star"] and metrics["export_check"]["passed"]
    served = tf.saved_model.load(str(max((tmp_path / "model" / "serving").iterdir(), key=lambda p: int(p.name))))
    assert served.signatures["class_names"]()["class_names"].numpy().tolist() == [b"circle", b"square", b"star"]
    files = [path for path in sorted(folder.glob("test/*/*")) if path.suffix in (".png", ".jpg")]
    by_file = served.signatures["serve_image_bytes"](image_bytes=tf.constant([path.read_bytes() for path in files]))
    pixels = tf.stack([images.decoded(tf.io.read_file(str(path)), SHAPE) for path in files])
    by_pixels = served.signatures["serve"](images=pixels)
    assert by_file["class_id"].numpy().tolist() == by_pixels["class_id"].numpy().tolist()
    assert np.allclose(by_file["probabilities"], by_pixels["probabilities"], atol=1e-6)
    names = ["circle", "square", "star"]
    assert [name.decode() for name in by_file["class_name"].numpy()] == [names[i] for i in by_file["class_id"].numpy()]
    with pytest.raises(tf.errors.InvalidArgumentError) as refused:
        served.signatures["serve_image_bytes"](image_bytes=tf.constant([b"a text file, not a picture"]))
    assert "element 0 of input" in str(refused.value) and "is not a PNG, JPEG, GIF or BMP file" in str(refused.value)
