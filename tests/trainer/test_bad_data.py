"""Bad data as a user meets it (issue 45, item 4; issue 59): an image cut in half, a file the served model would
refuse (a WebP named .png), a JPEG cut short or damaged, an --image-shape that cannot be, a class folder layout that
cannot work, a TFRecord whose image is no image or whose class id is out of range, a fork's dataset function that
raises, rows with a class id past --num-classes. Each runs real `python -m trainer` or `python -m trainer.data`
processes and asserts the exit code and the one line the user sees: the file (or folder, record, function) named, a
fix that is true for that failure, and no traceback."""

from __future__ import annotations

import io
import json
import pathlib
import re
import shutil
import textwrap

import numpy as np
import pytest
import tensorflow as tf
from PIL import Image

import image_folders
from multiworker import Finished, run_group, start, tf_config, wait_all, worker_cluster
from trainer.artifacts import layout
from trainer.base.errors import ExitCode
from trainer.data import image_folder
from trainer.data.images import MAX_PIXELS

CUT = pathlib.PurePath("train", "square", "0003.png")  # the PNG cut in half
SKIP_HINT = "--on-corrupt-record skip"
TF_LOG_LINE = re.compile(r"[IWEF]\d{4} [\d:.]+ +\d+ \S+:\d+\] ")  # TensorFlow's C++ log lines (absl's form)
FOLDER_RUN = ["--epochs", "1", "--per-worker-batch-size", "4", "--steps-per-loop", "4"]
RECORD_RUN = ["--epochs", "1", "--per-worker-batch-size", "16", "--steps-per-loop", "4"]


def run(args: list[str], module: str = "trainer", config: str | None = None, env=None, timeout=240) -> Finished:
    """One `python -m module args` process to its end; its command, exit code and error line are printed (-rP
    shows them: the closing note's table)."""
    finished = wait_all({"run": start(args, config, env, module)}, timeout)["run"]
    print(f"python -m {module} {' '.join(args)}\n  exit {finished.returncode}: {user_line(finished.output)}")
    return finished


def user_line(output: str) -> str:
    """Its error line, or the lines that say what --on-corrupt-record skip left out, or its last line."""
    said = [line for line in output.splitlines() if line.startswith("error: ") or f"({SKIP_HINT})" in line]
    return "\n    ".join(said) if said else (output.strip().splitlines() or [""])[-1]


def error_line(finished: Finished, code: int = ExitCode.BAD_CONFIG) -> str:
    """The run's one `error: ` line, after checking its exit code and that no traceback was printed."""
    assert finished.returncode == code, finished.output[-3000:]
    assert "Traceback" not in finished.output, finished.output[-3000:]
    (line,) = [line for line in finished.output.splitlines() if line.startswith("error: ")]
    return line


# ---- an image folder with a PNG cut in half ----


@pytest.fixture(scope="module")
def sound_folder(tmp_path_factory) -> pathlib.Path:
    """Three classes of eight 28x28 PNGs in train/ and two in test/, written once."""
    return image_folders.write(tmp_path_factory.mktemp("sound") / "images", per_class=8, test_per_class=2)


