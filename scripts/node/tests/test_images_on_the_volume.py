"""Your folder on the cluster: a local folder of digit images (train/<digit word>/*.png, test/ too) goes to the volume
with make upload-images, whole the first time, not at all the second, and only the file that changed the third, each
time checked by sha256 on the volume; then make submit IMAGES= trains the default CNN on that copy with two workers
(--dataset image_folder), after the data Job has checked the folder.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil

import numpy as np
import pytest
from PIL import Image, ImageDraw, ImageFont

from scripts.cluster import on_volume
from scripts.node.tests.node import (
    NAMESPACE,
    SETTINGS,
    clear_model_dir,
    fetch_model,
    kubectl,
    make,
    volume_on_node,
    wait_until,
)

pytestmark = pytest.mark.cluster

JOB = "JOB_NAME=e2e-images"
DIGITS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
SUMMARY = re.compile(r"(\d+) files checked, (\d+) copied, (\d+) already there, (\d+) bytes sent")
TRAIN, TEST = 24, 4  # per class: 240 training images, 120 a worker, 7 steps of 16


def digit(value: int, number: int) -> Image.Image:
    """A 28x28 grey digit drawn with Pillow's font, shifted and noised by its number."""
    rng = np.random.default_rng(value * 1_000 + number)
    image = Image.fromarray(rng.integers(0, 40, (28, 28), dtype=np.uint8))
    ImageDraw.Draw(image).text((6 + number % 5, 1 + number % 4), str(value), fill=255, font=ImageFont.load_default(20))
    return image


def digits(root: pathlib.Path) -> pathlib.Path:
    """root/digits/train/<word>/NNN.png and root/digits/test/<word>/NNN.png."""
    folder = root / "digits"
    for split, count, first in (("train", TRAIN, 0), ("test", TEST, 500)):
        for value, word in enumerate(DIGITS):
            (folder / split / word).mkdir(parents=True)
            for number in range(first, first + count):
                digit(value, number).save(folder / split / word / f"{number:03d}.png")
    return folder


def upload(folder: pathlib.Path) -> tuple[int, ...]:
    """make upload-images IMAGES=FOLDER; its summary's files checked, copied, already there and bytes sent."""
    done = make("upload-images", JOB, f"IMAGES={folder}")
    numbers = SUMMARY.search(done.stdout)
    assert numbers, done.stdout
    return tuple(int(number) for number in numbers.groups())


def images_root_on_node() -> pathlib.Path | None:
    root = volume_on_node()
    return (
        None
        if root is None
        else root / pathlib.PurePosixPath(SETTINGS["IMAGES_ROOT"]).relative_to(SETTINGS["MOUNT_PATH"])
    )


def test_an_image_folder_reaches_the_volume_once_then_only_the_file_that_changed(tmp_path) -> None:
    folder = digits(tmp_path)
    if images_root_on_node() is not None:
        shutil.rmtree(images_root_on_node() / folder.name, ignore_errors=True)
    files = sorted(path for path in folder.rglob("*.png"))
    assert upload(folder) == (len(files), len(files), 0, sum(path.stat().st_size for path in files))
    copy = images_root_on_node() / folder.name
    assert on_volume.digests(str(copy)) == on_volume.digests(str(folder))
    assert not (copy.parent / f".upload-{folder.name}").exists(), "no staging folder is left once the copy is whole"
    helper = "e2e-images-upload-images"
    wait_until("the helper pod to go", lambda: kubectl("get", "pod", helper, "-n", NAMESPACE, check=False).returncode)

    assert upload(folder) == (len(files), 0, len(files), 0)

    changed = folder / "train" / "seven" / "003.png"
    digit(1, 3).save(changed)
    assert upload(folder) == (len(files), 1, len(files) - 1, changed.stat().st_size)
    assert on_volume.digests(str(copy)) == on_volume.digests(str(folder))


def test_make_submit_with_images_trains_the_default_cnn_on_the_uploaded_folder(tmp_path) -> None:
    folder = digits(tmp_path)
    make("delete", JOB, check=False)
    clear_model_dir("e2e-images")
    upload(folder)
    submitted = make("submit", JOB, f"IMAGES={folder}", "EPOCHS=1", "ARGS=--per-worker-batch-size 16")
    # The data Job's line (python -m trainer.data in the image), before the TFJob was created: the folder's classes.
    ready = next((line for line in submitted.stdout.splitlines() if "dataset image_folder is ready" in line), "")
    assert f"ready at {SETTINGS['IMAGES_ROOT']}/digits: 10 classes" in ready, submitted.stdout
    assert all(word in ready for word in ("eight", "five", "four")), ready
    assert f"train {len(DIGITS) * TRAIN} images, test {len(DIGITS) * TEST} images" in ready, ready
    metrics = json.loads((fetch_model(tmp_path / "model", "e2e-images") / "metrics.json").read_text())
    assert metrics["config"]["dataset"] == "image_folder" and metrics["workers"] == 2, metrics
    assert metrics["config"]["image_dir"] == f"{SETTINGS['IMAGES_ROOT']}/digits", metrics["config"]
    make("delete", JOB)
