"""Datasets by name, in one registry like the models: where the examples come from and how each worker
gets its own part of a split.

Built in: `synthetic` (generated in the graph, any size), `tfrecord` (your own files, `--train-files` /
`--test-files`), and any TFDS image-classification dataset by its TFDS name (prepared under --data-dir).

To add a dataset: write a function (config) -> Source and decorate it with @register("name"), in
this file or in your own module passed as `--dataset-module my_pkg.my_data` (imported before the group
forms). A Source holds two Splits; a Split says how worker `index` of `count` reads its part:
`RecordFiles` (sharded by file, or by element when there are fewer files than workers),
`Generated` (an indexed function, sharded by index range), `Arrays` (numpy arrays in memory, e.g. a CSV's
columns, sharded by row range), or `TfdsSplit` (per-worker TFDS subsplits). A dataset of your own may declare
its options: `@register("name", options=YourOptions)`.

A dataset kind's own options are an option group declared beside it (`RecordOptions`, `TfdsOptions`, yours):
flags and TRAINER_* variables like the core ones, under the kind's heading in --help, read with
`config.group(RecordOptions)`. TensorFlow is imported where it is used, so the flags are read without it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import logging
import math
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from trainer.base.errors import ConfigError, DataError
from trainer.settings.config import Config
from trainer.settings.options import Registry, option

if TYPE_CHECKING:
    import tensorflow as tf

    from trainer.data.corrupt_records import SkippedRecords
    from trainer.data.record_counts import RecordCounts

    Example = tuple[Any, Any]  # one decoded example: (features, targets), each a nest of tensors

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Shard:
    """One worker's part of a split: its records in a per-epoch order, and how to decode one."""

    records: Callable[[tf.Tensor], tf.data.Dataset]  # the epoch's seed (the same on every worker) -> undecoded records
    decode: Callable[..., Example]
    size: int  # examples in this shard
    shuffled: bool  # records(seed) is already a full per-epoch permutation: no shuffle buffer needed
    reads: str  # what this worker reads, for the one log line
    every_worker_reads_all: bool = False  # the element-sharding fallback: worth a warning
    # (path, records the index counted) of each file read, for the scan that names a corrupt one (corrupt_records.py)
    files: tuple[tuple[str, int], ...] = ()
    # --on-corrupt-record skip: records(seed) may yield fewer than `size`; skipped() says how many it dropped so far
    skipped: Callable[[], int] | None = None


class Split(Protocol):
    def shard(self, index: int, count: int) -> Shard: ...


def fingerprint(split: Split) -> str:
    """What examples a split holds, in a few words: recorded with the checkpoints, so a resume on other training
    data is refused. A split that does not say (no `fingerprint` method) is named by its class."""
    says = getattr(split, "fingerprint", None)
    return str(says()) if callable(says) else type(split).__name__


@dataclasses.dataclass(frozen=True)
class Source:
    """A dataset: its two splits and what one decoded example is, in words any task reads.

    element_spec: the (features, targets) pair of one example, each a nest of tf.TensorSpec (what a task builds
    its model and serving signature from). num_classes: how many classes the targets name when they are class
    ids (0..num_classes-1); 0 when they are not (a regression's numbers)."""

    train: Split
    test: Split
    element_spec: tuple[Any, Any]
    num_classes: int = 0

    @property
    def example_bytes(self) -> int:
        """Bytes of one decoded example, every tensor of element_spec: what the auto cache is sized with."""
        import tensorflow as tf

        return sum(
            math.prod(spec.shape) * spec.dtype.size
            for spec in tf.nest.flatten(self.element_spec)
            if spec.shape.is_fully_defined()
        )


def image_spec(shape: tuple[int, ...]) -> tuple[Any, Any]:
    """The element_spec of the built-in datasets: a uint8 image of this shape and an int64 class id."""
    import tensorflow as tf

    return tf.TensorSpec(shape, tf.uint8), tf.TensorSpec((), tf.int64)


