"""What a dataset is and how to add one: the interface a fork reads.

A dataset is a function (config) -> Source decorated with @datasets.register("name") (from trainer.api), in your
own module passed as `--module my_pkg.my_data` (imported before the group forms; the one dataset it registers is the
default --dataset). A Source holds two Splits and what one example
is; a Split says how worker `index` of `count` reads its part, as a Shard. Two Splits are here for your data:
`Generated` (an indexed function, sharded by index range) and `Arrays` (numpy arrays in memory, e.g. a CSV's
columns, sharded by row range). A dataset may declare its options, `@register("name", options=YourOptions)`: a
frozen dataclass of option(...) fields, flags and TRAINER_* variables under "dataset <name>" in --help, read in the
function as `config.group(YourOptions)`.

The built-in kinds live in modules of their own, which a fork never opens: synthetic.py, tfrecord.py (your TFRecord
files) and tfds.py (any TFDS name); catalog.py finds a dataset by its name. TensorFlow is imported where it is used,
so the flags are read without it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from trainer.base.errors import DataError
from trainer.moved import moved_name
from trainer.settings.options import Registry

if TYPE_CHECKING:
    import tensorflow as tf

    Example = tuple[Any, Any]  # one decoded example: (features, targets), each a nest of tensors

TEST_INDEX_OFFSET = 1 << 40  # a Generated test split from here: none of its examples is a training example


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
    # Reads the shard's data again after a failed read, to name what failed: its UserError, else None
    # (where the files are TFRecords, `files` does this instead)
    scan: Callable[[str], Exception | None] | None = None


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
    ids (0..num_classes-1); 0 when they are not (a regression's numbers). class_names: class i's name, where the
    dataset knows them (image_folder's folders, a TFDS label's names, --class-names); the exported model and
    metrics.json carry them, so a served answer says "seven", not 5."""

    train: Split
    test: Split
    element_spec: tuple[Any, Any]
    num_classes: int = 0
    class_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.class_names and len(self.class_names) != self.num_classes:
            raise DataError(
                f"the dataset names {len(self.class_names)} classes ({', '.join(self.class_names[:5])}"
                f"{', ...' if len(self.class_names) > 5 else ''}) but has num_classes {self.num_classes}: give one "
                f"name per class id 0..num_classes-1"
            )

    @property
    def names_of_classes(self) -> tuple[str, ...]:
        """Every class's name: the dataset's, else the class id in words ("0", "1", ...); () without classes."""
        return self.class_names or tuple(str(class_id) for class_id in range(self.num_classes))

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


LABEL_OUT_OF_RANGE = "class id out of range"  # the label check's words, which the error after a failed read looks for
LABEL_FIX = (
    "write class ids 0..num_classes-1 that mean the same class in every split: check --num-classes and the label "
    "feature of the files (skipping cannot help: the record reads, its label is wrong)"
)


def checked_shard(source: Source, split: Split, index: int, count: int) -> Shard:
    """Worker `index` of `count`'s shard of one of source's splits, with its class ids checked (with_label_check)
    where the targets are one integer class id per example."""
    shard = split.shard(index, count)
    targets = source.element_spec[1]
    class_ids = source.num_classes > 0 and hasattr(targets, "dtype") and targets.dtype.is_integer
    return with_label_check(shard, source.num_classes) if class_ids else shard


def with_label_check(shard: Shard, num_classes: int) -> Shard:
    """The shard with each decoded example's class id checked against [0, num_classes): one outside fails the read
    with LABEL_OUT_OF_RANGE and the record's number where the record is one (an index or row), never a silent run
    (on a GPU, an id past the logits is no error). A serialized record is left out of the message: its bytes are not
    UTF-8, and TensorFlow's error then fails to decode its own text (a traceback, exit 1); corrupt_records.named
    finds that record's file and number by reading the files again."""
    import tensorflow as tf

    def decode(*record: Any) -> Example:
        features, label = shard.decode(*record)
        inside = tf.reduce_all((label >= 0) & (label < num_classes))
        message = [LABEL_OUT_OF_RANGE, label, f"is not in [0, {num_classes})"]
        number = record[0] if len(record) == 1 and isinstance(record[0], tf.Tensor) else None
        if number is not None and number.dtype.is_integer and number.shape.rank == 0:
            message += ["in record", number]
        with tf.control_dependencies([tf.debugging.Assert(inside, message, summarize=3)]):
            return features, tf.identity(label)

    return dataclasses.replace(shard, decode=decode)


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


if not TYPE_CHECKING:  # mypy keeps checking every other name of this module

    def __getattr__(name: str) -> Any:
        """Names that moved to their kind's module (TfdsOptions, RecordOptions), for forks written before."""
        return moved_name(__name__, name)
