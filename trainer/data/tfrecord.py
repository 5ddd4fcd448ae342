"""Your own files (--dataset tfrecord): TFRecord files of tf.train.Example, with their options (`RecordOptions`), each
worker reading its own files; the record index (record_counts.py) holds their counts, and corrupt_records.py names
a corrupt one or skips it."""

from __future__ import annotations

import dataclasses
import hashlib
import os
from typing import TYPE_CHECKING

from trainer.base.errors import ConfigError, CorruptRecordError, DataError
from trainer.data import images
from trainer.data.datasets import Shard, Source, image_spec, register, share
from trainer.settings.config import Config
from trainer.settings.options import option

if TYPE_CHECKING:
    import tensorflow as tf

    from trainer.data.corrupt_records import SkippedRecords
    from trainer.data.datasets import Example
    from trainer.data.record_counts import RecordCounts


ON_CORRUPT_RECORD = ("fail", "skip")


@dataclasses.dataclass(frozen=True)
class RecordOptions:
    """The options of --dataset tfrecord."""

    train_files: str = option("", "glob(s) of training TFRecord files, comma-separated (tf.io.gfile paths)")
    test_files: str = option("", "glob(s) of test TFRecord files, comma-separated")
    image_shape: str = option(
        "",
        "HEIGHTxWIDTHxCHANNELS the model takes; images are resized to it (image_folder: default the training images' "
        "median height and width, docs/data.md)",
    )
    num_classes: int = option(0, "number of classes (0..N-1)")
    class_names: str = option(
        "", "the classes' names in class-id order, comma-separated: served answers and metrics.json carry them"
    )
    image_feature: str = option("image", "tf.train.Example feature with the PNG/JPEG or raw uint8 image")
    label_feature: str = option("label", "tf.train.Example int64 feature with the class")
    on_corrupt_record: str = option(
        "fail",
        "a truncated file, a checksum mismatch, a record that is not a tf.train.Example or an image that does not "
        "decode (tfrecord and image_folder): fail (exit 2, naming the file) or skip it (logged once per file, "
        "counted in metrics.json; see docs/data.md)",
        ON_CORRUPT_RECORD,
    )

    def check(self) -> None:
        if self.num_classes < 0:
            raise ConfigError(f"--num-classes must be 0 (unset) or a positive count, got {self.num_classes}")


