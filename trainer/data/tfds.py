"""Any TFDS image-classification dataset (--dataset <its TFDS name>), prepared under --data-dir: its options
(`TfdsOptions`), and each worker reading its tfds.even_splits part."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from trainer.base.errors import DataError
from trainer.data.datasets import Shard, Source, image_spec
from trainer.settings.config import Config
from trainer.settings.options import option


def knows(name: str) -> bool:
    """Whether TFDS has a dataset of this name."""
    import tensorflow_datasets as tfds

    try:
        tfds.builder_cls(name)
    except Exception:  # noqa: BLE001 (TFDS raises its own not-found errors, which list every dataset)
        return False
    return True


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


def source(config: Config) -> Source:
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
        class_names=tuple(features["label"].names),  # the builder's names ("T-shirt/top", ...), else "0", "1", ...
    )
