"""How calls of training steps run on all-reduce workers (MultiWorkerMirroredStrategy, or one process).

`strategy.run` of the training step inside a `tf.function` that runs several steps per call, the loss averaged over
the global batch. Each replica adds its steps' metric sums into a variable of its own; at the end of the call one
small all-reduce adds up every replica's sums and every worker's stop request, so each worker holds the group's
figures and all stop at the same step. Every worker runs exactly the same sequence of calls.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from trainer.base.errors import ModelDirError
from trainer.data import pipeline
from trainer.data.inputs import Inputs
from trainer.distribution.cluster import Cluster
from trainer.distribution.collectives import gather_over_workers
from trainer.settings.config import Config
from trainer.step import CallResult, NonFiniteGuard, StepRunner, slots, test_step, train_step
from trainer.task import Task


class SyncRunner(StepRunner):
    """Every worker runs each call; the optimizer all-reduces the gradients of every step."""

    def __init__(
        self, config: Config, cluster: Cluster, strategy: tf.distribute.Strategy, task: Task, inputs: Inputs
    ) -> None:
        self.config, self.cluster, self.strategy, self.task, self.inputs = config, cluster, strategy, task, inputs
        self.global_batch_size = config.per_worker_batch_size * cluster.num_workers
        self.guard = NonFiniteGuard(config.on_nonfinite, loss_scaled=config.precision == "mixed_float16")
        self.skipped_in_a_row = 0  # carried from one call into the next

    def start(
        self, model: keras.Model, optimizer: keras.optimizers.Optimizer, start_step: int, steps_per_epoch: int
    ) -> None:
        self.check_restored(start_step)
        self.iterator = self.train_iterator(min(start_step, steps_per_epoch * self.config.epochs), steps_per_epoch)
        self.train_steps, self.run_evaluation = self._step_functions(model, optimizer, self.test_batches())

    def run(self, steps: int, stop_requested: bool, settle: bool) -> CallResult:
        carried = tf.constant(float(self.skipped_in_a_row))
        reduced = self.train_steps(self.iterator, tf.constant(steps), tf.constant(float(stop_requested)), carried)
        reduced = reduced.numpy()
        self.skipped_in_a_row = int(reduced[-2])
        return CallResult(reduced[1:-2], skipped_in_a_row=int(reduced[-1]), stopping=bool(reduced[0] > 0))

    def evaluate(self) -> Any:
        return self.run_evaluation().numpy()

    def corrupt_records_skipped(self) -> dict[str, int]:
        tallies = [shard.skipped for shard in self.inputs.shards if shard.skipped is not None]
        if not tallies:
            return {}
        rows = self._gather([sum(tally() for tally in tallies)])
        return {"corrupt_records_skipped": sum(row[0] for row in rows)}

    def describe(self) -> str:
        workers = self.cluster.num_workers
        return f"{workers} worker(s) x {self.config.per_worker_batch_size} = global batch {self.global_batch_size}"

    def _gather(self, values: list[int]) -> list[tuple[int, ...]]:
        return gather_over_workers(self.strategy, self.cluster.rank, self.cluster.num_workers, values)

    def check_restored(self, start_step: int) -> None:
        """One collective: the step every worker restored, which must be the same everywhere (else the workers
        would silently diverge)."""
        steps = [row[0] for row in self._gather([start_step])]
        if any(step != start_step for step in steps):
            raise ModelDirError(
                f"the workers restored different checkpoints (steps by rank: {steps}). Every worker must see the "
                f"chief's --model-dir: mount the same shared volume on all of them"
            )

    def train_batches(
        self, start_step: int, steps_per_epoch: int
    ) -> Callable[[tf.distribute.InputContext], tf.data.Dataset]:
        """The dataset function of this worker's batches for every step from start_step on."""
        config, rank, inputs = self.config, self.cluster.rank, self.inputs

        def batches(context: tf.distribute.InputContext) -> tf.data.Dataset:
            return pipeline.train_batches(
                inputs.train,
                rank,
                context.get_per_replica_batch_size(self.global_batch_size),
                steps_per_epoch * config.per_worker_batch_size,
                config.seed,
                config.epochs,
                start_step,
                steps_per_epoch,
                config.shuffle_buffer,
                inputs.cache,
            )

        return batches

    def train_iterator(self, start_step: int, steps_per_epoch: int) -> Any:
        """Batches for every step from start_step on. With one replica per worker (CPU workers, one GPU each) a
        plain tf.data iterator: strategy.run takes the local tensors, and a distributed iterator would add a
        cross-worker check per step that the steps agreed by construction make needless (docs/bench-log.md)."""
        batches = self.train_batches(start_step, steps_per_epoch)
        rank, workers = self.cluster.rank, self.cluster.num_workers
        if self.strategy.num_replicas_in_sync == workers:
            return iter(batches(tf.distribute.InputContext(workers, rank, workers)))
        return iter(self.strategy.distribute_datasets_from_function(batches))

    def test_batches(self) -> Any:
        """The test split's batches; distributed, since workers' shards differ by up to one partial batch."""
        inputs, cache = self.inputs, self.inputs.test_cache(self.config.cache)
        return self.strategy.distribute_datasets_from_function(
            lambda context: pipeline.test_batches(
                inputs.test, context.get_per_replica_batch_size(self.global_batch_size), inputs.test_size, cache
            )
        )

    def _step_functions(
        self, model: keras.Model, optimizer: keras.optimizers.Optimizer, test_batches: Any
    ) -> tuple[Callable[..., tf.Tensor], Callable[[], tf.Tensor]]:
        """`train_steps(iterator, steps, stop_requested, skipped_in_a_row)` runs `steps` training steps on every
        replica and returns [the workers' stop requests, the steps' sums and counts and HEALTH], summed over the
        group, then [skipped steps in a row at the end, the longest such run]; `run_evaluation()` returns the test
        split's sums and counts, summed over the group."""
        strategy, task, global_batch_size, guard = self.strategy, self.task, self.global_batch_size, self.guard
        skipped_slot = slots(task) - 2  # HEALTH's "skipped"; "nonfinite_weights" is last
        sums = per_replica_sums(strategy, slots(task))

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


def per_replica_sums(strategy: tf.distribute.Strategy, size: int) -> tf.Variable:
    """A vector each replica adds its own steps' sums into (ON_READ), never synchronised until a call's one
    all-reduce reads it."""
    with strategy.scope():
        return tf.Variable(
            tf.zeros(size),
            trainable=False,
            synchronization=tf.VariableSynchronization.ON_READ,
            aggregation=tf.VariableAggregation.SUM,
        )
