"""Where a two-worker training step's time goes, and what that predicts for workers on separate machines.

    python -m scripts.bench.step_costs --batch 64      # in each of two processes with a 2-worker TF_CONFIG

`make bench` starts it as a group on 127.0.0.1 beside the trainer runs. Every figure is the median ms per step
of a tf.function running `--steps` steps, each taken while both workers run the same thing (so they share the
cores as in training), except `compute_alone`, which worker 0 runs while worker 1 waits:

- compute_alone / compute_shared: the trainer's model, forward, backward and the Adam update on constant
  inputs of the per-worker batch, no all-reduce (a model outside the strategy);
- allreduce_model / allreduce_tiny: one batched all-reduce of tensors shaped like the model's gradients, and of
  one float (the fixed cost of a collective here: gRPC hand-offs and scheduling);
- sync_constant: the trainer's own step function (trainer.distribution.sync_runner.SyncRunner) on constant inputs;
- trainer: the same on the trainer's input pipeline (trainer.data.inputs, read by SyncRunner): `make bench`;
- distributed_iterator: the same pipeline through tf.distribute's distributed iterator (the earlier design).

The breakdown (worker 0's view): compute = compute_shared; transfer = allreduce_model; waiting for the peer and
hand-offs = sync_constant - compute - transfer; input = trainer - sync_constant.

The scaling model, for N workers each on a machine like this one: step(N) = compute_alone + ring(N) with
ring(N) = 2 (N-1) x latency + 2 (N-1)/N x bytes / bandwidth (a ring all-reduce: 2 (N-1) hops of 1/N of the
gradients), latency = the measured per-hop cost (allreduce_tiny / 2) + --network-latency-us, bandwidth =
the smaller of the measured loopback rate and --network-gbit. Efficiency(N) = compute_alone / step(N): how
close N workers come to N times one worker's examples/s, with the per-worker batch fixed and no stragglers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

os.environ["KERAS_BACKEND"] = "tensorflow"

import keras
import tensorflow as tf

from trainer.__main__ import open_inputs
from trainer.context import parse_config
from trainer.data.datasets import Source, image_spec
from trainer.distribution.cluster import from_environment
from trainer.distribution.strategy import create_strategy, leave_group, share_cores
from trainer.distribution.sync_runner import SyncRunner
from trainer.optimizer import build_optimizer
from trainer.task import task_of

IMAGE_SHAPE, CLASSES = (28, 28, 1), 10
PACK_BYTES = 32 * 1024 * 1024  # one pack for every gradient of this model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.step_costs", description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64, help="the per-worker batch")
    parser.add_argument("--steps", type=int, default=100, help="steps per timed call")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls per figure (the median is kept)")
    parser.add_argument("--network-gbit", type=float, default=10.0, help="the model's link bandwidth, Gbit/s")
    parser.add_argument("--network-latency-us", type=float, default=50.0, help="the model's added latency per hop")
    args = parser.parse_args(argv)
    cluster = from_environment()
    if cluster.num_workers != 2:
        parser.error("run it in each of two processes with a 2-worker TF_CONFIG (make bench does)")
    config = parse_config(
        ["--dataset", "synthetic", "--per-worker-batch-size", str(args.batch), "--train-examples",
         str(2 * args.batch * args.steps * (args.repeats + 1)), "--epochs", "1"],
        environ={},
    )  # fmt: skip
    share_cores(config.threads, cluster)  # the thread pools the trainer would have
    strategy = create_strategy(cluster, config.collective, config.startup_timeout)
    ms = _measure(strategy, cluster, config, args)
    if cluster.is_chief:
        print(json.dumps(_summary(ms, args)), flush=True)
    leave_group(cluster, strategy, config.startup_timeout)
    return 0


def _measure(strategy: Any, cluster: Any, config: Any, args: argparse.Namespace) -> dict[str, float]:
    keras.utils.set_random_seed(config.seed)
    images = tf.random.uniform((args.batch, *IMAGE_SHAPE), seed=1)
    labels = tf.random.uniform((args.batch,), maxval=CLASSES, dtype=tf.int32, seed=2)

    task = task_of(config)
    shapes = Source(train=None, test=None, element_spec=image_spec(IMAGE_SHAPE), num_classes=CLASSES)  # type: ignore[arg-type]
    local_model, local_optimizer = task.build_model(shapes), build_optimizer(task, config, 1e-3, 0)
    local_optimizer.build(local_model.trainable_variables)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def compute(steps: tf.Tensor) -> tf.Tensor:
        for _ in tf.range(steps):
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, local_model(images, training=True))
            gradients = tape.gradient(loss, local_model.trainable_variables)
            local_optimizer.apply_gradients(zip(gradients, local_model.trainable_variables, strict=True))
        return loss

    gradient_like = [tf.zeros(v.shape) for v in local_model.trainable_variables]

    def all_reduce_function(tensors: list[tf.Tensor], bytes_per_pack: int = 0) -> Any:
        options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=bytes_per_pack)

        @tf.function
        def run(steps: tf.Tensor) -> tf.Tensor:
            total = tf.zeros(())
            for _ in tf.range(steps):
                reduced = strategy.run(lambda: tf.distribute.get_replica_context().all_reduce("SUM", tensors, options))
                total += strategy.experimental_local_results(reduced)[0][0][(0,) * len(tensors[0].shape)]
            return total

        return run

    inputs = open_inputs(config, cluster, strategy)
    steps_per_epoch = inputs.steps_per_epoch(config.per_worker_batch_size)
    runner = SyncRunner(config, cluster, strategy, task, inputs)
    with strategy.scope():
        model, optimizer = task.build_model(inputs.source), build_optimizer(task, config, 1e-3, 0)
        optimizer.build(model.trainable_variables)
    runner.start(model, optimizer, 0, steps_per_epoch)
    trainer_iterator = runner.iterator
    no_stop, none_skipped = tf.constant(0.0), tf.constant(0.0)

    def train_steps(iterator: Any, steps: tf.Tensor) -> tf.Tensor:
        """The trainer's own loop over `steps` steps: no stop requested, no step skipped before."""
        return runner.train_steps(iterator, steps, no_stop, none_skipped)

    constant = iter(tf.data.Dataset.from_tensors((images, labels)).repeat())
    distributed = iter(strategy.distribute_datasets_from_function(runner.train_batches(0, steps_per_epoch)))
    barrier = all_reduce_function([tf.zeros(1)])

    def timed(run: Any, alone: bool = False) -> float:
        run(tf.constant(2))  # trace and warm up
        times = []
        for _ in range(args.repeats):
            barrier(tf.constant(1))  # both start together
            if not alone or cluster.is_chief:
                started = time.perf_counter()
                float(tf.reduce_sum(run(tf.constant(args.steps))))
                times.append(1000 * (time.perf_counter() - started) / args.steps)
            barrier(tf.constant(1))
        return statistics.median(times) if times else 0.0

    steps = tf.constant(args.steps)
    collectives = _collective_ops(tf.function(lambda: train_steps(trainer_iterator, steps)).get_concrete_function())
    return {
        "collective_ops_in_the_step_function": float(collectives),
        "compute_alone": timed(compute, alone=True),
        "compute_shared": timed(compute),
        "allreduce_model": timed(all_reduce_function(gradient_like)),
        "allreduce_model_packed": timed(all_reduce_function(gradient_like, bytes_per_pack=PACK_BYTES)),
        "allreduce_tiny": timed(all_reduce_function([tf.zeros(1)])),
        "sync_constant": timed(lambda steps: train_steps(constant, steps)),
        "trainer": timed(lambda steps: train_steps(trainer_iterator, steps)),
        "distributed_iterator": timed(lambda steps: train_steps(distributed, steps)),
        "gradient_bytes": float(sum(v.shape.num_elements() * 4 for v in local_model.trainable_variables)),
    }


