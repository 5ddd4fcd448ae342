"""How a call of steps runs with all-reduce workers (MultiWorkerMirroredStrategy, or one process).

`strategy.run` of the task's step inside a `tf.function` that runs several steps per call, the loss averaged over
the global batch, metrics kept per replica and reduced across workers only when they are read (log intervals,
epoch ends). Every worker runs exactly the same sequence of calls.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.config import Config
from trainer.data import datasets, pipeline
from trainer.distribution.cluster import Cluster
from trainer.errors import ModelDirError
from trainer.loop import Calls, test_step_values, train_step_values
from trainer.task import Task

log = logging.getLogger(__name__)


class SyncCalls(Calls):
    """Every worker runs each call; the optimizer all-reduces the gradients of every step."""

    def __init__(self, config: Config, cluster: Cluster, strategy: tf.distribute.Strategy, task: Task) -> None:
        self.config, self.cluster, self.strategy, self.task = config, cluster, strategy, task
        self.global_batch_size = config.per_worker_batch_size * cluster.num_workers
        self.writes_checkpoints = cluster.is_chief
        self.inputs = Inputs(config, cluster, strategy, self.global_batch_size)
        self.source = self.inputs.source
        self.shards = (self.inputs.train_shard, self.inputs.test_shard)
        self.names = ("loss", *task.metric_names)

    def build(self, model: keras.Model, optimizer: keras.optimizers.Optimizer) -> None:
        # Keras metrics with per-replica state: reading one all-reduces it, so every worker reads at the same steps.
        self.train_means = {name: keras.metrics.Mean() for name in self.names}
        self.test_means = {name: keras.metrics.Mean() for name in self.names}

    def start(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, start_step: int) -> None:
        self.inputs.agree(start_step)
        self.steps_per_epoch = self.inputs.steps_per_epoch
        self.sizes = {**self.inputs.sizes, "cache": self.inputs.cache}
        total_steps = self.steps_per_epoch * self.config.epochs
        self.iterator = self.inputs.train_iterator(min(start_step, total_steps))
        self.train_steps, self.run_evaluation = self._step_functions(model, optimizer, self.inputs.test())

    def run(self, steps: int, stop_requested: bool) -> tuple[int, bool]:
        stopping = int(self.train_steps(self.iterator, tf.constant(steps), tf.constant(int(stop_requested)))) > 0
        return steps, stopping

    def train_metrics(self) -> dict[str, float]:
        return {f"train_{name}": float(mean.result()) for name, mean in self.train_means.items()}

    def reset_train_metrics(self) -> None:
        for mean in self.train_means.values():
            mean.reset_state()

    def evaluate(self) -> dict[str, float]:
        """Evaluates the test split; reading the metrics all-reduces them across workers."""
        for mean in self.test_means.values():
            mean.reset_state()
        self.run_evaluation()
        # Each worker evaluates its own shard, the last batch partial: the summed count shows each example once.
        examples = int(tf.convert_to_tensor(self.test_means["loss"].count.value))
        return {
            **{f"test_{name}": float(mean.result()) for name, mean in self.test_means.items()},
            "test_examples_evaluated": examples,
        }

    def corrupt_records_skipped(self) -> dict[str, int]:
        tallies = [shard.skipped for shard in self.shards if shard.skipped is not None]
        if not tallies:
            return {}
        rank, workers = self.cluster.rank, self.cluster.num_workers
        rows = _gather_over_workers(self.strategy, rank, workers, [sum(tally() for tally in tallies)])
        return {"corrupt_records_skipped": sum(row[0] for row in rows)}

    def describe(self, config: Config, workers: int) -> str:
        return f"{workers} worker(s) x {config.per_worker_batch_size} = global batch {self.global_batch_size}"

    def _step_functions(
        self, model: keras.Model, optimizer: keras.optimizers.Optimizer, test_batches: Any
    ) -> tuple[Callable[..., tf.Tensor], Callable[[], None]]:
        """`train_steps(iterator, steps, stop_requested)` runs `steps` training steps on every replica and returns
        how many workers asked to stop; `run_evaluation()` runs the test split into the test metrics."""
        strategy, task = self.strategy, self.task

        def train_step(batch: Any) -> None:
            values = train_step_values(task, model, optimizer, batch, self.global_batch_size)
            for name, value in values.items():
                self.train_means[name].update_state(value)

        # A plain while_loop, not autograph's conversion of a Python loop: the same graph, traced 0.3 s sooner.
        @functools.partial(tf.function, autograph=False)
        def train_steps(iterator: Any, steps: tf.Tensor, stop_requested: tf.Tensor) -> tf.Tensor:
            def one_step(step: tf.Tensor) -> tuple[tf.Tensor]:
                strategy.run(train_step, args=(next(iterator),))
                return (step + 1,)

            tf.while_loop(lambda step: step < steps, one_step, (tf.constant(0),))
            # One small all-reduce per call: if any worker got SIGTERM, every worker stops at this step.
            return sum_over_workers(strategy, stop_requested)

        def eval_step(batch: Any) -> None:
            for name, value in test_step_values(task, model, batch).items():
                self.test_means[name].update_state(value)

        @tf.function
        def run_evaluation() -> None:
            for batch in test_batches:
                strategy.run(eval_step, args=(batch,))

        return train_steps, run_evaluation


class Inputs:
    """This worker's shards of both splits, the steps per epoch the group agreed on, and their pipelines."""

    def __init__(
        self, config: Config, cluster: Cluster, strategy: tf.distribute.Strategy, global_batch_size: int
    ) -> None:
        self.config, self.cluster, self.strategy, self.global_batch_size = config, cluster, strategy, global_batch_size
        workers = cluster.num_workers
        # Each worker opens only its own shard; the group then agrees on the steps per epoch.
        self.source = datasets.load(config)
        self.train_shard = self.source.train.shard(cluster.rank, workers)
        self.test_shard = self.source.test.shard(cluster.rank, workers)
        self.test_size = _limited(self.test_shard.size, config.test_examples, cluster.rank, workers)
        self.train_size = _limited(self.train_shard.size, config.train_examples, cluster.rank, workers)
        reads = self.train_shard.reads
        (log.warning if self.train_shard.every_worker_reads_all else log.info)("%s reads %s", cluster.name, reads)
        self.cache = pipeline.cache_kind(config.cache, self.train_shard, self.source.example_bytes)

    def agree(self, start_step: int) -> None:
        """One collective: every worker's shard sizes (the smallest train shard sets the steps per epoch) and the
        step it restored, which must be the same everywhere (else the workers would silently diverge)."""
        rank, workers = self.cluster.rank, self.cluster.num_workers
        rows = _gather_over_workers(self.strategy, rank, workers, [self.train_size, self.test_size, start_step])
        if any(row[2] != start_step for row in rows):
            raise ModelDirError(
                f"the workers restored different checkpoints (steps by rank: {[row[2] for row in rows]}). Every "
                f"worker must see the chief's --model-dir: mount the same shared volume on all of them"
            )
        self.sizes = {"train_examples": sum(row[0] for row in rows), "test_examples": sum(row[1] for row in rows)}
        self.steps_per_epoch = pipeline.steps_per_epoch([row[0] for row in rows], self.config.per_worker_batch_size)

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
        cross-worker check per step that the steps agreed by construction make needless (docs/bench.md)."""
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


def _gather_over_workers(
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
