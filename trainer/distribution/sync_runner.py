"""How calls of training steps run on all-reduce workers (MultiWorkerMirroredStrategy, or one process).

`strategy.run` of the training step inside a `tf.function` that runs several steps per call, the loss averaged over
the global batch. Each replica adds its steps' metric sums into a variable of its own; at the end of the call one
small all-reduce adds up every replica's sums and every worker's stop request, so each worker holds the group's
figures and all stop at the same step. Every worker runs exactly the same sequence of calls.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.base.errors import ModelDirError
from trainer.data import catalog, datasets, pipeline
from trainer.distribution.cluster import Cluster
from trainer.settings.config import Config
from trainer.step import CallResult, NonFiniteGuard, StepRunner, slots, test_step, train_step
from trainer.task import Task

log = logging.getLogger(__name__)


class SyncRunner(StepRunner):
    """Every worker runs each call; the optimizer all-reduces the gradients of every step."""

    def __init__(self, config: Config, cluster: Cluster, strategy: tf.distribute.Strategy, task: Task) -> None:
        self.config, self.cluster, self.strategy, self.task = config, cluster, strategy, task
        self.global_batch_size = config.per_worker_batch_size * cluster.num_workers
        self.inputs = Inputs(config, cluster, strategy, self.global_batch_size)
        self.source, self.steps_per_epoch = self.inputs.source, self.inputs.steps_per_epoch
        self.sizes = {**self.inputs.sizes, "cache": self.inputs.cache}
        self.guard = NonFiniteGuard(config.on_nonfinite, loss_scaled=config.precision == "mixed_float16")
        self.skipped_in_a_row = 0  # carried from one call into the next
        self.shards = (self.inputs.train_shard, self.inputs.test_shard)

    def start(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, start_step: int) -> None:
        self.inputs.check_restored(start_step)
        self.iterator = self.inputs.train_iterator(min(start_step, self.steps_per_epoch * self.config.epochs))
        self.train_steps, self.run_evaluation = self._step_functions(model, optimizer, self.inputs.test())

    def run(self, steps: int, stop_requested: bool, settle: bool) -> CallResult:
        carried = tf.constant(float(self.skipped_in_a_row))
        reduced = self.train_steps(self.iterator, tf.constant(steps), tf.constant(float(stop_requested)), carried)
        reduced = reduced.numpy()
        self.skipped_in_a_row = int(reduced[-2])
        return CallResult(reduced[1:-2], skipped_in_a_row=int(reduced[-1]), stopping=bool(reduced[0] > 0))

    def evaluate(self) -> Any:
        return self.run_evaluation().numpy()

    def corrupt_records_skipped(self) -> dict[str, int]:
        tallies = [shard.skipped for shard in self.shards if shard.skipped is not None]
        if not tallies:
            return {}
        rank, workers = self.cluster.rank, self.cluster.num_workers
        rows = _gather_over_workers(self.strategy, rank, workers, [sum(tally() for tally in tallies)])
        return {"corrupt_records_skipped": sum(row[0] for row in rows)}

    def describe(self) -> str:
        workers = self.cluster.num_workers
        return f"{workers} worker(s) x {self.config.per_worker_batch_size} = global batch {self.global_batch_size}"

    def _step_functions(
        self, model: keras.Model, optimizer: keras.optimizers.Optimizer, test_batches: Any
    ) -> tuple[Callable[..., tf.Tensor], Callable[[], tf.Tensor]]:
        """`train_steps(iterator, steps, stop_requested, skipped_in_a_row)` runs `steps` training steps on every
        replica and returns [the workers' stop requests, the steps' sums and counts and HEALTH], summed over the
        group, then [skipped steps in a row at the end, the longest such run]; `run_evaluation()` returns the test
        split's sums and counts, summed over the group."""
        strategy, task, global_batch_size, guard = self.strategy, self.task, self.global_batch_size, self.guard
        skipped_slot = slots(task) - 2  # HEALTH's "skipped"; "nonfinite_weights" is last
        with strategy.scope():
            # Per replica (ON_READ): each adds its own steps, never synchronised until the call's one all-reduce.
            sums = tf.Variable(
                tf.zeros(slots(task)),
                trainable=False,
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.SUM,
            )

        def summed_over_the_group(stop_requested: tf.Tensor) -> tf.Tensor:
            def take(stop: tf.Tensor) -> tf.Tensor:
                # Each replica's weights, once per call; a replica's share of 1, so the group's sum is 1 if all.
                replicas = tf.distribute.get_replica_context().num_replicas_in_sync
                weights = guard.weights_health(model.variables) / replicas
                health = tf.one_hot(slots(task) - 1, slots(task)) * weights
                taken = tf.concat([tf.reshape(stop, [1]), sums.read_value() + health], 0)
                with tf.control_dependencies([taken]):
                    reset = sums.assign(tf.zeros(sums.shape))
                with tf.control_dependencies([reset]):
                    return tf.identity(taken)

            return strategy.reduce("SUM", strategy.run(take, args=(stop_requested,)), axis=None)

        # A plain while_loop, not autograph's conversion of a Python loop: the same graph, traced sooner.
        @functools.partial(tf.function, autograph=False)
        def train_steps(
            iterator: Any, steps: tf.Tensor, stop_requested: tf.Tensor, skipped_in_a_row: tf.Tensor
        ) -> tf.Tensor:
            def one_step(step: tf.Tensor, in_a_row: tf.Tensor, longest: tf.Tensor) -> tuple[tf.Tensor, ...]:
                def replica(batch: Any) -> tf.Tensor:
                    values = train_step(task, model, optimizer, batch, global_batch_size, guard)
                    sums.assign_add(values)
                    return values[skipped_slot]

                # Skipping is agreed across the group, so any replica's flag (its share of 1) is every replica's.
                share = strategy.experimental_local_results(strategy.run(replica, args=(next(iterator),)))[0]
                skipped = tf.cast(share > 0, tf.float32)
                in_a_row = (in_a_row + 1.0) * skipped
                return step + 1, in_a_row, tf.maximum(longest, in_a_row)

            start = (tf.constant(0), skipped_in_a_row, skipped_in_a_row)
            _, in_a_row, longest = tf.while_loop(lambda step, *_: step < steps, one_step, start)
            # One small all-reduce per call: the metrics and HEALTH, and if any worker got SIGTERM, every worker
            # stops here.
            return tf.concat([summed_over_the_group(stop_requested), tf.stack([in_a_row, longest])], 0)

        @tf.function
        def run_evaluation() -> tf.Tensor:
            for batch in test_batches:
                strategy.run(lambda batch: sums.assign_add(test_step(task, model, batch)), args=(batch,))
            return summed_over_the_group(tf.constant(0.0))[1:]

        return train_steps, run_evaluation


