"""Datasets and the input pipeline.

Images stay uint8 all the way into the model (the model scales them), so the
training pipeline and the serving signature see the same raw input.

Sharding: every worker builds the same pipeline with the same seeded, per-epoch
shuffle, and tf.data's DATA auto-shard policy gives each worker its own slice of
every global batch. Same order everywhere means the slices are disjoint and
together cover each batch. `python -m trainer.data` prepares a TFDS dataset once
(the cluster's data-preparation Job), so workers never download concurrently.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import tensorflow as tf

from trainer.config import DATASETS, parse_config
from trainer.errors import DataError, UserError, first_line

TFDS_DATASETS = tuple(name for name in DATASETS if name != "synthetic")
SYNTHETIC_SHAPE = (28, 28, 1)  # the same as fashion_mnist
SYNTHETIC_CLASSES = 10
SYNTHETIC_TRAIN_SIZE = 60_000
SYNTHETIC_TEST_SIZE = 10_000


@dataclasses.dataclass(frozen=True)
class Splits:
    """Unbatched (uint8 image, int64 label) examples of both splits, with their sizes."""

    train: tf.data.Dataset
    test: tf.data.Dataset
    train_size: int
    test_size: int
    image_shape: tuple[int, int, int]
    num_classes: int


def load_splits(dataset: str, data_dir: str, seed: int, download: bool = False,
                train_examples: int = 0, test_examples: int = 0) -> Splits:
    """Loads a dataset by name; train_examples/test_examples > 0 keep only the first N."""
    if dataset == "synthetic":
        splits = synthetic_splits(seed, train_examples or SYNTHETIC_TRAIN_SIZE, test_examples or SYNTHETIC_TEST_SIZE)
    elif dataset in TFDS_DATASETS:
        splits = _tfds_splits(dataset, os.path.expanduser(data_dir), download)
    else:
        raise DataError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
    return _limit(splits, train_examples, test_examples)


def synthetic_splits(seed: int, train_size: int = SYNTHETIC_TRAIN_SIZE,
                     test_size: int = SYNTHETIC_TEST_SIZE) -> Splits:
    """A learnable stand-in for fashion_mnist: each class is a fixed blocky pattern plus noise.

    Example i is a pure function of (seed, i), generated inside the tf.data graph, so
    every worker builds identical data without I/O and without a large constant in the graph.
    """
    rng = np.random.default_rng(seed)
    # 7x7 class patterns blown up to 28x28: structure a small CNN can pick out of the noise.
    patterns = tf.constant(np.kron(rng.random((SYNTHETIC_CLASSES, 7, 7)), np.ones((4, 4))), tf.float32)

    def example(index: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        key = tf.stack([tf.constant(seed, tf.int64), index])
        label = tf.random.stateless_uniform((), key, maxval=SYNTHETIC_CLASSES, dtype=tf.int64)
        noise = tf.random.stateless_uniform((28, 28), key + [0, 1 << 40])
        image = (0.45 * tf.gather(patterns, label) + 0.55 * noise) * 255
        return tf.cast(image, tf.uint8)[..., tf.newaxis], label

    def split(first_index: int, size: int) -> tf.data.Dataset:
        return tf.data.Dataset.range(first_index, first_index + size).map(example)

    return Splits(
        train=split(0, train_size),
        test=split(1 << 32, test_size),  # a separate index range: no test example is a training example
        train_size=train_size,
        test_size=test_size,
        image_shape=SYNTHETIC_SHAPE,
        num_classes=SYNTHETIC_CLASSES,
    )


def _tfds_builder(dataset: str, data_dir: str):
    import tensorflow_datasets as tfds

    return tfds.builder(dataset, data_dir=data_dir)


def prepare(dataset: str, data_dir: str) -> str:
    """Downloads and prepares a TFDS dataset once; a no-op when it is already there."""
    builder = _tfds_builder(dataset, os.path.expanduser(data_dir))
    builder.download_and_prepare()
    return builder.data_dir


def _tfds_splits(dataset: str, data_dir: str, download: bool) -> Splits:
    builder = _tfds_builder(dataset, data_dir)
    if download:
        builder.download_and_prepare()
    elif not builder.is_prepared():
        raise DataError(
            f"dataset {dataset!r} is not prepared under --data-dir {data_dir}. Prepare it once with "
            f"`python -m trainer.data --dataset {dataset} --data-dir {data_dir}` (on the cluster, the "
            f"data-preparation Job does this), or pass --download to a single-process run. "
            f"--dataset synthetic needs no download."
        )
    train = builder.as_dataset(split="train", as_supervised=True)
    test = builder.as_dataset(split="test", as_supervised=True)
    features = builder.info.features
    return Splits(
        train=train,
        test=test,
        train_size=_count(train),
        test_size=_count(test),
        image_shape=tuple(features["image"].shape),
        num_classes=features["label"].num_classes,
    )


def _count(dataset: tf.data.Dataset) -> int:
    cardinality = int(dataset.cardinality())
    if cardinality >= 0:
        return cardinality
    return int(dataset.reduce(np.int64(0), lambda count, _: count + 1))


def _limit(splits: Splits, train_examples: int, test_examples: int) -> Splits:
    train, test = splits.train, splits.test
    train_size, test_size = splits.train_size, splits.test_size
    if 0 < train_examples < train_size:
        train, train_size = train.take(train_examples), train_examples
    if 0 < test_examples < test_size:
        test, test_size = test.take(test_examples), test_examples
    return dataclasses.replace(splits, train=train, test=test, train_size=train_size, test_size=test_size)


def _sharded_by_data(dataset: tf.data.Dataset) -> tf.data.Dataset:
    options = tf.data.Options()
    # FILE sharding fails on in-memory sources; DATA works on any source once the order is the same.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    options.deterministic = True
    return dataset.with_options(options)


def train_pipeline(examples: tf.data.Dataset, size: int, global_batch_size: int, seed: int,
                   epochs: int, start_step: int = 0) -> tf.data.Dataset:
    """Global batches for every step from `start_step` to the end of the last epoch.

    Epoch e is shuffled with a seed derived from (seed, e) and cut into
    size // global_batch_size full batches, so step s always sees the same
    examples, whichever worker and however often the job restarted.
    """
    steps_per_epoch = size // global_batch_size
    if steps_per_epoch < 1:
        raise DataError(
            f"the training split has {size} examples, fewer than one global batch of {global_batch_size}; "
            f"lower --per-worker-batch-size or use more --train-examples"
        )
    start_epoch, skip_in_epoch = divmod(start_step, steps_per_epoch)
    cached = examples.cache()
    base_seed = tf.constant(seed, tf.int64)

    def epoch_batches(epoch: tf.Tensor) -> tf.data.Dataset:
        shuffled = cached.shuffle(size, seed=base_seed * 1_000_003 + epoch, reshuffle_each_iteration=False)
        return shuffled.batch(global_batch_size, drop_remainder=True)

    batches = tf.data.Dataset.range(start_epoch, epochs).flat_map(epoch_batches).skip(skip_in_epoch)
    return _sharded_by_data(batches.prefetch(tf.data.AUTOTUNE))


def test_pipeline(examples: tf.data.Dataset, global_batch_size: int) -> tf.data.Dataset:
    """Every test example once, in global batches (the last may be partial)."""
    return _sharded_by_data(examples.cache().batch(global_batch_size).prefetch(tf.data.AUTOTUNE))


def main(argv: list[str] | None = None) -> int:
    """`python -m trainer.data`: prepares --dataset in --data-dir; reads the trainer's flags and TRAINER_* variables."""
    try:
        config = parse_config(argv)
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if config.dataset == "synthetic":
        print("dataset synthetic is generated in memory; nothing to prepare", flush=True)
        return 0
    try:
        path = prepare(config.dataset, config.data_dir)
    except Exception as error:  # noqa: BLE001 (TFDS raises many kinds; the user needs the same advice for each)
        print(f"error: preparing {config.dataset} in {config.data_dir} failed ({type(error).__name__}: "
              f"{first_line(error)[:300]}). Check the network or proxy and that the directory is writable, then run "
              f"again; --dataset synthetic needs no download.", file=sys.stderr)
        return 1
    print(f"dataset {config.dataset} is ready at {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