def _collective_ops(function: Any) -> int:
    """CollectiveReduceV2 ops in a traced function and every function it calls (the loop body among them)."""
    graph_def = function.graph.as_graph_def()
    nodes = list(graph_def.node) + [node for f in graph_def.library.function for node in f.node_def]
    return sum(1 for node in nodes if node.op.startswith("CollectiveReduce"))


def _summary(ms: dict[str, float], args: argparse.Namespace) -> dict[str, Any]:
    transfer = ms["allreduce_model"]
    breakdown = {
        "compute": ms["compute_shared"],
        "allreduce_transfer": transfer,
        "wait_and_handoffs": ms["sync_constant"] - ms["compute_shared"] - transfer,
        "input": ms["trainer"] - ms["sync_constant"],
    }
    hop_latency_s = ms["allreduce_tiny"] / 2 / 1000 + args.network_latency_us / 1e6
    loopback_bytes_per_s = ms["gradient_bytes"] / max(1e-6, (transfer - ms["allreduce_tiny"]) / 1000)
    bandwidth = min(loopback_bytes_per_s, args.network_gbit * 1e9 / 8)
    compute_s = ms["compute_alone"] / 1000
    predicted = {}
    for workers in (2, 4, 8, 16, 64):
        ring = 2 * (workers - 1) * hop_latency_s + 2 * (workers - 1) / workers * ms["gradient_bytes"] / bandwidth
        predicted[str(workers)] = compute_s / (compute_s + ring)
    return {
        "ms_per_step": ms,
        "breakdown_ms": breakdown,
        "scaling_model": {
            "hop_latency_us": hop_latency_s * 1e6,
            "bandwidth_gbit": bandwidth * 8 / 1e9,
            "loopback_gbit": loopback_bytes_per_s * 8 / 1e9,
            "assumed": {"network_gbit": args.network_gbit, "network_latency_us": args.network_latency_us},
            "efficiency_by_workers": predicted,
        },
    }


if __name__ == "__main__":
    sys.exit(main())
