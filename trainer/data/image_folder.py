"""Your images in class folders (--dataset image_folder --image-dir DIR), with no code: DIR/train/<class>/ holds each
class's PNG, JPEG, GIF or BMP files (subfolders too), and DIR/test/<class>/ the test split where there is one, else
a seeded --validation-split of each class of train/ is held out. It is the layout of Keras's
image_dataset_from_directory, torchvision's ImageFolder and labelling tools' exports.

Class ids follow train/'s folder names, sorted, and the names travel with the model (Source.class_names); test/'s
folders are mapped by name. Images are decoded and resized (--image-shape; by default the training images' median
height and width, read from their headers: default_shape) in the input pipeline, as images.py says, so a worker
holds its file names, not its images. Worker k of n reads files
k, k+n, ... of the list sorted by class then name (its own, every class in it), visited in a seeded permutation per
epoch as Generated's are, so a resume at any step is exact and skips without reading.

What is wrong is named before the group forms: the layout (no train/, an empty class folder, a test class train/
lacks) by every worker as it starts, and a file the model cannot read as its picture (image_check.py: not one of
the served model's formats, a JPEG cut short, more pixels than it decodes, or not decodable) by the data check
(`python -m trainer.data`, which checks every file once and remembers its verdicts by content; a run without it
names the file when its read fails).
`--on-corrupt-record skip` has each worker check its own files first and leave out, and count, those refused.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
import logging
import os
import random
import statistics
from collections.abc import Sequence

from trainer.base.errors import CorruptRecordError, DataError
from trainer.data import image_check, image_headers, images
from trainer.data.datasets import Shard, Source, image_spec, register
from trainer.data.tfrecord import RecordOptions, parse_image_shape
from trainer.settings.config import Config
from trainer.settings.options import option

log = logging.getLogger(__name__)

LabelledFile = tuple[str, int]  # (path, class id)


@dataclasses.dataclass(frozen=True)
class FolderOptions:
    """The options of --dataset image_folder (with --image-shape and --on-corrupt-record, shared with tfrecord)."""

    image_dir: str = option("", "folder of train/<class>/ (and test/<class>/) images: PNG, JPEG, GIF or BMP files")
    validation_split: float = option(
        0.1,
        "without a test/ folder: the share of each class of train/ held out as the test split (seeded by --seed)",
        at_least=0,
        below=1,
    )


@dataclasses.dataclass(frozen=True)
class Listing:
    """The files of an image folder: class names (train/'s folders, sorted) and each split's labelled files."""

    class_names: tuple[str, ...]
    train: tuple[LabelledFile, ...]
    test: tuple[LabelledFile, ...]
    test_from: str  # where the test split comes from, for the data check's line


@functools.lru_cache(maxsize=4)  # the check before the group forms and the load list it once per process
def list_folder(image_dir: str, validation_split: float, seed: int) -> Listing:
    """Lists DIR/train/<class>/ and DIR/test/<class>/ (or holds out validation_split of train/); raises DataError
    naming what is wrong: no folder, no train/, no class folders or only one, a class folder without images, a
    test class that train/ lacks, nothing to hold out, a name that is not UTF-8."""
    image_dir = os.path.expanduser(image_dir)
    train_dir, test_dir = os.path.join(image_dir, "train"), os.path.join(image_dir, "test")
    if not os.path.isdir(image_dir):
        raise DataError(f"--image-dir {image_dir}: no such folder; give the folder that holds train/<class>/ images")
    if not os.path.isdir(train_dir):
        raise DataError(
            f"--image-dir {image_dir} has no train/ folder: put each class's images in train/<class name>/ "
            f"(and optionally test/<class name>/), e.g. train/cat/001.png"
        )
    train = _classes(train_dir)
    class_names = tuple(sorted(train))
    if len(class_names) < 2:
        raise DataError(
            f"{train_dir} holds one class folder ({class_names[0]}): a classifier needs 2 or more, one folder of "
            f"images per class"
        )
    ids = {name: class_id for class_id, name in enumerate(class_names)}
    if not os.path.isdir(test_dir):
        if validation_split <= 0:
            raise DataError(
                f"--image-dir {image_dir} has no test/ folder and --validation-split is 0: add test/<class>/ "
                f"folders, or hold out part of train/ with --validation-split 0.1"
            )
        kept, held_out = _held_out(train, validation_split, seed)
        if not held_out:
            raise DataError(
                f"--image-dir {image_dir} has no test/ folder, and no class of train/ has 2 images to hold one out "
                f"(--validation-split {validation_split}): add test/<class>/ folders or more images"
            )
        return Listing(
            class_names, _labelled(kept, ids), _labelled(held_out, ids), f"--validation-split {validation_split}"
        )
    test = _classes(test_dir)
    unknown = sorted(set(test) - set(class_names))
    if unknown:
        raise DataError(
            f"{os.path.join(test_dir, unknown[0])}: class {unknown[0]!r} is in test/ but not in train/ (train/ has "
            f"{', '.join(class_names)}): a model cannot be tested on a class it never trained on; add "
            f"train/{unknown[0]}/ images or remove the test folder"
        )
    return Listing(class_names, _labelled(train, ids), _labelled(test, ids), "test/")


def _classes(split_dir: str) -> dict[str, list[str]]:
    """Each class folder's image files (recursively, sorted), by class name."""
    entries = [entry for entry in os.scandir(split_dir) if not entry.name.startswith(".")]
    names = sorted(os.path.basename(_utf8(entry.path)) for entry in entries if entry.is_dir())
    loose = [entry.name for entry in entries if entry.is_file()]
    if loose and names:
        log.warning("%s: ignoring %d file(s) outside the class folders, e.g. %s", split_dir, len(loose), loose[0])
    if not names:
        raise DataError(
            f"{split_dir} holds no class folders: put each class's images in a folder named after the class, "
            f"e.g. {os.path.join(split_dir, 'cat', '001.png')}"
        )
    classes, ignored = {}, []
    for name in names:
        files, others = _image_files(os.path.join(split_dir, name))
        ignored += others
        if not files:
            raise DataError(
                f"{os.path.join(split_dir, name)}: class folder {name!r} holds no {images.FORMATS} files "
                f"({', '.join(images.EXTENSIONS)}): add its images or remove the folder"
            )
        classes[name] = files
    if ignored:
        log.warning(
            "%s: ignoring %d file(s) that are not images by their extension, e.g. %s",
            split_dir,
            len(ignored),
            ignored[0],
        )
    return classes


def _image_files(folder: str) -> tuple[list[str], list[str]]:
    """(image files, other files) under folder, recursively, each sorted; hidden files and folders are not data."""
    found: list[str] = []
    others: list[str] = []
    # Links to folders are not followed (as Keras's loader): one back up the tree would list images twice, mislabelled.
    for root, folders, files in os.walk(folder):
        folders[:] = [name for name in folders if not name.startswith(".")]
        for name in files:
            if not name.startswith("."):
                path = _utf8(os.path.join(root, name))
                (found if name.lower().endswith(images.EXTENSIONS) else others).append(path)
    return sorted(found), sorted(others)


def _utf8(path: str) -> str:
    """The path, refused (DataError) where its name is not UTF-8 (a Windows archive unzipped here, say): TensorFlow
    cannot hold it, and the name is a class name or a file the model reads."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise DataError(
            f"{path.encode('utf-8', 'surrogateescape')!r}: the name is not UTF-8; rename it (e.g. `convmv -f latin1 "
            f"-t utf8 -r --notest DIR`)"
        ) from None
    return path


def _held_out(
    classes: dict[str, list[str]], share: float, seed: int
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Each class's files split by a seeded shuffle: (kept for training, held out for testing), at least one of
    each per class where the class has two files."""
    kept, held_out = {}, {}
    for name, files in classes.items():
        shuffled = sorted(files)
        random.Random(f"{seed}/{name}").shuffle(shuffled)
        count = min(max(round(len(files) * share), 1), len(files) - 1) if len(files) > 1 else 0
        held_out[name], kept[name] = sorted(shuffled[:count]), sorted(shuffled[count:])
    return kept, {name: files for name, files in held_out.items() if files}


def _labelled(classes: dict[str, list[str]], ids: dict[str, int]) -> tuple[LabelledFile, ...]:
    return tuple((path, ids[name]) for name in sorted(classes) for path in classes[name])


# Past this side the model's first dense layer would not fit: a larger default is scaled down to it.
LARGEST_DEFAULT_SIDE = 512


def default_shape(files: Sequence[LabelledFile]) -> tuple[tuple[int, int, int], str]:
    """The default --image-shape, from the training images' headers (so every worker finds the same, reading no
    pixels), and why, in words for the data check's line: the median height and the median width (each an image's;
    with mixed orientations they meet near a square, with one orientation they keep its aspect), scaled down to
    LARGEST_DEFAULT_SIDE on the longer side; RGB where any image is in colour, alpha where any has transparency, so
    none loses them. DataError when no file has an image header."""
    with concurrent.futures.ThreadPoolExecutor(image_check.PARALLEL_READS) as pool:
        sizes = [size for size in pool.map(_header_size, [path for path, _ in files]) if size is not None]
    if not sizes:
        raise DataError(
            f"no training image starts as a {images.FORMATS} file: check the folder's files (python -m "
            f"trainer.data names each), or give --image-shape"
        )
    colour, alpha = any(size[2] >= 3 for size in sizes), any(size[2] in (2, 4) for size in sizes)
    channels = (3 if colour else 1) + alpha
    height = statistics.median_low(size[0] for size in sizes)
    width = statistics.median_low(size[1] for size in sizes)
    if len({size[:2] for size in sizes}) == 1:
        why = "the images' size"
    else:
        smallest, largest = (extreme(sizes, key=lambda size: (size[0] * size[1], size)) for extreme in (min, max))
        why = f"sizes vary from {_size(smallest)} to {_size(largest)}; this is their median height and median width"
    if max(height, width) > LARGEST_DEFAULT_SIDE:
        scale = LARGEST_DEFAULT_SIDE / max(height, width)
        why = f"{why}, {_size((height, width))}, scaled down to {LARGEST_DEFAULT_SIDE} on the longer side"
        height, width = max(round(height * scale), 1), max(round(width * scale), 1)
    if len({size[2] for size in sizes}) > 1:
        why = f"{why}, with {channels} channels, so no image loses its colour or transparency"
    return (height, width, channels), f"{why} (set --image-shape to choose)"


def _header_size(path: str) -> tuple[int, int, int] | None:
    try:
        return image_headers.read_size(path)
    except OSError:
        return None  # named by the data check, or by the read that fails


def _size(size: Sequence[int]) -> str:
    return f"{size[0]}x{size[1]}"


@dataclasses.dataclass(frozen=True, eq=False)
class ImageFiles:
    """One split's labelled image files, decoded and resized to image_shape as they are read."""

    files: tuple[LabelledFile, ...]
    image_shape: tuple[int, int, int]
    skip_undecodable: bool = False

    def fingerprint(self) -> str:
        names = hashlib.sha256("\n".join(f"{path} {label}" for path, label in self.files).encode()).hexdigest()
        shape = "x".join(map(str, self.image_shape))
        return f"{len(self.files)} image files, names and classes sha256 {names[:16]}, read as {shape}"

    def shard(self, index: int, count: int) -> Shard:
        import tensorflow as tf

        own = self.files[index::count]
        dropped = (
            image_check.refused([path for path, _ in own], self.image_shape).refused if self.skip_undecodable else []
        )
        for path, problem, _ in dropped:
            log.warning("skipping %s: %s (--on-corrupt-record skip)", path, problem)
        bad = {path for path, _, _ in dropped}
        own = tuple((path, label) for path, label in own if path not in bad)
        paths = tf.constant([path for path, _ in own] or [""])
        labels = tf.constant([label for _, label in own] or [0], tf.int64)
        size, shape = len(own), self.image_shape

        def records(seed: tf.Tensor) -> tf.data.Dataset:
            key = tf.stack([tf.cast(seed, tf.int64), tf.constant(index, tf.int64)])
            return tf.data.Dataset.range(size).map(
                lambda i: tf.random.experimental.index_shuffle(i, key, max(size - 1, 0))
            )

        def decode(number: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            encoded = tf.io.read_file(paths[number])
            # What the served model refuses is not trained on either, though TensorFlow decodes more formats. The
            # message holds none of the file's bytes, which TensorFlow's error would fail to decode as UTF-8.
            accepted = tf.debugging.Assert(images.starts_as_accepted(encoded), [f"not a {images.FORMATS} file"])
            # Nor is a picture bigger than it decodes, refused by its header before the decode would expand it.
            small = images.assert_sizes(encoded[None], "image file")
            with tf.control_dependencies([accepted, small]):
                return images.decoded(encoded, shape), labels[number]

        def scan(where: str) -> CorruptRecordError | None:
            failed = image_check.refused([path for path, _ in own], shape).refused
            return (
                CorruptRecordError(f"{where}: {failed[0].path}: {failed[0].problem}; {failed[0].fix}")
                if failed
                else None
            )

        return Shard(
            records,
            decode,
            size,
            shuffled=True,
            reads=f"its own {size} of {len(self.files)} image files",
            skipped=(lambda: len(dropped)) if self.skip_undecodable else None,
            scan=scan,
        )


def check_flags(config: Config) -> Listing:
    """The folder's layout and the flags image_folder needs, checked before the group forms (DataError): listing
    the files only, no image is read."""
    options, shared = config.group(FolderOptions), config.group(RecordOptions)
    if not options.image_dir:
        raise DataError(
            "--dataset image_folder needs --image-dir: the folder holding train/<class>/ (and test/<class>/) images"
        )
    if shared.image_shape:
        parse_image_shape(shared.image_shape)
    listing = list_folder(options.image_dir, options.validation_split, config.seed)
    if shared.class_names:
        raise DataError("--class-names names a tfrecord dataset's ids; image_folder's names are its folders: drop it")
    if shared.num_classes and shared.num_classes != len(listing.class_names):
        raise DataError(
            f"--num-classes {shared.num_classes}, but {options.image_dir}/train has {len(listing.class_names)} "
            f"class folders ({', '.join(listing.class_names)}): drop --num-classes, image_folder counts them"
        )
    return listing


def chosen_shape(config: Config, listing: Listing) -> tuple[tuple[int, int, int], str]:
    """The image shape the model takes, and why: --image-shape, else default_shape of the training images."""
    given = config.group(RecordOptions).image_shape
    if not given:
        return default_shape(listing.train)
    shape = parse_image_shape(given)
    if shape[2] not in (1, 2, 3, 4):
        raise DataError(f"--image-shape {given}: image files hold 1 (gray), 2, 3 (RGB) or 4 (RGBA) channels")
    return shape, "--image-shape"


@register("image_folder", options=FolderOptions)
def source(config: Config) -> Source:
    """Your image files in class folders: --image-dir, and optionally --image-shape and --validation-split."""
    listing = check_flags(config)
    shape, _ = chosen_shape(config, listing)
    skip = config.group(RecordOptions).on_corrupt_record == "skip"
    return Source(
        train=ImageFiles(listing.train, shape, skip),
        test=ImageFiles(listing.test, shape, skip),
        element_spec=image_spec(shape),
        num_classes=len(listing.class_names),
        class_names=listing.class_names,
    )