@pytest.fixture
def cut_folder(sound_folder: pathlib.Path, tmp_path: pathlib.Path) -> pathlib.Path:
    """A copy of the folder whose train/square/0003.png is its first half (a partial copy)."""
    folder = shutil.copytree(sound_folder, tmp_path / "images")
    data = (folder / CUT).read_bytes()
    (folder / CUT).write_bytes(data[: len(data) // 2])
    return folder


def folder_args(folder: pathlib.Path, model_dir: pathlib.Path, *flags: str) -> list[str]:
    return ["--dataset", "image_folder", "--image-dir", str(folder), *FOLDER_RUN, "--model-dir", str(model_dir), *flags]


def test_the_data_check_names_a_png_cut_in_half(cut_folder, tmp_path):
    line = error_line(run(folder_args(cut_folder, tmp_path / "model"), module="trainer.data"))
    assert line.startswith(f"error: the data check: {cut_folder / CUT}: not a readable PNG, JPEG, GIF or BMP"), line
    assert "replace or delete that file" in line and SKIP_HINT in line, line


@pytest.mark.parametrize(
    "flags", [[], pytest.param([SKIP_HINT.split()[0], "skip"], marks=pytest.mark.slow)], ids=["fail", "skip"]
)  # the quick suite's margin
def test_the_data_check_shows_no_tensorflow_line_for_the_png_it_names(cut_folder, tmp_path, flags):
    # At the log level a user runs with (the suite quiets TensorFlow); before, TensorFlow's own warning for the same
    # decode failure, which names no file, came before the trainer's line.
    args = folder_args(cut_folder, tmp_path / "model", *flags)
    checked = run(args, module="trainer.data", env={"TF_CPP_MIN_LOG_LEVEL": "1"})
    assert f"{cut_folder / CUT}: not a readable PNG" in checked.output, checked.output[-3000:]
    assert not [line for line in checked.output.splitlines() if TF_LOG_LINE.match(line)], checked.output[-3000:]


@pytest.mark.slow  # the quick suite's margin: its sibling test stays quick
def test_training_names_a_png_cut_in_half(cut_folder, tmp_path):
    line = error_line(run(folder_args(cut_folder, tmp_path / "model")))
    assert "worker-0: reading the input failed in the steps after step" in line, line
    assert f"{cut_folder / CUT}: not a readable PNG" in line and SKIP_HINT in line, line
    assert not (tmp_path / "model" / layout.SERVING).exists()


@pytest.mark.slow  # a group of two: make test-slow
def test_two_workers_the_one_reading_the_cut_png_names_it(cut_folder, tmp_path):
    listing = image_folder.list_folder(str(cut_folder), 0.1, 42)
    owner = [path for path, _ in listing.train].index(str(cut_folder / CUT)) % 2  # worker k reads files k, k+2, ...
    finished = run_group(2, folder_args(cut_folder, tmp_path / "model"), timeout=240)
    for name, each in finished.items():
        print(f"{name}: exit {each.returncode}: {user_line(each.output)}")
    reader, other = finished[f"worker-{owner}"], finished[f"worker-{1 - owner}"]
    line = error_line(reader)
    assert f"worker-{owner}: reading the input failed" in line and f"{cut_folder / CUT}: not a readable PNG" in line
    assert SKIP_HINT in line, line
    # The peer loses the group (retryable); the reader's permanent exit 2 fails the job.
    assert other.returncode in (ExitCode.GROUP_FAILED, ExitCode.BAD_CONFIG), other.output[-3000:]
    assert "Traceback" not in other.output, other.output[-3000:]


@pytest.mark.slow  # the quick suite's margin: its sibling test stays quick
def test_the_data_check_skips_a_png_cut_in_half_and_says_so(cut_folder, tmp_path):
    checked = run(folder_args(cut_folder, tmp_path / "model", "--on-corrupt-record", "skip"), "trainer.data")
    assert checked.returncode == 0 and "Traceback" not in checked.output, checked.output[-3000:]
    lines = checked.output.splitlines()
    assert f"warning: skipping {cut_folder / CUT}: not a readable PNG, JPEG, GIF or BMP image" in checked.output
    assert any(f"skipping {cut_folder / CUT}" in line and line.endswith(f"({SKIP_HINT})") for line in lines), lines
    ready = f"dataset image_folder is ready at {cut_folder}: 3 classes (circle, square, star), train 24 images, test 6"
    assert ready in checked.output, checked.output[-3000:]
    assert "1 that do not decode skipped" in checked.output


@pytest.mark.slow  # a training to its export: make test-slow
def test_training_skips_a_png_cut_in_half_and_counts_it(cut_folder, tmp_path):
    finished = run(folder_args(cut_folder, tmp_path / "model", "--on-corrupt-record", "skip"))
    assert finished.returncode == 0 and "Traceback" not in finished.output, finished.output[-3000:]
    assert f"skipping {cut_folder / CUT}: not a readable PNG" in finished.output
    metrics = json.loads((tmp_path / "model" / layout.METRICS).read_text())
    assert metrics["corrupt_records_skipped"] == 1 and metrics["train_examples"] == 23, metrics
    assert (tmp_path / "model" / layout.SERVING).is_dir()


# ---- image folder layouts that cannot work: named before the group forms ----


def class_only_in_test(root: pathlib.Path) -> tuple[list[str], str]:
    image_folders.write(root, per_class=2, test_per_class=1)
    (root / "test" / "triangle").mkdir()
    (root / "test" / "triangle" / "0000.png").write_bytes(image_folders.encoded(image_folders.picture(0, 0)))
    return ["--image-dir", str(root)], (
        f"error: {root / 'test' / 'triangle'}: class 'triangle' is in test/ but not in train/ (train/ has circle, "
        f"square, star): a model cannot be tested on a class it never trained on; add train/triangle/ images or "
        f"remove the test folder"
    )


def empty_class_folder(root: pathlib.Path) -> tuple[list[str], str]:
    image_folders.write(root, per_class=2, test_per_class=0)
    (root / "train" / "triangle").mkdir()
    return ["--image-dir", str(root)], (
        f"error: {root / 'train' / 'triangle'}: class folder 'triangle' holds no PNG, JPEG, GIF or BMP files "
        f"(.png, .jpg, .jpeg, .gif, .bmp): add its images or remove the folder"
    )


def no_class_folders(root: pathlib.Path) -> tuple[list[str], str]:
    (root / "train").mkdir(parents=True)  # the images straight in train/, a common first try
    (root / "train" / "0000.png").write_bytes(image_folders.encoded(image_folders.picture(0, 0)))
    return ["--image-dir", str(root)], (
        f"error: {root / 'train'} holds no class folders: put each class's images in a folder named after the "
        f"class, e.g. {root / 'train' / 'cat' / '001.png'}"
    )


def no_train_folder(root: pathlib.Path) -> tuple[list[str], str]:
    image_folders.write(root / "test", per_class=1, test_per_class=0)  # root/test/train/<class>: one level off
    return ["--image-dir", str(root)], (
        f"error: --image-dir {root} has no train/ folder: put each class's images in train/<class name>/ (and "
        f"optionally test/<class name>/), e.g. train/cat/001.png"
    )


def no_such_folder(root: pathlib.Path) -> tuple[list[str], str]:
    return ["--image-dir", str(root / "imgaes")], (
        f"error: --image-dir {root / 'imgaes'}: no such folder; give the folder that holds train/<class>/ images"
    )


def no_image_dir_flag(root: pathlib.Path) -> tuple[list[str], str]:
    return [], (
        "error: --dataset image_folder needs --image-dir: the folder holding train/<class>/ (and test/<class>/) images"
    )


LAYOUTS = [
    class_only_in_test,
    empty_class_folder,
    no_class_folders,
    no_train_folder,
    no_such_folder,
    no_image_dir_flag,
]


@pytest.mark.parametrize("layout_of", LAYOUTS, ids=lambda layout_of: layout_of.__name__)
def test_a_folder_layout_that_cannot_work_is_named_by_the_check_before_the_group_forms(layout_of, tmp_path):
    from trainer.base.errors import DataError
    from trainer.context import parse_config
    from trainer.data import catalog

    flags, expected = layout_of(tmp_path / "images")
    config = parse_config(["--dataset", "image_folder", *flags], environ={})
    with pytest.raises(DataError) as refused:
        catalog.check_dataset(config)  # what check_inputs_before_the_group_forms calls
    assert f"error: {refused.value}" == expected


@pytest.mark.slow  # the quick suite's margin: a sibling covers the path quickly
def test_a_folder_layout_that_cannot_work_stops_a_worker_before_the_group_forms(tmp_path):
    flags, expected = class_only_in_test(tmp_path / "images")
    # A lone worker of a group of two: had it waited for its peer, the start-up watchdog would have killed it.
    config = tf_config(worker_cluster(2), "worker", 0)
    args = ["--dataset", "image_folder", *flags, "--startup-timeout", "60", "--model-dir", str(tmp_path / "model")]
    finished = run(args, config=config, timeout=120)
    assert error_line(finished) == expected
    assert "joining the group" not in finished.output and "joined:" not in finished.output, finished.output[-3000:]


# ---- flags an image folder cannot be read with ----


@pytest.fixture
def mixed_folder(tmp_path: pathlib.Path) -> pathlib.Path:
    """PNGs and JPEGs, as a user's photos are."""
    return image_folders.write(tmp_path / "images", per_class=4, test_per_class=1, extensions=(".png", ".jpg"))


@pytest.mark.parametrize(
    "shape, says",
    [
        ("0x32x3", "the height cannot be 0 or less"),  # before: only "give HEIGHTxWIDTHxCHANNELS"
        ("32x0x0", "the width and channels cannot be 0 or less"),
        ("32x32", "2 number(s), not 3"),
        ("32x32xRGB", "not three whole numbers"),
    ],
)
def test_an_image_shape_that_cannot_be_says_what_is_wrong_and_what_is_accepted(mixed_folder, shape, says):
    from trainer.base.errors import DataError
    from trainer.context import parse_config
    from trainer.data import catalog

    flags = ["--dataset", "image_folder", "--image-dir", str(mixed_folder), "--image-shape", shape]
    with pytest.raises(DataError) as refused:
        catalog.check_dataset(parse_config(flags, environ={}))
    assert str(refused.value) == (
        f"--image-shape '{shape}': {says}; give HEIGHTxWIDTHxCHANNELS, three whole numbers of 1 or more, e.g. "
        f"28x28x1 or 224x224x3"
    )


# ---- files the served model would refuse, JPEGs cut short or damaged (issue 59) ----

WEBP = pathlib.PurePath("train", "circle", "0002.png")  # a WebP image named .png, as a photo tool exported it
CUT_JPEG = pathlib.PurePath("train", "circle", "0003.jpg")
DAMAGED_JPEG = pathlib.PurePath("train", "square", "0001.jpg")
USER_LOG_LEVEL = {"TF_CPP_MIN_LOG_LEVEL": "1"}  # what a user runs with: the suite's level hides TensorFlow's lines
# libjpeg's own words, printed bare on stderr (no file named): "Improper call to JPEG library in state 201" and the
# like, and TensorFlow's "jpeg_mem.cc:331] Premature end of JPEG data ...".
JPEG_LIBRARY_LINE = re.compile(r"JPEG|Huffman|Input file read error")


def decoder_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if TF_LOG_LINE.match(line) or JPEG_LIBRARY_LINE.match(line)]


HUGE = pathlib.PurePath("train", "square", "0002.png")  # 8000x7000: a few kilobytes holding 56 megapixels


def huge_png() -> bytes:
    """A uniform grey 8000x7000 PNG: it compresses to kilobytes, and decodes to 56 MB."""
    buffer = io.BytesIO()
    Image.new("L", (8000, 7000), 128).save(buffer, "PNG")
    return buffer.getvalue()


# Files the served model refuses, each: where it goes, its bytes, what the check says of it, the start of the fix.
SERVED_MODEL_REFUSES = {
    # Before: TensorFlow decodes WebP, so the check passed it and training used it; the server refuses those bytes.
    "webp named png": (
        WEBP,
        lambda: image_folders.encoded(image_folders.picture(0, 1), ".webp"),
        "a WebP image, not a PNG, JPEG, GIF or BMP file",
        "convert it to PNG or JPEG",
    ),
    # Before: the check decoded it and passed it, training used it, and the served model refused the same file.
    "too many pixels": (
        HUGE,
        huge_png,
        f"its header says 8000x7000, 56000000 pixels, more than the served model decodes ({MAX_PIXELS})",
        "resize it (e.g. `magick photo.png -resize",
    ),
}


@pytest.mark.parametrize("case", sorted(SERVED_MODEL_REFUSES))
@pytest.mark.parametrize(
    "flags",
    [[], pytest.param([SKIP_HINT.split()[0], "skip"], marks=pytest.mark.slow)],  # the quick suite's margin
    ids=["fail", "skip"],
)
def test_the_data_check_refuses_what_the_served_model_refuses(mixed_folder, tmp_path, flags, case):
    where, content, what, fix = SERVED_MODEL_REFUSES[case]
    (mixed_folder / where).write_bytes(content())
    checked = run(folder_args(mixed_folder, tmp_path / "model", *flags), module="trainer.data")
    said = f"{mixed_folder / where}: {what}"
    if not flags:
        line = error_line(checked)
        assert line.startswith(f"error: the data check: {said}; {fix}"), line
        assert "or delete it" in line and SKIP_HINT in line, line
        return
    assert checked.returncode == 0 and f"warning: skipping {said} ({SKIP_HINT})" in checked.output, checked.output
    assert "train 12 images" in checked.output and ", 1 that do not decode skipped" in checked.output


def test_what_a_refused_file_is_is_said_where_its_bytes_tell(tmp_path):
    from trainer.data.image_headers import what_else

    tiff = image_folders.encoded(image_folders.picture(0, 0), ".tif")
    assert what_else(tiff) == "a TIFF image"
    assert what_else(b"\x1f\x8b\x08\x00") == "a gzip archive"
    assert what_else(b"\x00\x00\x00\x18ftypheic") == "a HEIC image"
    assert what_else(b"version https://git-lfs.github.com/spec/v1\noid sha256:...").startswith("a Git LFS pointer")
    assert what_else(b"") == "an empty file" and what_else(b"cat,dog\n") == "a text file"
    assert (
        what_else(b"\x00\x01\x02\x03\xfe")
        == "in no format the trainer knows (it starts with b'\\x00\\x01\\x02\\x03\\xfe')"
    )


def test_the_fix_said_for_a_refused_file_fits_what_it_is(tmp_path):
    # Before: a Git LFS pointer, a web page and a text file were each told to convert it with `magick`.
    from trainer.data import image_check

    files = {
        "pointer.png": (b"version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n", "`git lfs pull`"),
        "page.jpg": (b"<!DOCTYPE html><html><body>Not found</body></html>", "no picture at all"),
        "notes.png": (b"cat,dog\n", "no picture at all"),
        "photo.png": (image_folders.encoded(image_folders.picture(0, 1), ".webp"), "`magick photo.webp photo.png`"),
        "empty.png": (b"", "copy it again from its source"),
    }
    for name, (data, _) in files.items():
        (tmp_path / name).write_bytes(data)
    checked = image_check.refused([str(tmp_path / name) for name in files], (28, 28, 3))
    for (name, (_, fix)), refused in zip(files.items(), checked.refused, strict=True):
        assert refused.path == str(tmp_path / name) and fix in refused.fix, refused
        assert SKIP_HINT in refused.fix and ("magick" in refused.fix) == (name == "photo.png"), refused


def test_the_data_check_names_a_jpeg_cut_short_and_no_decoder_line_comes_first(mixed_folder, tmp_path):
    # Before: libjpeg's "Improper call to JPEG library in state 201" or TensorFlow's "Premature end of JPEG data"
    # came first, then a line that said only that TensorFlow could not decode it.
    data = (mixed_folder / CUT_JPEG).read_bytes()
    (mixed_folder / CUT_JPEG).write_bytes(data[: len(data) // 2])
    # And a whole JPEG with a damaged Huffman table, its segment's length kept, so only the decoder finds it wrong:
    # before, libjpeg's bare "Bogus Huffman table definition" came first.
    damaged = bytearray((mixed_folder / DAMAGED_JPEG).read_bytes())
    table = damaged.index(b"\xff\xc4")
    damaged[table + 5 : table + 21] = b"\xff" * 16
    (mixed_folder / DAMAGED_JPEG).write_bytes(bytes(damaged))
    checked = run(folder_args(mixed_folder, tmp_path / "model"), module="trainer.data", env=USER_LOG_LEVEL)
    line = error_line(checked)
    assert line.startswith(f"error: the data check: {mixed_folder / CUT_JPEG}: a JPEG cut short: it ends before"), line
    assert "(1 more file(s) are refused too); copy it again from its source or delete it" in line, line
    assert decoder_lines(checked.output) == [], checked.output


@pytest.mark.slow  # a training start: make test-slow
@pytest.mark.parametrize("damage", ["webp", "cut jpeg", "too large"])
def test_training_without_the_data_check_names_the_file_the_served_model_would_refuse(mixed_folder, tmp_path, damage):
    # Before: the WebP trained as a picture; the cut JPEG's line came after libjpeg's and TensorFlow's own.
    if damage == "webp":
        path, said = mixed_folder / WEBP, "a WebP image, not a PNG, JPEG, GIF or BMP file"
        path.write_bytes(image_folders.encoded(image_folders.picture(0, 1), ".webp"))
    elif damage == "too large":  # before: decoded and trained on
        path, said = mixed_folder / HUGE, "its header says 8000x7000, 56000000 pixels, more than the served model"
        path.write_bytes(huge_png())
    else:
        path, said = mixed_folder / CUT_JPEG, "a JPEG cut short"
        path.write_bytes(path.read_bytes()[:300])
    finished = run(folder_args(mixed_folder, tmp_path / "model"), env=USER_LOG_LEVEL)
    line = error_line(finished)
    assert "worker-0: reading the input failed" in line and f"{path}: {said}" in line, line
    assert decoder_lines(finished.output) == [], finished.output[-3000:]


@pytest.mark.slow  # a training to its export: make test-slow
def test_training_skips_a_webp_named_png_and_counts_it(mixed_folder, tmp_path):
    (mixed_folder / WEBP).write_bytes(image_folders.encoded(image_folders.picture(0, 1), ".webp"))
    finished = run(folder_args(mixed_folder, tmp_path / "model", "--on-corrupt-record", "skip"))
    assert finished.returncode == 0 and "Traceback" not in finished.output, finished.output[-3000:]
    assert f"skipping {mixed_folder / WEBP}: a WebP image, not a PNG, JPEG, GIF or BMP file" in finished.output
    metrics = json.loads((tmp_path / "model" / layout.METRICS).read_text())
    assert metrics["corrupt_records_skipped"] == 1 and metrics["train_examples"] == 11, metrics


@pytest.mark.slow  # a training to its export: make test-slow
def test_training_skips_a_picture_bigger_than_the_served_model_decodes_and_counts_it(mixed_folder, tmp_path):
    (mixed_folder / HUGE).write_bytes(huge_png())
    finished = run(folder_args(mixed_folder, tmp_path / "model", "--on-corrupt-record", "skip"))
    assert finished.returncode == 0 and "Traceback" not in finished.output, finished.output[-3000:]
    assert f"skipping {mixed_folder / HUGE}: its header says 8000x7000, 56000000 pixels" in finished.output
    metrics = json.loads((tmp_path / "model" / layout.METRICS).read_text())
    assert metrics["corrupt_records_skipped"] == 1 and metrics["train_examples"] == 11, metrics


# ---- TFRecord files: an image that is no image, class ids out of range or shifted between splits ----


def example(image: bytes, label: int) -> bytes:
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_examples(path: pathlib.Path, labels: list[int], not_an_image: int | None = None) -> pathlib.Path:
    """One TFRecord file of 28x28x1 raw images, record i of class labels[i] (a flat grey of its class); record
    `not_an_image`'s image bytes are text, neither an image file nor 784 raw bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tf.io.TFRecordWriter(str(path)) as writer:
        for number, label in enumerate(labels):
            pixels = np.full((28, 28, 1), 20 * (label % 12), np.uint8).tobytes()
            writer.write(example(b"this is not an image" if number == not_an_image else pixels, label))
    return path


def record_args(folder: pathlib.Path, num_classes: int, model_dir: pathlib.Path, *flags: str) -> list[str]:
    return [
        "--dataset", "tfrecord", "--train-files", str(folder / "train-*"), "--test-files", str(folder / "test-*"),
        "--image-shape", "28x28x1", "--num-classes", str(num_classes), *RECORD_RUN, "--model-dir", str(model_dir),
        *flags,
    ]  # fmt: skip


@pytest.mark.slow  # the quick suite's margin: a sibling covers the path quickly
def test_training_names_a_record_whose_image_is_no_image(tmp_path):
    shard = write_examples(tmp_path / "data" / "train-0.tfrecord", [i % 10 for i in range(64)], not_an_image=17)
    write_examples(tmp_path / "data" / "test-0.tfrecord", [i % 10 for i in range(16)])
    line = error_line(run(record_args(tmp_path / "data", 10, tmp_path / "model")))
    assert "worker-0: reading the input failed in the steps after step" in line, line
    assert f"{shard}: record 17 is a tf.train.Example, but its features do not decode" in line, line
    assert "restore or rewrite that file from its source" in line and SKIP_HINT in line, line


@pytest.mark.parametrize("skip", [False, pytest.param(True, marks=pytest.mark.slow)])  # the quick suite's margin
def test_the_data_check_decodes_every_record_and_names_one_whose_image_is_no_image(skip, tmp_path):
    # Before, the check counted records and read their labels only: "ready", then the trainer failed in the group.
    shard = write_examples(tmp_path / "data" / "train-0.tfrecord", [i % 10 for i in range(64)], not_an_image=17)
    write_examples(tmp_path / "data" / "test-0.tfrecord", [i % 10 for i in range(16)])
    flags = ["--on-corrupt-record", "skip"] if skip else []
    finished = run(record_args(tmp_path / "data", 10, tmp_path / "model", *flags), module="trainer.data")
    if skip:
        assert finished.returncode == 0, finished.output[-3000:]
        assert "64 examples" in finished.output and "1 records that do not decode skipped" in finished.output
    else:
        line = error_line(finished)
        assert line.startswith(f"error: the data check: {shard}: record 17 is a tf.train.Example, but its"), line
        assert SKIP_HINT in line, line


@pytest.mark.slow  # a training to its export: make test-slow
def test_skip_trains_past_a_record_whose_image_is_no_image_and_counts_it(tmp_path):
    # Before 09ef14e skip dropped only what did not parse: this record parses, so skip exited 2 on it (as fail does).
    shard = write_examples(tmp_path / "data" / "train-0.tfrecord", [i % 10 for i in range(64)], not_an_image=17)
    write_examples(tmp_path / "data" / "test-0.tfrecord", [i % 10 for i in range(16)])
    finished = run(record_args(tmp_path / "data", 10, tmp_path / "model", "--on-corrupt-record", "skip"))
    assert finished.returncode == 0 and "Traceback" not in finished.output, finished.output[-3000:]
    assert any(str(shard) in line and "skipped 1 of the 64" in line for line in finished.output.splitlines())
    metrics = json.loads((tmp_path / "model" / layout.METRICS).read_text())
    assert metrics["corrupt_records_skipped"] == 1, metrics


@pytest.fixture
def label_nine(tmp_path: pathlib.Path) -> pathlib.Path:
    """Class ids 0..9 in both splits: with --num-classes 9, id 9 (first in train's record 9) is out of range."""
    shard = write_examples(tmp_path / "data" / "train-0.tfrecord", [i % 10 for i in range(64)])
    write_examples(tmp_path / "data" / "test-0.tfrecord", [i % 9 for i in range(16)])
    return shard


def test_the_data_check_names_a_class_id_past_num_classes(label_nine, tmp_path):
    line = error_line(run(record_args(label_nine.parent, 9, tmp_path / "model"), module="trainer.data"))
    assert line.startswith(
        f"error: the data check: {label_nine}: record 9 has class id 9, not in [0, 9) (--num-classes 9, "
        f"--label-feature label); write class ids 0..num_classes-1"
    ), line
    assert SKIP_HINT not in line and "skipping cannot help" in line, line


@pytest.mark.slow  # the quick suite's margin: the data check's test of the same id stays quick
def test_training_names_a_class_id_past_num_classes_with_its_record(label_nine, tmp_path):
    # Was exit 1 with a UnicodeDecodeError traceback: the label check's message held the serialized record's bytes.
    line = error_line(run(record_args(label_nine.parent, 9, tmp_path / "model")))
    assert "worker-0: reading the input failed in the steps after step" in line, line
    assert f"{label_nine}: record 9: class id out of range: 9 is not in [0, 9); write class ids 0..num_classes-1" in (
        line
    ), line
    assert "check --num-classes and the label feature" in line, line
    assert SKIP_HINT not in line and "skipping cannot help" in line, line


@pytest.mark.slow  # the quick suite's margin: a sibling covers the path quickly
def test_the_data_check_refuses_class_ids_shifted_between_the_splits(tmp_path):
    write_examples(tmp_path / "data" / "train-0.tfrecord", [i % 9 for i in range(64)])  # 0..8
    write_examples(tmp_path / "data" / "test-0.tfrecord", [1 + i % 9 for i in range(18)])  # 1..9
    line = error_line(run(record_args(tmp_path / "data", 10, tmp_path / "model"), module="trainer.data"))
    assert line.startswith("error: the test split (--test-files ") and "has class id(s) [9] that no training" in line


# ---- a fork's own dataset: a function that raises, rows whose class id is out of range ----

FORK_MODULE = '''
"""A fork's data: a dataset whose function raises, and rows with one class id past num_classes."""
import numpy as np

from trainer.api import datasets


@datasets.register("broken")
def broken(config):
    raise FileNotFoundError("/data/labels.csv: no such file")


@datasets.register("rows")
def rows(config):
    labels = np.arange(48, dtype=np.int64) % 3
    labels[29] = 7
    images = np.repeat(labels.astype(np.uint8)[:, None, None, None] * 80, 28 * 28, 1).reshape(48, 28, 28, 1)
    return datasets.Source(
        train=datasets.Arrays(images, labels),
        test=datasets.Arrays(images[:12], labels[:12]),
        element_spec=datasets.arrays_spec(images, labels),
        num_classes=3,
    )
'''
BROKEN_ARGS = ["--module", "fork_data", "--dataset", "broken"]
BROKEN = (
    "error: --dataset broken: fork_data.broken() raised FileNotFoundError: /data/labels.csv: no such file; fix it "
    "in that function (run `python -m trainer.data` with the same flags to try it alone)"
)


@pytest.fixture
def fork(tmp_path: pathlib.Path) -> dict[str, str]:
    """fork_data.py in a folder of its own, on PYTHONPATH: the environment to run with."""
    (tmp_path / "fork").mkdir()
    (tmp_path / "fork" / "fork_data.py").write_text(textwrap.dedent(FORK_MODULE))
    return {"PYTHONPATH": str(tmp_path / "fork")}


def test_the_data_check_names_a_dataset_function_that_raises(fork, tmp_path):
    args = [*BROKEN_ARGS, "--model-dir", str(tmp_path / "model")]
    assert error_line(run(args, module="trainer.data", env=fork)) == BROKEN  # was "nothing to prepare", exit 0


@pytest.mark.slow  # the quick suite's margin: a sibling covers the path quickly
def test_training_names_a_dataset_function_that_raises(fork, tmp_path):
    args = [*BROKEN_ARGS, "--model-dir", str(tmp_path / "model")]
    assert error_line(run(args, env=fork)) == BROKEN


@pytest.mark.slow  # the quick suite's margin: the data check's test of the same row stays quick
def test_training_names_a_row_whose_class_id_is_out_of_range(fork, tmp_path):
    args = ["--module", "fork_data", "--dataset", "rows", *FOLDER_RUN, "--model-dir", str(tmp_path / "model")]
    line = error_line(run(args, env=fork))  # was "...: Graph execution error:; write class ids ...": no id, no row
    assert "worker-0: reading the input failed in the steps after step" in line, line
    assert "class id out of range: 7 is not in [0, 3) (record 29); write class ids 0..num_classes-1" in line, line
    assert SKIP_HINT not in line and "skipping cannot help" in line, line


def test_the_data_check_names_a_row_whose_class_id_is_out_of_range(fork, tmp_path):
    args = ["--module", "fork_data", "--dataset", "rows", "--model-dir", str(tmp_path / "model")]
    line = error_line(run(args, module="trainer.data", env=fork))  # was "ready", exit 0
    assert line.startswith("error: the data check: row 29 of the train split has class id 7, not in [0, 3)"), line
