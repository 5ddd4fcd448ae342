"""Small collectives every worker calls at the same point: each worker's values gathered by rank, or summed."""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def gather_over_workers(
    strategy: tf.distribute.Strategy, rank: int, workers: int, values: list[int]
) -> list[tuple[int, ...]]:
    """Every worker's `values`, by rank: each fills its own row of a zero matrix and the rows are summed."""
    rows = np.zeros((workers, len(values)), np.int64)
    rows[rank] = values
    total = tf.function(lambda local: sum_over_workers(strategy, local), autograph=False)(tf.constant(rows))
    replicas_per_worker = strategy.num_replicas_in_sync // workers  # each local replica added the same rows
    return [tuple(int(v) // replicas_per_worker for v in row) for row in total.numpy()]


def sum_over_workers(strategy: tf.distribute.Strategy, value: tf.Tensor) -> tf.Tensor:
    """Every worker's `value` added up: a collective, so all workers must call it at the same point."""
    return strategy.reduce("SUM", strategy.run(tf.identity, args=(value,)), axis=None)
