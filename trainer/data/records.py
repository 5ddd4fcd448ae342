"""`python -m trainer.data.records`: writes a dataset of TFRecord shards, of any size and shard count, in the
format `--dataset tfrecord` reads (tf.train.Example with `image`: encoded PNG or raw uint8 bytes,
`label`: int64, and `index`: int64, the example's position in its split, for checks).

The examples are the synthetic task's (trainer/data/synthetic.py), so a model trained on the files reaches the
same documented best accuracy. Used by the tests and the benchmark; also a template for exporting your
own data:

    python -m trainer.data.records --out data/ --train-examples 60000 --train-shards 8 \\
        --test-examples 10000 --test-shards 2
    python -m trainer --dataset tfrecord --train-files 'data/train-*' --test-files 'data/test-*' \\
        --image-shape 28x28x1 --num-classes 10
"""

from __future__ import annotations

import argparse
import os
import sys

import tensorflow as tf

from trainer.data import datasets, synthetic
from trainer.data.record_counts import RecordCounts


def _example(image: bytes, label: int, index: int) -> bytes:
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
        "index": tf.train.Feature(int64_list=tf.train.Int64List(value=[index])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_split(out_dir: str, split: str, examples: int, shards: int, seed: int, encoding: str) -> list[str]:
    """Writes examples 0..examples-1 of the split into `shards` files of (nearly) equal size; returns them."""
    example = synthetic.example_fn(seed)
    offset = 0 if split == "train" else datasets.TEST_INDEX_OFFSET
    paths, first = [], 0
    for shard in range(shards):
        size = datasets.share(examples, shard, shards)
        generated = tf.data.Dataset.range(first, first + size).map(
            lambda i: (i, *_encoded(*example(offset + i), encoding)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
        path = os.path.join(out_dir, f"{split}-{shard:05d}-of-{shards:05d}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for index, image, label in generated.as_numpy_iterator():
                writer.write(_example(image if encoding == "png" else image.tobytes(), int(label), int(index)))
        paths.append(path)
        first += size
    # The record index beside the files: no trainer start ever counts them.
    RecordCounts(None).store({path: datasets.share(examples, shard, shards) for shard, path in enumerate(paths)})
    return paths


def _encoded(image: tf.Tensor, label: tf.Tensor, encoding: str) -> tuple[tf.Tensor, tf.Tensor]:
    return (tf.io.encode_png(image) if encoding == "png" else image), label


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.data.records",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--out", required=True, help="directory for train-NNNNN-of-NNNNN.tfrecord and test-...")
    parser.add_argument("--train-examples", type=int, default=synthetic.TRAIN_SIZE)
    parser.add_argument("--train-shards", type=int, default=8)
    parser.add_argument("--test-examples", type=int, default=synthetic.TEST_SIZE)
    parser.add_argument("--test-shards", type=int, default=2)
    parser.add_argument("--seed", type=int, default=42, help="the synthetic task's seed (as the trainer's --seed)")
    parser.add_argument(
        "--encoding", choices=("png", "raw"), default="png", help="png: encoded PNG; raw: the HxWxC uint8 bytes"
    )
    args = parser.parse_args(argv)
    for name in ("train_examples", "train_shards", "test_examples", "test_shards"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    os.makedirs(args.out, exist_ok=True)
    for split in ("train", "test"):
        examples, shards = getattr(args, f"{split}_examples"), getattr(args, f"{split}_shards")
        write_split(args.out, split, examples, min(shards, examples), args.seed, args.encoding)
        print(f"wrote {examples} {split} examples in {min(shards, examples)} files to {args.out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
