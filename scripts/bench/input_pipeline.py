"""One worker's input pipeline alone, on TFRecord files: examples/s with decoding, no training step.

    python -m scripts.bench.input_pipeline --files 'DIR/train-*' --workers 2 --batch 64 --steps 400

Builds exactly what the trainer feeds worker 0 of `--workers` (trainer.data.tfrecord.RecordFiles sharded by file,
trainer.data.pipeline.train_batches with --cache none, so every record is read and decoded), iterates it, and
prints one JSON line: examples/s after `--warmup-steps` batches. `make bench` runs it beside the trainer on
the same files, so the two figures say whether input could starve the step.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from trainer.context import parse_config
from trainer.data import pipeline, tfrecord


def measure(files: str, workers: int, batch: int, steps: int, warmup_steps: int, image_shape: str) -> dict:
    shape = tfrecord.parse_image_shape(image_shape)
    shard = tfrecord.RecordFiles(tfrecord.glob_files(files, "--files"), shape).shard(0, workers)
    defaults = parse_config([], environ={})
    steps_per_epoch = pipeline.steps_per_epoch([shard.size], batch)
    epochs = -(-steps // steps_per_epoch)
    batches = pipeline.train_batches(
        shard,
        0,
        batch,
        steps_per_epoch * batch,
        defaults.seed,
        epochs,
        0,
        steps_per_epoch,
        defaults.shuffle_buffer,
        "none",
    )
    iterator = iter(batches.take(steps))
    for _ in range(warmup_steps):
        next(iterator)
    started = time.perf_counter()
    measured = sum(1 for _ in iterator)
    seconds = time.perf_counter() - started
    return {
        "examples_per_second": measured * batch / seconds,
        "steps": measured,
        "batch": batch,
        "shard_files": shard.reads,
        "workers": workers,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench.input_pipeline", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--files", required=True, help="glob of the TFRecord files (trainer.data.records' train-*)")
    parser.add_argument("--workers", type=int, default=2, help="the group size: worker 0 reads its share")
    parser.add_argument("--batch", type=int, required=True, help="the per-worker batch")
    parser.add_argument("--steps", type=int, required=True, help="batches in all, warm-up included")
    parser.add_argument("--warmup-steps", type=int, default=16, help="batches left out of examples/s")
    parser.add_argument("--image-shape", default="28x28x1")
    args = parser.parse_args(argv)
    if args.steps <= args.warmup_steps:
        parser.error(f"--steps ({args.steps}) must be more than --warmup-steps ({args.warmup_steps})")
    print(
        json.dumps(measure(args.files, args.workers, args.batch, args.steps, args.warmup_steps, args.image_shape)),
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
