"""How calls of training steps run asynchronously: the chief coordinates ParameterServerStrategy.

The variables live on the ps tasks; the chief schedules calls of `steps_per_loop` steps onto whichever worker is
free (ClusterCoordinator), each worker reading the training split in its own order. A step is one worker's batch
applied to the variables, so an epoch is train_size // per_worker_batch_size steps, whatever the number of
workers. At most two calls per worker are in flight; each call returns its metrics' sums, which reach the loop once
it has finished. Before a checkpoint, an evaluation, a stop or the end, the loop asks the calls in flight to
settle, so checkpoint N holds exactly N steps' updates. Only the chief writes: the checkpoints, TensorBoard, the
status, metrics.json and the model.

A lost worker costs nothing but its share: the coordinator runs its calls elsewhere and gives it work again once it
is back. A lost ps task (or the chief itself) loses the variables: the chief exits with the group-failure code,
and the run resumes from the last checkpoint once every task is back.
"""

from __future__ import annotations

import collections
import logging
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.base import private_api
from trainer.data import datasets, pipeline
from trainer.data.inputs import Inputs
from trainer.distribution.cluster import Cluster
from trainer.distribution.strategy import failure_reason
from trainer.settings.config import Config
from trainer.step import CallResult, NonFiniteGuard, StepRunner, slots, test_totals, train_step
from trainer.task import Task

log = logging.getLogger(__name__)

CALLS_IN_FLIGHT_PER_WORKER = 2  # one running, one queued: a worker never waits for the chief
REFETCH_SECONDS = 0.5  # while the coordinator runs again a call whose worker died before its output was copied


class AsyncRunner(StepRunner):
    """The chief schedules each call onto a free worker and collects the calls' metric sums as they finish."""

    def __init__(
        self,
        config: Config,
        cluster: Cluster,
        strategy: tf.distribute.Strategy,
        task: Task,
        inputs: Inputs,
        coordinator: Any,
    ) -> None:
        # inputs: the whole split for every worker (opened as 0 of 1). Under ParameterServerStrategy the dataset
        # function is traced once for all workers (its InputContext reads 0 of 1 on each), so a worker cannot pick
        # its shard; it gets its own order.
        self.config, self.cluster, self.strategy, self.task, self.inputs = config, cluster, strategy, task, inputs
        self.coordinator = coordinator
        self.global_batch_size = config.per_worker_batch_size
        self.in_flight: collections.deque = collections.deque()
        # No collective under parameter servers: each worker decides about its own step.
        self.guard = NonFiniteGuard(config.on_nonfinite, loss_scaled=config.precision == "mixed_float16")
        self.skipped_in_a_row = 0  # over the calls as they finish

    def start(
        self, model: keras.Model, optimizer: keras.optimizers.Optimizer, start_step: int, steps_per_epoch: int
    ) -> None:
        log.info("variables on the ps tasks: %s", _placement(model.weights + optimizer.variables))
        config, task, strategy, inputs = self.config, self.task, self.strategy, self.inputs
        self.worker_batches = iter(
            self.coordinator.create_per_worker_dataset(
                lambda: strategy.distribute_datasets_from_function(
                    lambda context: _worker_batches(
                        config, inputs.train, inputs.train_size, steps_per_epoch, inputs.cache
                    )
                )
            )
        )
        global_batch_size, guard, skipped_slot = self.global_batch_size, self.guard, slots(task) - 2

        @tf.function
        def train_steps(iterator: Any, steps: tf.Tensor) -> tf.Tensor:
            """The steps' sums and HEALTH, then [skipped steps before the first applied one, at the end, the
            longest run]."""
            totals, leading, in_a_row, longest = (
                tf.zeros(slots(task)),
                tf.constant(0.0),
                tf.constant(0.0),
                tf.constant(0.0),
            )
            for index in tf.range(steps):
                values = strategy.run(
                    lambda batch: train_step(task, model, optimizer, batch, global_batch_size, guard),
                    args=(next(iterator),),
                )
                totals += values
                skipped = values[skipped_slot]
                leading += skipped * tf.cast(tf.equal(leading, tf.cast(index, tf.float32)), tf.float32)
                in_a_row = (in_a_row + 1.0) * skipped
                longest = tf.maximum(longest, in_a_row)
            weights = tf.one_hot(slots(task) - 1, slots(task)) * guard.weights_health(model.variables)
            return tf.concat([totals + weights, tf.stack([leading, in_a_row, longest])], 0)

        self.train_steps = train_steps
        test_batches = pipeline.test_batches(inputs.test, config.per_worker_batch_size, inputs.test_size)
        self.evaluation = tf.function(lambda: test_totals(task, model, test_batches))

    def run(self, steps: int, stop_requested: bool, settle: bool) -> CallResult:
        # Only the chief's SIGTERM counts (the workers and ps tasks hold no state of the run); this call still runs,
        # as a sync call does, and the loop then settles and checkpoints.
        scheduled = self.coordinator.schedule(self.train_steps, args=(self.worker_batches, tf.constant(steps)))
        self.in_flight.append((steps, scheduled))
        if settle:
            self.coordinator.join()
        finished, longest = np.zeros(slots(self.task)), 0
        while self.in_flight and (
            settle or len(self.in_flight) > CALLS_IN_FLIGHT_PER_WORKER * self.cluster.num_workers
        ):
            called, scheduled = self.in_flight.popleft()
            values = fetch_output(scheduled)
            finished += values[:-3]
            leading, at_end, within = (int(v) for v in values[-3:])
            # In the order the calls finish: a call skipped whole extends the run, any other ends it.
            if leading == called:
                self.skipped_in_a_row += called
            else:
                longest = max(longest, self.skipped_in_a_row + leading)
                self.skipped_in_a_row = at_end
            longest = max(longest, within, self.skipped_in_a_row)
        return CallResult(finished, skipped_in_a_row=longest, stopping=stop_requested)

    def evaluate(self) -> Any:
        return self.evaluation().numpy()

    def describe(self) -> str:
        return (
            f"asynchronously, {self.cluster.num_workers} worker(s) x batch {self.config.per_worker_batch_size}, "
            f"{self.cluster.num_ps} ps task(s)"
        )


def fetch_output(scheduled: Any) -> np.ndarray:
    """A scheduled call's output, copied to the chief. The coordinator marks an output ready before its own thread
    has copied it here, so this fetch may be the one that copies it, from a worker that died just after the call
    finished; the coordinator then runs the call again, as for any lost worker, and the fetch is repeated until that
    run's output arrives. Any other error is raised."""
    waiting = False
    while True:
        try:
            return np.asarray(scheduled.fetch())
        except tf.errors.OpError as error:
            if not private_api.is_lost_worker(error):
                raise
            if not waiting:
                log.warning(
                    "a worker was lost before its call's output reached the chief; waiting for the coordinator to "
                    "run the call again (TensorFlow says: %s)",
                    failure_reason(error)[:200],
                )
                waiting = True
            time.sleep(REFETCH_SECONDS)


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
