"""The tutorial-style peer that `make bench` measures the trainer against.

Written the way TensorFlow's "Multi-worker training with Keras" tutorial teaches:
tf-keras (TF_USE_LEGACY_KERAS=1 before TensorFlow is imported), a
MultiWorkerMirroredStrategy, the model built and compiled in strategy.scope(),
and model.fit on a dataset batched by the global batch size. The model is the
book's CNN and the data synthetic 28x28x1 images, the same as the trainer's.

Run it with TF_CONFIG (one process per worker) or without (one process). Its last
stdout line is a JSON object: steady-state examples/s (warm-up excluded), seconds
from process start to the first finished step, and this process's peak RSS.
"""

from __future__ import annotations

import os

# tf-keras only answers to `tf.keras` if this is set before TensorFlow loads.
os.environ["TF_USE_LEGACY_KERAS"] = "1"

import argparse
import json
import resource
import sys
import time

import numpy as np
import psutil
import tensorflow as tf
import tf_keras

from scripts.common.processes import peak_rss_bytes

IMAGE_SHAPE = (28, 28, 1)
CLASSES = 10


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--per-worker-batch-size", type=int, default=64, help="examples per worker per step")
    parser.add_argument("--steps", type=int, default=300, help="training steps in total, warm-up included")
    parser.add_argument("--warmup-steps", type=int, default=30, help="first steps left out of examples/s")
    parser.add_argument("--examples", type=int, default=8192, help="synthetic training examples (repeated)")
    parser.add_argument("--seed", type=int, default=42, help="seed for data, shuffling and weights")
    args = parser.parse_args(argv)
    if args.per_worker_batch_size < 1 or args.examples < 1:
        parser.error("--per-worker-batch-size and --examples must be at least 1")
    if not 0 <= args.warmup_steps < args.steps:
        parser.error(f"--warmup-steps must be 0 or more and below --steps ({args.steps}), got {args.warmup_steps}")
    return args


def synthetic_dataset(examples: int, global_batch_size: int, seed: int) -> tf.data.Dataset:
    """Random uint8 images scaled to [0, 1] and random labels, like the tutorial's MNIST pipeline."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, size=(examples, *IMAGE_SHAPE), dtype=np.uint8).astype(np.float32) / 255.0
    labels = rng.integers(0, CLASSES, size=(examples,), dtype=np.int64)
    # Seeded so every worker shuffles alike before the strategy shards by data.
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    return dataset.shuffle(examples, seed=seed).repeat().batch(global_batch_size)


def build_and_compile_cnn_model() -> tf.keras.Model:
    """The book's CNN, compiled as the tutorial compiles its model."""
    model = tf.keras.Sequential(
        [
            tf.keras.layers.Input(shape=IMAGE_SHAPE),
            tf.keras.layers.Conv2D(32, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(64, 3, activation="relu"),
            tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(64, 3, activation="relu"),
            tf.keras.layers.Flatten(),
            tf.keras.layers.Dense(64, activation="relu"),
            tf.keras.layers.Dense(CLASSES),
        ]
    )
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.Adam(learning_rate=1e-3),
        metrics=["accuracy"],
    )
    return model


class StepTimer(tf.keras.callbacks.Callback):
    """Notes when each step finishes, without pulling the logs back to Python."""

    def __init__(self, warmup_steps: int):
        super().__init__()
        # Leaves the logs as tensors, so timing adds no per-step host sync of its own.
        self._supports_tf_logs = True
        self.warmup_steps = warmup_steps
        self.steps_done = 0
        self.first_step_end = None
        self.warmup_end = None
        self.last_step_end = None

    def on_train_batch_end(self, batch, logs=None):
        now = time.time()
        self.steps_done += 1
        if self.steps_done == 1:
            self.first_step_end = now
        if self.steps_done == self.warmup_steps:
            self.warmup_end = now
        self.last_step_end = now


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = psutil.Process().create_time()
    tf.keras.utils.set_random_seed(args.seed)

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    workers = strategy.num_replicas_in_sync
    global_batch_size = args.per_worker_batch_size * workers
    dataset = synthetic_dataset(args.examples, global_batch_size, args.seed)
    with strategy.scope():
        model = build_and_compile_cnn_model()

    timer = StepTimer(args.warmup_steps)
    history = model.fit(dataset, epochs=1, steps_per_epoch=args.steps, verbose=0, callbacks=[timer])

    # With no warm-up asked for, the clock starts at the first finished step.
    steady_start = timer.warmup_end if args.warmup_steps else timer.first_step_end
    steady_steps = args.steps - max(args.warmup_steps, 1)
    seconds = timer.last_step_end - steady_start
    result = {
        "examples_per_second": steady_steps * global_batch_size / seconds if seconds > 0 else None,
        "time_to_first_step_seconds": timer.first_step_end - started,
        "peak_rss_bytes": peak_rss_bytes(resource.getrusage(resource.RUSAGE_SELF)),
        "workers": workers,
        "global_batch_size": global_batch_size,
        "per_worker_batch_size": args.per_worker_batch_size,
        "steps": args.steps,
        "warmup_steps": args.warmup_steps,
        "final_loss": float(history.history["loss"][-1]),
        "tf_keras": tf_keras.__version__,
        "tensorflow": tf.__version__,
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