@dataclasses.dataclass(frozen=True)
class RecordFiles:
    """TFRecord files of tf.train.Example: `image_feature` holds an encoded PNG/JPEG/GIF/BMP or raw uint8
    bytes (HxWxC, recognised by their length), `label_feature` an int64. Images are resized to image_shape.

    With at least as many files as workers, worker k reads only files k, k+n, k+2n, ... (its own), in a
    seeded order per epoch, interleaved. With fewer files, every worker reads every file in the same order
    and keeps every n-th record (element sharding): correct, but each reads the whole split.
    """

    files: tuple[str, ...]
    image_shape: tuple[int, int, int]
    image_feature: str = "image"
    label_feature: str = "label"
    counts: RecordCounts = dataclasses.field(default_factory=lambda: _record_counts(None), compare=False)
    # --on-corrupt-record skip: this tally drops and counts what cannot be read or parsed; None fails on it
    skipped: SkippedRecords | None = dataclasses.field(default=None, compare=False)

    def fingerprint(self) -> str:
        names = hashlib.sha256("\n".join(os.path.basename(path) for path in self.files).encode()).hexdigest()
        return f"{len(self.files)} TFRecord files, names sha256 {names[:16]}"

    def shard(self, index: int, count: int) -> Shard:
        by_file = len(self.files) >= count
        own = self.files[index::count] if by_file else self.files
        import tensorflow as tf

        counts = self.counts.counts(own, self.skipped)  # from the record index: no counting pass once it is written
        files = tuple(zip(own, counts, strict=True))
        # Skip mode drops a record whose image does not decode too, so its read decodes (and the map again).
        read = tf.data.TFRecordDataset if self.skipped is None else self.skipped.reader(files, self._decode)

        def records(seed: tf.Tensor) -> tf.data.Dataset:
            order = tf.data.Dataset.from_tensor_slices(list(own)).shuffle(len(own), seed=seed)
            interleaved = order.interleave(
                read,
                cycle_length=min(len(own), 8),
                block_length=1,
                num_parallel_calls=tf.data.AUTOTUNE,
                deterministic=True,
            )
            return interleaved if by_file else interleaved.shard(count, index)

        size = sum(counts)
        if not by_file:
            size = share(size, index, count)
            reads = (
                f"all {len(own)} file(s), keeping one record in {count} (element sharding): fewer files than "
                f"workers, so no worker can read only its own files (write at least {count} files to shard "
                f"by file)"
            )
        else:
            reads = f"its own {len(own)} of {len(self.files)} files"
        skipped = self.skipped
        # Under element sharding every worker drops the same records: the first one counts them.
        tallied = None if skipped is None else (lambda: skipped.total(own) if by_file or index == 0 else 0)
        return Shard(
            records,
            self._decode,
            size,
            shuffled=False,
            reads=reads,
            every_worker_reads_all=not by_file,
            files=files,
            skipped=tallied,
        )

    def _parse(self, serialized: tf.Tensor) -> dict[str, tf.Tensor]:
        import tensorflow as tf

        return tf.io.parse_single_example(
            serialized,
            {
                self.image_feature: tf.io.FixedLenFeature([], tf.string),
                self.label_feature: tf.io.FixedLenFeature([], tf.int64),
            },
        )

    def _decode(self, serialized: tf.Tensor) -> Example:
        import tensorflow as tf

        parsed = self._parse(serialized)
        height, width, channels = self.image_shape
        encoded = parsed[self.image_feature]
        raw = lambda: tf.reshape(tf.io.decode_raw(encoded, tf.uint8), self.image_shape)  # noqa: E731
        if channels > 4:  # no image file has them: raw bytes only
            return raw(), parsed[self.label_feature]
        image = tf.cond(
            tf.strings.length(encoded) == height * width * channels,
            raw,
            lambda: images.decoded(encoded, self.image_shape),
        )
        return image, parsed[self.label_feature]


def _record_counts(model_dir: str | None) -> RecordCounts:
    from trainer.data.record_counts import RecordCounts

    return RecordCounts(model_dir)


def _skipped_records() -> SkippedRecords:
    from trainer.data.corrupt_records import SkippedRecords

    return SkippedRecords()


