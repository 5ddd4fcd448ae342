"""--dataset image_folder as a user meets it: class folders of image files in, class names out.

The shards are checked as test_sharding.py checks TFRecord files (each worker's images disjoint, together the split,
a resume exact), the layout as a user writes it (formats mixed, a held-out share when there is no test/), and a real
run: 2 workers train on the folder, metrics.json and the export name the classes, and the export's image-file
signature answers a PNG and a JPEG as the pixel signature answers the decoded pixels."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil

import numpy as np
import pytest
import tensorflow as tf

import image_folders
import multiworker
from trainer.base.errors import DataError
from trainer.data import image_folder, image_headers, images, pipeline

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


@pytest.mark.slow  # a group of two trained to its export: make test-slow
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
    # A 60-kilobyte PNG of 54 megapixels, refused from its header: decoded, it took gigabytes of the server's memory.
    bomb = image_folders.encoded(np.zeros((9000, 6000, 1), np.uint8))
    with pytest.raises(tf.errors.InvalidArgumentError) as refused:
        served.signatures["serve_image_bytes"](image_bytes=tf.constant([files[0].read_bytes(), bomb]))
    said = str(refused.value)
    assert "element 1 of input" in said and "holds 54000000 pixels, more than this model decodes" in said


@pytest.mark.parametrize("extension", [".png", ".jpg", ".gif", ".bmp"])
def test_a_files_pixels_are_read_from_its_header(extension):
    encoded = image_folders.encoded(np.zeros((30, 40, 3), np.uint8), extension)
    assert int(images._header_pixels(tf.constant(encoded))) == 1200


# ---- what a user's real folder holds (each refused before with a traceback, a silent result or a false fix) ----


def default_shape_of(root: pathlib.Path) -> tuple[tuple[int, int, int], str]:
    return image_folder.default_shape(image_folder.list_folder(str(root), 0.1, SEED).train)


def test_images_of_varied_sizes_are_read_at_their_median_height_and_width_not_the_first_ones(tmp_path):
    # Before: the first file's size (here 40x52, the smallest), whatever the others were.
    sizes = [(40, 52), (90, 81), (160, 160), (100, 96), (120, 90), (96, 120), (60, 150)]
    root = image_folders.write(tmp_path, per_class=7, test_per_class=1, sizes=sizes, extensions=(".png", ".jpg"))
    shape, why = default_shape_of(root)
    assert shape == (96, 96, 3), shape  # each the median of its side over the 21 training images
    assert why == (
        "sizes vary from 40x52 to 160x160; this is their median height and median width (set --image-shape to choose)"
    )


def test_one_size_is_kept_as_it_is(tmp_path):
    assert default_shape_of(image_folders.write(tmp_path, per_class=3, test_per_class=1, size=30)) == (
        (30, 30, 3),
        "the images' size (set --image-shape to choose)",
    )


def test_the_default_keeps_every_images_colour_and_transparency(tmp_path):
    root = image_folders.write(tmp_path, per_class=3, test_per_class=1)
    gray = image_folders.encoded(image_folders.picture(0, 0, channels=1))  # before, a gray first image made all gray
    (root / "train" / "circle" / "0000.png").write_bytes(gray)
    shape, why = default_shape_of(root)
    assert shape == (28, 28, 3) and why.endswith(
        "with 3 channels, so no image loses its colour or transparency (set --image-shape to choose)"
    )
    (root / "train" / "star" / "0000.png").write_bytes(image_folders.encoded(image_folders.picture(2, 0, channels=4)))
    assert default_shape_of(root)[0] == (28, 28, 4)


def test_a_default_larger_than_a_models_input_is_scaled_down_keeping_its_aspect(tmp_path):
    # Before: refused when the first image was larger, and every other size ignored.
    root = image_folders.write(tmp_path, per_class=2, test_per_class=1, sizes=[(600, 800)])
    shape, why = default_shape_of(root)
    assert shape == (384, 512, 3)
    assert why == "the images' size, 600x800, scaled down to 512 on the longer side (set --image-shape to choose)"


def test_a_file_without_an_image_header_does_not_count_towards_the_default(tmp_path):
    root = image_folders.write(tmp_path, per_class=2, test_per_class=1)
    (root / "train" / "circle" / "0000.png").write_bytes(b"not a picture")
    assert default_shape_of(root)[0] == (28, 28, 3)
    for path in (root / "train").glob("*/*.png"):
        path.write_bytes(b"not a picture")
    with pytest.raises(DataError, match="no training image starts as a PNG, JPEG, GIF or BMP file"):
        default_shape_of(root)


@pytest.mark.parametrize(
    "extension, channels",
    [(".png", 1), (".png", 3), (".png", 4), (".jpg", 1), (".jpg", 3), (".gif", 1), (".gif", 3), (".bmp", 1)]
    + [(".bmp", 3), (".bmp", 4)],
)
def test_a_header_gives_the_size_and_channels_tensorflow_decodes(extension, channels):
    encoded = image_folders.encoded(image_folders.picture(1, 2, (30, 41), channels), extension)
    decoded = tf.io.decode_image(encoded, channels=0, expand_animations=False)
    assert image_headers.size_of(encoded) == tuple(decoded.shape)


@pytest.mark.parametrize(
    "make_it, says",
    [
        (lambda root: (root / "train" / "star").rename(root / "train" / os.fsdecode(b"caf\xe9")), "is not UTF-8"),
        (lambda root: [shutil.rmtree(root / "train" / name) for name in ("square", "star")], "holds one class folder"),
        (lambda root: shutil.rmtree(root / "test"), "no class of train/ has 2 images to hold one out"),
    ],
    ids=["latin-1 folder name", "one class", "nothing to hold out"],
)
def test_a_folder_that_cannot_train_a_classifier_is_refused_naming_it(tmp_path, make_it, says):
    root = image_folders.write(tmp_path, per_class=1, test_per_class=1)
    make_it(root)
    with pytest.raises(DataError, match=says):
        image_folder.list_folder(str(root), 0.1, SEED)


def test_a_link_up_the_tree_is_not_followed_so_no_image_is_listed_twice_or_mislabelled(tmp_path):
    root = image_folders.write(tmp_path, per_class=2, test_per_class=1)
    (root / "train" / "circle" / "up").symlink_to(root / "train")
    listing = image_folder.list_folder(str(root), 0.1, SEED)
    assert len(listing.train) == 6 and len({path for path, _ in listing.train}) == 6


def test_class_names_are_the_folders_and_a_flag_naming_others_is_refused(tmp_path):
    from trainer.context import parse_config

    root = image_folders.write(tmp_path, per_class=2, test_per_class=1)
    config = parse_config(["--dataset", "image_folder", "--image-dir", str(root), "--class-names", "a,b,c"], {})
    with pytest.raises(DataError, match="--class-names names a tfrecord dataset's ids"):
        image_folder.check_flags(config)


# ---- the data check remembers what it read, by content (issue 59) ----


def data_check(folder: pathlib.Path, *flags: str) -> tuple[str, str]:
    """`python -m trainer.data` on the folder, which must succeed: its ready line, and its whole output."""
    args = ["--dataset", "image_folder", "--image-dir", str(folder), *flags]
    finished = multiworker.wait_all({"check": multiworker.start(args, None, module="trainer.data")}, 240)["check"]
    assert finished.returncode == 0, finished.output[-3000:]
    (line,) = [line for line in finished.output.splitlines() if line.startswith("dataset image_folder is ready")]
    return line, finished.output


@pytest.mark.slow  # two data checks to their end: make test-slow
def test_a_rerun_of_the_data_check_decodes_only_what_changed_and_says_the_size_the_model_takes(tmp_path):
    # Before: every run decoded every image again, and the model took the first file's size (40x52 here), unsaid.
    sizes = [(40, 52), (90, 81), (160, 160), (100, 96), (120, 90), (96, 120), (60, 150)]
    root = image_folders.write(tmp_path, per_class=7, test_per_class=1, sizes=sizes, extensions=(".png", ".jpg"))
    first, _ = data_check(root)
    assert first.endswith(
        "train 21 images, test 3 images (from test/), read as 96x96x3: sizes vary from 40x52 to 160x160; this is "
        "their median height and median width (set --image-shape to choose)"
    ), first
    again, _ = data_check(root)
    assert "(from test/) (24 unchanged since the last check, not decoded again), read as 96x96x3" in again, again
    # Other bytes of the same size and modification time, as a copy that keeps times leaves them: checked again.
    changed = root / "train" / "square" / "0002.png"
    stat = changed.stat()
    changed.write_bytes(b"RIFF\0\0\0\0WEBP" + b"\0" * (stat.st_size - 12))
    os.utime(changed, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    (root / "train" / "star" / "0007.png").write_bytes(image_folders.encoded(image_folders.picture(2, 7)))
    line, output = data_check(root, "--on-corrupt-record", "skip")
    assert "train 22 images" in line and "(23 unchanged since the last check, not decoded again)" in line, line
    assert f"warning: skipping {changed}: a WebP image" in output and "1 that do not decode skipped" in line, output


def test_a_folder_the_record_cannot_be_written_to_is_checked_in_full_each_time(tmp_path, monkeypatch):
    from trainer.data import image_check

    root = image_folders.write(tmp_path, per_class=2, test_per_class=1)
    (root / "train" / "circle" / "0001.png").write_bytes(b"GIF89a\x1c\x00\x1c\x00, cut")  # 28x28 by its header
    paths = [str(path) for path in sorted(root.glob("*/*/*.png"))]
    # The cluster's volume mounted read-only: what a non-root user meets (the suite may run as root, which may write).
    monkeypatch.setattr(os, "access", lambda path, mode: not (mode & os.W_OK and path == str(root)))
    for _ in range(2):
        checked = image_check.refused(paths, (28, 28, 3), image_check.Record(str(root)))
        assert (checked.remembered, checked.kept) == (0, False)
        assert [(pathlib.Path(path).name, kind) for path, _, kind in checked.refused] == [("0001.png", "undecodable")]
    assert not (root / image_check.RECORD_NAME).exists()


@pytest.mark.slow  # a group of two trained to its export: make test-slow
def test_every_worker_and_the_served_model_take_the_size_the_data_check_said(tmp_path):
    sizes = [(40, 52), (90, 81), (160, 160), (100, 96), (120, 90)]
    root = image_folders.write(
        tmp_path / "images", per_class=5, test_per_class=1, sizes=sizes, extensions=(".png", ".jpg")
    )
    line, _ = data_check(root)
    assert "read as 100x90x3: sizes vary from 40x52 to 160x160" in line, line
    finished = run_two_workers(root, tmp_path / "model")
    assert all(done.returncode == 0 for done in finished.values()), {n: d.output[-2000:] for n, d in finished.items()}
    served = tf.saved_model.load(str(max((tmp_path / "model" / "serving").iterdir(), key=lambda p: int(p.name))))
    (spec,) = served.signatures["serve"].structured_input_signature[1].values()
    assert tuple(spec.shape) == (None, 100, 90, 3)
    answer = served.signatures["serve_image_bytes"](
        image_bytes=tf.constant([(root / "test/star/0000.png").read_bytes()])
    )
    assert answer["class_name"].numpy()[0].decode() in image_folders.CLASSES
