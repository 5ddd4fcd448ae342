"""How a call of steps runs asynchronously: the chief coordinates ParameterServerStrategy.

The variables live on the ps tasks; the chief schedules calls of `steps_per_loop` steps onto whichever worker is
free (ClusterCoordinator), each worker reading the training split in its own order. A step is one worker's batch
applied to the variables, so an epoch is train_size // per_worker_batch_size steps, whatever the number of
workers. At most two calls per worker are in flight; each call returns its metrics' sums, added up on the chief.
Before a checkpoint, an evaluation or the end, the loop settles the calls in flight, so checkpoint N holds exactly
N steps' updates. Only the chief writes: the checkpoints, TensorBoard, the status, metrics.json and the model.

A lost worker costs nothing but its share: the coordinator runs its calls elsewhere and gives it work again once it
is back. A lost ps task (or the chief itself) loses the variables: the chief exits with the group-failure code,
and the run resumes from the last checkpoint once every task is back.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.config import Config
from trainer.data import datasets, pipeline
from trainer.distribution.cluster import Cluster
from trainer.loop import Calls, means, sums_and_counts, train_step_values
from trainer.ps.evaluator import evaluation_function
from trainer.task import Task

log = logging.getLogger(__name__)

CALLS_IN_FLIGHT_PER_WORKER = 2  # one running, one queued: a worker never waits for the chief


class AsyncCalls(Calls):
    """The chief schedules each call onto a free worker and collects the calls' metric sums as they finish."""

    def __init__(
        self, config: Config, cluster: Cluster, strategy: tf.distribute.Strategy, task: Task, coordinator: Any
    ) -> None:
        self.config, self.cluster, self.strategy, self.task = config, cluster, strategy, task
        self.coordinator = coordinator
        self.global_batch_size = config.per_worker_batch_size
        self.writes_checkpoints = True  # the chief is the only task that runs the loop
        self.names = ("loss", *task.metric_names)
        self.source = datasets.load(config)
        # The whole split for every worker: under ParameterServerStrategy the dataset function is traced once for
        # all workers (its InputContext reads 0 of 1 on each), so a worker cannot pick its shard; it gets its own
        # order.
        self.train_shard, self.test_shard = self.source.train.shard(0, 1), self.source.test.shard(0, 1)
        self.shards = (self.train_shard, self.test_shard)
        self.train_size = min(self.train_shard.size, config.train_examples or self.train_shard.size)
        self.test_size = min(self.test_shard.size, config.test_examples or self.test_shard.size)
        self.in_flight: collections.deque = collections.deque()
        self.sums = np.zeros(2 * len(self.names))  # since the epoch began

    def start(self, model: keras.Model, optimizer: keras.optimizers.Optimizer, start_step: int) -> None:
        log.info("variables on the ps tasks: %s", _placement(model.weights + optimizer.variables))
        config = self.config
        self.steps_per_epoch = pipeline.steps_per_epoch([self.train_size], config.per_worker_batch_size)
        cache = pipeline.cache_kind(config.cache, self.train_shard, self.source.example_bytes)
        self.sizes = {"train_examples": self.train_size, "test_examples": self.test_size, "cache": cache}
        self.worker_batches = iter(
            self.coordinator.create_per_worker_dataset(
                lambda: self.strategy.distribute_datasets_from_function(
                    lambda context: _worker_batches(
                        config, self.train_shard, self.train_size, self.steps_per_epoch, cache
                    )
                )
            )
        )
        task, global_batch_size, strategy = self.task, self.global_batch_size, self.strategy

        @tf.function
        def train_steps(iterator: Any, steps: tf.Tensor) -> tf.Tensor:
            totals = tf.zeros(2 * len(self.names))
            for _ in tf.range(steps):
                totals += strategy.run(
                    lambda batch: sums_and_counts(train_step_values(task, model, optimizer, batch, global_batch_size)),
                    args=(next(iterator),),
                )
            return totals

        self.train_steps = train_steps
        self.evaluation = evaluation_function(
            task, model, pipeline.test_batches(self.test_shard, config.per_worker_batch_size, self.test_size)
        )

    def run(self, steps: int, stop_requested: bool) -> tuple[int, bool]:
        # Only the chief's SIGTERM counts (the workers and ps tasks hold no state of the run); this call still runs,
        # as a sync call does, and the loop then settles and checkpoints.
        scheduled = self.coordinator.schedule(self.train_steps, args=(self.worker_batches, tf.constant(steps)))
        self.in_flight.append((steps, scheduled))
        finished = 0
        while len(self.in_flight) > CALLS_IN_FLIGHT_PER_WORKER * self.cluster.num_workers:
            finished += self._collect_oldest()
        return finished, stop_requested

    def settle(self) -> int:
        self.coordinator.join()
        finished = 0
        while self.in_flight:
            finished += self._collect_oldest()
        return finished

    def _collect_oldest(self) -> int:
        steps, scheduled = self.in_flight.popleft()
        self.sums += np.asarray(scheduled.fetch())
        return steps

    def train_metrics(self) -> dict[str, float]:
        return means(self.names, self.sums, "train_")

    def reset_train_metrics(self) -> None:
        self.sums[:] = 0

    def evaluate(self) -> dict[str, float]:
        return self.evaluation()

    def describe(self, config: Config, workers: int) -> str:
        return (
            f"asynchronously, {workers} worker(s) x batch {config.per_worker_batch_size}, "
            f"{self.cluster.num_ps} ps task(s)"
        )

    def shape(self) -> dict[str, Any]:
        return {"strategy": "async", "ps_tasks": self.cluster.num_ps}


def _worker_batches(
    config: Config, shard: datasets.Shard, train_size: int, steps_per_epoch: int, cache: str
) -> tf.data.Dataset:
    """One worker's batches, repeated without end (it may run more than its share while another is down), in an
    order seeded by --seed and by this worker's clock when the coordinator builds it, so workers differ."""
    clock = tf.cast(tf.timestamp() * 1e6, tf.int64)
    seed = tf.constant(config.seed, tf.int64) * 1_000_003 + clock
    # Printed on the worker each time the coordinator (re)builds its input, e.g. after the worker restarted.
    tf.print("input pipeline built on this worker; it receives work from the coordinator")
    batches = pipeline.train_batches(
        shard,
        0,
        config.per_worker_batch_size,
        train_size,
        seed,
        config.epochs,
        0,
        steps_per_epoch,
        config.shuffle_buffer,
        cache,
    )
    return batches.repeat()


def _placement(variables: list[Any]) -> str:
    """Bytes of variables per ps task, e.g. 'ps-0 402,240 bytes, ps-1 401,984 bytes'."""
    held: collections.Counter = collections.Counter()
    for variable in variables:
        device = tf.DeviceSpec.from_string(variable.value.device)
        held[f"{device.job}-{device.task}"] += variable.value.shape.num_elements() * variable.value.dtype.size
    return ", ".join(f"{task} {size:,} bytes" for task, size in sorted(held.items()))