def share(total: int, index: int, count: int) -> int:
    """Part `index` of `total` items split as evenly as possible into `count` parts (the first ones take the rest)."""
    return total // count + (1 if index < total % count else 0)


SourceBuilder = Callable[..., Source]
DATASETS: Registry[SourceBuilder] = Registry()
DATASET_OPTIONS: dict[str, type] = {}  # a registered dataset's option group, where it declares one


def register(name: str, options: type | None = None) -> Callable[[SourceBuilder], SourceBuilder]:
    """A decorator: @register("name") makes a function (config) -> Source --dataset name. options: its option
    group, a frozen dataclass of trainer.settings.options.option(...) fields: flags and TRAINER_* variables under
    "dataset <name>" in --help, read in the function as config.group(options)."""

    def add(builder: SourceBuilder) -> SourceBuilder:
        if options is not None:
            DATASET_OPTIONS[name] = options
        return DATASETS.register(name)(builder)

    return add


def option_groups() -> list[tuple[str, type]]:
    """Every dataset kind's options, parsed beside the core ones whatever --dataset is (settings.env sets them
    all): (heading in --help, option group), the built-in kinds' first, then those of --dataset-module."""
    return [
        ("dataset tfrecord (your TFRecord files)", RecordOptions),
        ("TFDS datasets (--dataset <a TFDS name>)", TfdsOptions),
        *((f"dataset {name}", options) for name, options in DATASET_OPTIONS.items() if name != "tfrecord"),
    ]


def import_dataset_module(module: str, flag: str = "--dataset-module") -> None:
    """Imports the module `flag` names, which registers its datasets (and their option groups)."""
    if not module:
        return
    try:
        importlib.import_module(module)
    except ImportError as error:
        raise DataError(
            f"{flag} {module}: cannot import it ({error}); put its directory on PYTHONPATH or install "
            f"it in the trainer's environment"
        ) from None


def check_dataset(config: Config) -> None:
    """Validates --dataset (and the flags it needs) without touching data or TensorFlow's runtime: call it
    before the group forms, so a typo never costs a start-up. Raises DataError."""
    import_dataset_module(config.dataset_module)
    if config.dataset in DATASETS:
        if config.dataset == "tfrecord":
            _check_record_flags(config)
        return
    if not _is_tfds_name(config.dataset):
        raise DataError(
            f"--dataset: unknown dataset {config.dataset!r}; choose one of {', '.join(sorted(DATASETS))}, "
            f"any TFDS image-classification dataset name, or register your own with "
            f"@trainer.data.datasets.register in a module given as --dataset-module"
        )


def load(config: Config) -> Source:
    """The Source of --dataset; for TFDS names, the prepared builder under --data-dir."""
    check_dataset(config)
    builder = DATASETS.get(config.dataset, tfds_source)
    return builder(config)


def _is_tfds_name(name: str) -> bool:
    import tensorflow_datasets as tfds

    try:
        tfds.builder_cls(name)
    except Exception:  # noqa: BLE001 (TFDS raises its own not-found errors, which list every dataset)
        return False
    return True