class Inputs:
    """This worker's shards of both splits, the steps per epoch the group agreed on, and their pipelines."""

    def __init__(
        self, config: Config, cluster: Cluster, strategy: tf.distribute.Strategy, global_batch_size: int
    ) -> None:
        self.config, self.cluster, self.strategy, self.global_batch_size = config, cluster, strategy, global_batch_size
        workers = cluster.num_workers
        # Each worker opens only its own shard; the group then agrees on the steps per epoch.
        self.source = catalog.load(config)
        self.train_shard = self.source.train.shard(cluster.rank, workers)
        self.test_shard = self.source.test.shard(cluster.rank, workers)
        self.test_size = _limited(self.test_shard.size, config.test_examples, cluster.rank, workers)
        self.train_size = _limited(self.train_shard.size, config.train_examples, cluster.rank, workers)
        reads = self.train_shard.reads
        (log.warning if self.train_shard.every_worker_reads_all else log.info)("%s reads %s", cluster.name, reads)
        self.cache = pipeline.cache_kind(config.cache, self.train_shard, self.source.example_bytes)
        # One collective: every worker's shard sizes; the smallest train shard sets the steps per epoch.
        rows = _gather_over_workers(strategy, cluster.rank, workers, [self.train_size, self.test_size])
        self.sizes = {"train_examples": sum(row[0] for row in rows), "test_examples": sum(row[1] for row in rows)}
        self.steps_per_epoch = pipeline.steps_per_epoch([row[0] for row in rows], config.per_worker_batch_size)

    def check_restored(self, start_step: int) -> None:
        """One collective: the step every worker restored, which must be the same everywhere (else the workers
        would silently diverge)."""
        rank, workers = self.cluster.rank, self.cluster.num_workers
        steps = [row[0] for row in _gather_over_workers(self.strategy, rank, workers, [start_step])]
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