def checked_records(split: RecordFiles, counts: list[int], num_classes: int, skip: bool) -> tuple[list[int], int]:
    """Decodes every record of the split's files once (the data check, before any worker starts): how many hold
    each class id 0..num_classes-1, and how many do not decode (dropped under skip). Raises CorruptRecordError
    naming the file and record of the first that does not decode (unless skip), or whose id is out of range.
    counts: each file's records, as the record index has them."""
    import numpy as np
    import tensorflow as tf

    from trainer.data.corrupt_records import first_corrupt
    from trainer.data.datasets import LABEL_FIX

    totals, dropped = np.zeros(num_classes, np.int64), 0
    for path, count in zip(split.files, counts, strict=True):

        def decode(number: tf.Tensor, record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
            image, label = split._decode(record)
            return number, label, tf.reduce_max(image)  # a value of the image: an unused decode would be pruned

        decoded = tf.data.TFRecordDataset(path).enumerate().map(decode, tf.data.AUTOTUNE, deterministic=True)
        rows = list(decoded.ignore_errors().batch(1 << 16).as_numpy_iterator())
        numbers = np.concatenate([batch[0] for batch in rows]) if rows else np.zeros(0, np.int64)
        ids = np.concatenate([batch[1] for batch in rows]) if rows else np.zeros(0, np.int64)
        if len(numbers) < count and not skip:
            found = first_corrupt(path, None, split._decode)
            if found is not None:
                raise found.error("the data check")
        dropped += max(count - len(numbers), 0)
        outside = np.flatnonzero((ids < 0) | (ids >= num_classes))
        if outside.size:
            record, class_id = int(numbers[outside[0]]), int(ids[outside[0]])
            raise CorruptRecordError(
                f"the data check: {path}: record {record} has class id {class_id}, not in [0, {num_classes}) "
                f"(--num-classes {num_classes}, --label-feature {split.label_feature}); {LABEL_FIX}"
            )
        totals += np.bincount(ids, minlength=num_classes)
    return totals.tolist(), dropped


def glob_files(pattern: str, flag: str) -> tuple[str, ...]:
    """Every file matching the comma-separated globs, sorted (the same list on every worker); the record index
    beside the files (and its lock) is no data file, whatever the glob (`data/*` matches them too)."""
    import tensorflow as tf

    from trainer.data.record_counts import INDEX_NAME

    matched = {path for part in pattern.split(",") if part.strip() for path in tf.io.gfile.glob(part.strip())}
    files = sorted(path for path in matched if not os.path.basename(path).lstrip(".").startswith(INDEX_NAME))
    if not files:
        raise DataError(
            f"{flag} {pattern!r} matches no file; give a glob of TFRecord files (local path or any "
            f"URL tf.io.gfile opens), e.g. {flag} 'data/train-*.tfrecord'"
        )
    return tuple(files)


def parse_image_shape(text: str) -> tuple[int, int, int]:
    """HEIGHTxWIDTHxCHANNELS as three whole numbers; DataError saying what is wrong with the text otherwise."""
    accepted = "give HEIGHTxWIDTHxCHANNELS, three whole numbers of 1 or more, e.g. 28x28x1 or 224x224x3"
    parts = text.lower().replace(",", "x").split("x")
    try:
        shape = tuple(int(part) for part in parts)
    except ValueError:
        raise DataError(f"--image-shape {text!r}: not three whole numbers; {accepted}") from None
    if len(shape) != 3:
        raise DataError(f"--image-shape {text!r}: {len(shape)} number(s), not 3; {accepted}")
    names = [name for name, size in zip(("height", "width", "channels"), shape, strict=True) if size < 1]
    if names:
        raise DataError(f"--image-shape {text!r}: the {' and '.join(names)} cannot be 0 or less; {accepted}")
    return shape[0], shape[1], shape[2]


def check_flags(config: Config) -> None:
    """The flags --dataset tfrecord cannot do without, checked before the group forms (DataError)."""
    options = config.group(RecordOptions)
    missing = [
        flag
        for flag, value in (
            ("--train-files", options.train_files),
            ("--test-files", options.test_files),
            ("--image-shape", options.image_shape),
        )
        if not value
    ]
    if missing or options.num_classes < 2:
        raise DataError(
            f"--dataset tfrecord needs {', '.join(missing + ['--num-classes (2 or more)'])}: e.g. "
            f"--train-files 'data/train-*' --test-files 'data/test-*' --image-shape 28x28x1 "
            f"--num-classes 10"
        )
    parse_image_shape(options.image_shape)
    class_names(options)


@register("tfrecord", options=RecordOptions)
def source(config: Config) -> Source:
    """Your own TFRecord files: --train-files/--test-files globs, --image-shape, --num-classes, and the
    feature names --image-feature (default image) and --label-feature (default label)."""
    options = config.group(RecordOptions)
    shape = parse_image_shape(options.image_shape)
    # The record index goes beside the files, or into the model dir where their folder is read-only.
    counts = _record_counts(config.model_dir)
    skipped = _skipped_records() if options.on_corrupt_record == "skip" else None

    def split(pattern: str, flag: str) -> RecordFiles:
        files = glob_files(pattern, flag)
        return RecordFiles(files, shape, options.image_feature, options.label_feature, counts, skipped)

    return Source(
        train=split(options.train_files, "--train-files"),
        test=split(options.test_files, "--test-files"),
        element_spec=image_spec(shape),
        num_classes=options.num_classes,
        class_names=class_names(options),
    )


def class_names(options: RecordOptions) -> tuple[str, ...]:
    """--class-names as a tuple, one name per class id (DataError when they do not match --num-classes)."""
    names = tuple(name.strip() for name in options.class_names.split(",")) if options.class_names.strip() else ()
    if names and (len(names) != options.num_classes or not all(names) or len(set(names)) != len(names)):
        raise DataError(
            f"--class-names names {len(names)} classes for --num-classes {options.num_classes}: give one distinct, "
            f"non-empty name per class id, in id order, e.g. --class-names cat,dog,bird for --num-classes 3"
        )
    return names