# --- in memory or generated: split by index range ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Generated:
    """Examples first_index .. first_index + size - 1 of `example`; worker k of n gets a contiguous range.

    Each epoch visits the worker's range in a seeded permutation (tf.random.experimental.index_shuffle), a
    full shuffle in constant memory, and resuming at any position generates nothing it skips.
    """

    example: Callable[[tf.Tensor], Example]
    size: int
    first_index: int = 0

    def fingerprint(self) -> str:
        return f"generated examples {self.first_index}..{self.first_index + self.size - 1}"

    def shard(self, index: int, count: int) -> Shard:
        start = self.first_index + index * (self.size // count) + min(index, self.size % count)
        size = share(self.size, index, count)
        import tensorflow as tf

        def records(seed: tf.Tensor) -> tf.data.Dataset:
            key = tf.stack([tf.cast(seed, tf.int64), tf.constant(index, tf.int64)])
            return tf.data.Dataset.range(size).map(
                lambda i: start + tf.random.experimental.index_shuffle(i, key, max(size - 1, 0))
            )

        return Shard(
            records, self.example, size, shuffled=True, reads=f"generated examples {start}..{start + size - 1}"
        )


@dataclasses.dataclass(frozen=True, eq=False)  # arrays compare element-wise: identity is equality here
class Arrays:
    """Examples held in memory as arrays: `features` and `targets`, each a numpy array (or a dict or tuple of them)
    whose first dimension counts the examples, e.g. columns read from a CSV with numpy.

    Worker k of n takes a contiguous range of rows and keeps only those, as constants of its input graph (so a
    split must stay under TensorFlow's 2 GiB graph limit per worker); each epoch visits the range in a seeded
    permutation, as Generated does, so a resume at any step is exact.
    """

    features: Any
    targets: Any

    @property
    def size(self) -> int:
        import tensorflow as tf

        return len(tf.nest.flatten(self.features)[0])

    def fingerprint(self) -> str:
        import numpy as np
        import tensorflow as tf

        digest = hashlib.sha256()
        for array in tf.nest.flatten((self.features, self.targets)):
            array = np.ascontiguousarray(array)
            digest.update(f"{array.dtype}{array.shape}".encode())
            digest.update(array.tobytes())
        return f"{self.size} rows in memory, sha256 {digest.hexdigest()[:16]}"

    def shard(self, index: int, count: int) -> Shard:
        import tensorflow as tf

        sizes = {len(array) for array in tf.nest.flatten((self.features, self.targets))}
        if len(sizes) != 1:
            raise DataError(
                f"arrays of different lengths {sorted(sizes)}: every feature and target array needs one row per example"
            )
        start = index * (self.size // count) + min(index, self.size % count)
        size = share(self.size, index, count)
        rows = tf.nest.map_structure(
            lambda array: tf.constant(array[start : start + size]), (self.features, self.targets)
        )

        def records(seed: tf.Tensor) -> tf.data.Dataset:
            key = tf.stack([tf.cast(seed, tf.int64), tf.constant(index, tf.int64)])
            return tf.data.Dataset.range(size).map(
                lambda i: tf.random.experimental.index_shuffle(i, key, max(size - 1, 0))
            )

        def decode(row: tf.Tensor) -> Example:
            features, targets = tf.nest.map_structure(lambda column: tf.gather(column, row), rows)
            return features, targets

        return Shard(records, decode, size, shuffled=True, reads=f"rows {start}..{start + size - 1} held in memory")


def arrays_spec(features: Any, targets: Any) -> tuple[Any, Any]:
    """The element_spec of one example of these arrays: each array's shape without its first dimension."""
    import numpy as np
    import tensorflow as tf

    return tf.nest.map_structure(
        lambda array: tf.TensorSpec(np.shape(array)[1:], tf.as_dtype(np.asarray(array).dtype)), (features, targets)
    )


# --- synthetic: a task with a known best accuracy --------------------------------------------------------

SYNTHETIC_SHAPE = (28, 28, 1)  # the same as fashion_mnist
SYNTHETIC_CLASSES = 10
SYNTHETIC_TRAIN_SIZE = 60_000
SYNTHETIC_TEST_SIZE = 10_000
# Each label is replaced by a different, uniformly drawn class with this probability. The image shows its
# true class clearly, so the best any model can score on the (equally noisy) test split is 1 - this.
SYNTHETIC_LABEL_NOISE = 0.1
SYNTHETIC_BEST_ACCURACY = 1 - SYNTHETIC_LABEL_NOISE
TEST_INDEX_OFFSET = 1 << 40  # test examples come from another index range: none is a training example


def synthetic_example_fn(seed: int) -> Callable[[tf.Tensor], Example]:
    """Example i as a pure function of (seed, i): a fixed blocky pattern per class plus noise, and a label
    that is the true class with probability 1 - SYNTHETIC_LABEL_NOISE."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    # 7x7 class patterns blown up to 28x28: structure a small CNN can pick out of the noise.
    patterns = tf.constant(np.kron(rng.random((SYNTHETIC_CLASSES, 7, 7)), np.ones((4, 4))), tf.float32)

    def example(index: tf.Tensor) -> Example:
        key = tf.stack([tf.constant(seed, tf.int64), tf.cast(index, tf.int64)])
        true_class = tf.random.stateless_uniform((), key, maxval=SYNTHETIC_CLASSES, dtype=tf.int64)
        noise = tf.random.stateless_uniform((28, 28), key + [0, 1 << 60])
        image = tf.cast((0.45 * tf.gather(patterns, true_class) + 0.55 * noise) * 255, tf.uint8)[..., tf.newaxis]
        flip = tf.random.stateless_uniform((), key + [0, 2 << 60]) < SYNTHETIC_LABEL_NOISE
        other = tf.random.stateless_uniform((), key + [0, 3 << 60], minval=1, maxval=SYNTHETIC_CLASSES, dtype=tf.int64)
        label = tf.where(flip, (true_class + other) % SYNTHETIC_CLASSES, true_class)
        return image, label

    return example


@register("synthetic")
def synthetic(config: Config) -> Source:
    """Generated in the graph from --seed: any --train-examples (default 60,000), no files, no download."""
    example = synthetic_example_fn(config.seed)
    return Source(
        train=Generated(example, config.train_examples or SYNTHETIC_TRAIN_SIZE),
        test=Generated(example, config.test_examples or SYNTHETIC_TEST_SIZE, TEST_INDEX_OFFSET),
        element_spec=image_spec(SYNTHETIC_SHAPE),
        num_classes=SYNTHETIC_CLASSES,
    )


# --- your own files: TFRecord of tf.train.Example ----------------------------------------------------------


ON_CORRUPT_RECORD = ("fail", "skip")


@dataclasses.dataclass(frozen=True)
class RecordOptions:
    """The options of --dataset tfrecord."""

    train_files: str = option("", "glob(s) of training TFRecord files, comma-separated (tf.io.gfile paths)")
    test_files: str = option("", "glob(s) of test TFRecord files, comma-separated")
    image_shape: str = option("", "HEIGHTxWIDTHxCHANNELS the model takes; images are resized to it")
    num_classes: int = option(0, "number of classes (0..N-1)")
    image_feature: str = option("image", "tf.train.Example feature with the PNG/JPEG or raw uint8 image")
    label_feature: str = option("label", "tf.train.Example int64 feature with the class")
    on_corrupt_record: str = option(
        "fail",
        "a truncated file, a checksum mismatch or a record that is not the expected tf.train.Example: fail "
        "(exit 2, naming the file) or skip it (logged once per file, counted in metrics.json; see docs/data.md)",
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
        read = tf.data.TFRecordDataset if self.skipped is None else self.skipped.reader(files, self._parse)

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
        image = tf.cond(
            tf.strings.length(encoded) == height * width * channels,
            lambda: tf.reshape(tf.io.decode_raw(encoded, tf.uint8), self.image_shape),
            lambda: tf.io.decode_image(encoded, channels=channels, expand_animations=False, dtype=tf.uint8),
        )
        image = tf.cond(
            tf.reduce_all(tf.shape(image)[:2] == [height, width]),
            lambda: image,
            lambda: tf.cast(tf.clip_by_value(tf.round(tf.image.resize(image, (height, width))), 0, 255), tf.uint8),
        )
        return tf.ensure_shape(image, self.image_shape), parsed[self.label_feature]


def _record_counts(model_dir: str | None) -> RecordCounts:
    from trainer.data.record_counts import RecordCounts

    return RecordCounts(model_dir)


def _skipped_records() -> SkippedRecords:
    from trainer.data.corrupt_records import SkippedRecords

    return SkippedRecords()


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
    try:
        shape = tuple(int(part) for part in text.lower().replace(",", "x").split("x"))
    except ValueError:
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise DataError(f"--image-shape {text!r}: give HEIGHTxWIDTHxCHANNELS, e.g. 28x28x1 or 224x224x3")
    return shape[0], shape[1], shape[2]


def _check_record_flags(config: Config) -> None:
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


@register("tfrecord", options=RecordOptions)
def tfrecord(config: Config) -> Source:
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
    )


# --- TFDS -----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TfdsOptions:
    """The options of a TFDS --dataset (any TFDS name)."""

    data_dir: str = option("~/tensorflow_datasets", "TFDS data directory (on the cluster: the shared volume)")
    download: bool = option(False, "download and prepare the dataset if missing; leave off on workers")


@dataclasses.dataclass(frozen=True)
class TfdsSplit:
    """A prepared TFDS split; worker k of n reads the subsplit tfds.even_splits(split, n)[k], that is only the
    file ranges holding its 1/n of the examples (any number of shards, so no fallback is needed)."""

    builder: Any  # a prepared tfds.core.DatasetBuilder
    split: str

    def fingerprint(self) -> str:
        return f"TFDS {self.builder.info.full_name} split {self.split}"

    def shard(self, index: int, count: int) -> Shard:
        import tensorflow_datasets as tfds

        subsplit = tfds.even_splits(self.split, count)[index] if count > 1 else self.split
        dataset = self.builder.as_dataset(split=subsplit, as_supervised=True, shuffle_files=False)
        splits = self.builder.info.splits
        # The builder's metadata: nothing is read (tfds.testing.mock_data leaves it empty; its datasets know their size)
        size = splits[subsplit].num_examples if splits else int(dataset.cardinality())
        return Shard(
            lambda seed: dataset,
            lambda image, label: (image, label),
            size,
            shuffled=False,
            reads=f"TFDS split {self.split}, part {index + 1} of {count} (tfds.even_splits)",
        )


def tfds_source(config: Config) -> Source:
    """Any TFDS image-classification dataset: shape and classes from the builder's info."""
    import tensorflow_datasets as tfds

    options = config.group(TfdsOptions)
    data_dir = os.path.expanduser(options.data_dir)
    builder = tfds.builder(config.dataset, data_dir=data_dir)
    if options.download:
        builder.download_and_prepare()
    elif not builder.is_prepared():
        raise DataError(
            f"dataset {config.dataset!r} is not prepared under --data-dir {data_dir}. Prepare it once with "
            f"`python -m trainer.data --dataset {config.dataset} --data-dir {data_dir}` (on the cluster, the "
            f"data-preparation Job does this), or pass --download to a single-process run. "
            f"--dataset synthetic needs no download."
        )
    features = builder.info.features
    if "image" not in features or "label" not in features or not hasattr(features["label"], "num_classes"):
        raise DataError(
            f"TFDS dataset {config.dataset!r} is not image classification (it needs 'image' and a "
            f"class 'label' feature); use --dataset tfrecord with your own files instead"
        )
    shape = tuple(features["image"].shape)
    if None in shape:
        raise DataError(
            f"TFDS dataset {config.dataset!r} has images of varying size {shape}; export it to "
            f"TFRecord files and train with --dataset tfrecord --image-shape HxWxC, which resizes"
        )
    splits = builder.info.splits
    test_split = "validation" if "test" not in splits and "validation" in splits else "test"
    return Source(
        train=TfdsSplit(builder, "train"),
        test=TfdsSplit(builder, test_split),
        element_spec=image_spec(shape),
        num_classes=features["label"].num_classes,
    )
