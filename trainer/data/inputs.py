"""One process's data, opened once: the dataset loaded, this process's shards of both splits under the size limits,
the cache it takes, and the group's shard sizes. The entry point opens it and hands it to the model's build, the
runner and the evaluator; how a call of steps reads it (trainer/distribution/sync_runner.py,
trainer/ps/async_runner.py) is theirs."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

from trainer.data import catalog, datasets, pipeline
from trainer.settings.config import Config

log = logging.getLogger(__name__)

# Every worker's [train size, test size], by rank, from this worker's own: a collective, which the caller brings.
Gather = Callable[[list[int]], list[tuple[int, ...]]]


@dataclasses.dataclass(frozen=True)
class Inputs:
    """This process's part of the dataset: what the model is built for (source), the shards it reads, their sizes
    under --train-examples/--test-examples, the training cache, and every worker's sizes (group_sizes, by rank)."""

    source: datasets.Source
    train: datasets.Shard
    test: datasets.Shard
    train_size: int
    test_size: int
    cache: str  # what --cache resolved to for the training shard: memory, disk or none
    group_sizes: tuple[tuple[int, ...], ...]

    @property
    def shards(self) -> tuple[datasets.Shard, ...]:
        """Both shards: where a corrupt record is looked for."""
        return (self.train, self.test)

    @property
    def sizes(self) -> dict[str, int | str]:
        """The group's examples of each split and the cache: recorded in metrics.json."""
        train, test = (sum(row[i] for row in self.group_sizes) for i in (0, 1))
        return {"train_examples": train, "test_examples": test, "cache": self.cache}

    def steps_per_epoch(self, per_worker_batch: int) -> int:
        """The steps every worker runs per epoch: the smallest worker's training shard decides."""
        return pipeline.steps_per_epoch([row[0] for row in self.group_sizes], per_worker_batch)

    def test_cache(self, cache: str) -> str:
        """What --cache resolves to for the test shard."""
        return pipeline.cache_kind(cache, self.test, self.source.example_bytes)


def open_inputs(config: Config, rank: int, workers: int, name: str, gather: Gather | None = None) -> Inputs:
    """Worker `rank` of `workers`'s part of --dataset (0 of 1: the whole of both splits), named `name` in its log
    line. gather: the group's sizes from this worker's (a collective); None where this process is the group."""
    source = catalog.load(config)
    train = datasets.checked_shard(source, source.train, rank, workers)
    test = datasets.checked_shard(source, source.test, rank, workers)
    train_size = _limited(train.size, config.train_examples, rank, workers)
    test_size = _limited(test.size, config.test_examples, rank, workers)
    (log.warning if train.every_worker_reads_all else log.info)("%s reads %s", name, train.reads)
    cache = pipeline.cache_kind(config.cache, train, source.example_bytes)
    group_sizes = tuple(gather([train_size, test_size])) if gather else ((train_size, test_size),)
    return Inputs(source, train, test, train_size, test_size, cache, group_sizes)


def _limited(size: int, limit: int, rank: int, workers: int) -> int:
    """A worker's shard size under --train-examples/--test-examples (0 = all): its share of the limit."""
    return min(size, datasets.share(limit, rank, workers)) if limit else size
