"""One two-replica strategy for every in-process test: strategies in one process would reuse each other's
collective keys (tests/trainer/conftest.py makes the two logical CPUs)."""

import functools

import tensorflow as tf


@functools.cache
def two_replicas() -> tf.distribute.MirroredStrategy:
    return tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
