"""The synthetic dataset (--dataset synthetic): generated in the graph from --seed, any size, no files, no download,
and a task with a known best accuracy."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from trainer.data.datasets import TEST_INDEX_OFFSET, Generated, Source, image_spec, register
from trainer.settings.config import Config

if TYPE_CHECKING:
    import tensorflow as tf

    from trainer.data.datasets import Example

SHAPE = (28, 28, 1)  # the same as fashion_mnist
CLASSES = 10
TRAIN_SIZE = 60_000
TEST_SIZE = 10_000
# Each label is replaced by a different, uniformly drawn class with this probability. The image shows its
# true class clearly, so the best any model can score on the (equally noisy) test split is 1 - this.
LABEL_NOISE = 0.1
BEST_ACCURACY = 1 - LABEL_NOISE


def example_fn(seed: int) -> Callable[[tf.Tensor], Example]:
    """Example i as a pure function of (seed, i): a fixed blocky pattern per class plus noise, and a label
    that is the true class with probability 1 - LABEL_NOISE."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    # 7x7 class patterns blown up to 28x28: structure a small CNN can pick out of the noise.
    patterns = tf.constant(np.kron(rng.random((CLASSES, 7, 7)), np.ones((4, 4))), tf.float32)

    def example(index: tf.Tensor) -> Example:
        key = tf.stack([tf.constant(seed, tf.int64), tf.cast(index, tf.int64)])
        true_class = tf.random.stateless_uniform((), key, maxval=CLASSES, dtype=tf.int64)
        noise = tf.random.stateless_uniform((28, 28), key + [0, 1 << 60])
        image = tf.cast((0.45 * tf.gather(patterns, true_class) + 0.55 * noise) * 255, tf.uint8)[..., tf.newaxis]
        flip = tf.random.stateless_uniform((), key + [0, 2 << 60]) < LABEL_NOISE
        other = tf.random.stateless_uniform((), key + [0, 3 << 60], minval=1, maxval=CLASSES, dtype=tf.int64)
        label = tf.where(flip, (true_class + other) % CLASSES, true_class)
        return image, label

    return example


@register("synthetic")
def source(config: Config) -> Source:
    """Generated in the graph from --seed: any --train-examples (default 60,000), no files, no download."""
    example = example_fn(config.seed)
    return Source(
        train=Generated(example, config.train_examples or TRAIN_SIZE),
        test=Generated(example, config.test_examples or TEST_SIZE, TEST_INDEX_OFFSET),
        element_spec=image_spec(SHAPE),
        num_classes=CLASSES,
    )
