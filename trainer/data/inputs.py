"""What the sync loop reads: this worker's shards of both splits, the steps per epoch the group agreed on, and
their pipelines (trainer/data/pipeline.py), as the iterators a call of steps takes."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from trainer.base.errors import ModelDirError
from trainer.data import catalog, datasets, pipeline
from trainer.distribution.cluster import Cluster
from trainer.distribution.collectives import gather_over_workers
from trainer.settings.config import Config

log = logging.getLogger(__name__)


class Inputs:
    """This worker's shards of both splits, the steps per epoch the group agreed on, and their pipelines."""

    def __init__(
        self, config: Config, cluster: Cluster, strategy: tf.distribute.Strategy, global_batch_size: int
    ) -> None:
        self.config, self.cluster, self.strategy, self.global_batch_size = config, cluster, strategy, global_batch_size
        workers = cluster.num_workers
        # Each worker opens only its own shard; the group then agrees on the steps per epoch.
        self.source = catalog.load(config)
        self.train_shard = datasets.checked_shard(self.source, self.source.train, cluster.rank, workers)
        self.test_shard = datasets.checked_shard(self.source, self.source.test, cluster.rank, workers)
        self.test_size = _limited(self.test_shard.size, config.test_examples, cluster.rank, workers)
        self.train_size = _limited(self.train_shard.size, config.train_examples, cluster.rank, workers)
        reads = self.train_shard.reads
        (log.warning if self.train_shard.every_worker_reads_all else log.info)("%s reads %s", cluster.name, reads)
        self.cache = pipeline.cache_kind(config.cache, self.train_shard, self.source.example_bytes)
        # One collective: every worker's shard sizes; the smallest train shard sets the steps per epoch.
        rows = gather_over_workers(strategy, cluster.rank, workers, [self.train_size, self.test_size])
        self.sizes = {"train_examples": sum(row[0] for row in rows), "test_examples": sum(row[1] for row in rows)}
        self.steps_per_epoch = pipeline.steps_per_epoch([row[0] for row in rows], config.per_worker_batch_size)

    def check_restored(self, start_step: int) -> None:
        """One collective: the step every worker restored, which must be the same everywhere (else the workers
        would silently diverge)."""
        rank, workers = self.cluster.rank, self.cluster.num_workers
        steps = [row[0] for row in gather_over_workers(self.strategy, rank, workers, [start_step])]
        if any(step != start_step for step in steps):
            raise ModelDirError(
                f"the workers restored different checkpoints (steps by rank: {steps}). Every worker must see the "
                f"chief's --model-dir: mount the same shared volume on all of them"
            )

    def train_batches(self, start_step: int) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
        """The dataset function of this worker's batches for every step from start_step on."""
        config, rank = self.config, self.cluster.rank

        def batches(context: tf.distribute.InputContext) -> tf.data.Dataset:
            return pipeline.train_batches(
                self.train_shard,
                rank,
                context.get_per_replica_batch_size(self.global_batch_size),
                self.steps_per_epoch * config.per_worker_batch_size,
                config.seed,
                config.epochs,
                start_step,
                self.steps_per_epoch,
                config.shuffle_buffer,
                self.cache,
            )

        return batches

    def train_iterator(self, start_step: int) -> Any:
        """Batches for every step from start_step on. With one replica per worker (CPU workers, one GPU each) a
        plain tf.data iterator: strategy.run takes the local tensors, and a distributed iterator would add a
        cross-worker check per step that the steps agreed by construction make needless (docs/bench-log.md)."""
        batches, rank, workers = self.train_batches(start_step), self.cluster.rank, self.cluster.num_workers
        if self.strategy.num_replicas_in_sync == workers:
            return iter(batches(tf.distribute.InputContext(workers, rank, workers)))
        return iter(self.strategy.distribute_datasets_from_function(batches))

    def test(self) -> Any:
        """The test split's batches; distributed, since workers' shards differ by up to one partial batch."""
        cache = pipeline.cache_kind(self.config.cache, self.test_shard, self.source.example_bytes)
        return self.strategy.distribute_datasets_from_function(
            lambda context: pipeline.test_batches(
                self.test_shard, context.get_per_replica_batch_size(self.global_batch_size), self.test_size, cache
            )
        )


def _limited(size: int, limit: int, rank: int, workers: int) -> int:
    """A worker's shard size under --train-examples/--test-examples (0 = all): its share of the limit."""
    return min(size, datasets.share(limit, rank, workers)) if limit else size
