"""One worker of a real group training the trainer's step with trainer/distribution/allreduce.py's reduction.

    python -m allreduce_probe OUT_DIR COMPRESSION BUCKET_BYTES STEPS     # in each process, TF_CONFIG set

Each worker trains the default task's cnn with the trainer's own step (trainer.step.train_step) on its own
constant batch (seeded by rank, so the workers' gradients differ) and writes OUT_DIR/worker-<rank>.npz: the final
weights (and the initial ones, flattened), the CollectiveReduce ops in the traced step function, and the fp16
scale exponents (if any).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.context import parse_config
from trainer.data.datasets import Source
from trainer.distribution.cluster import from_environment
from trainer.distribution.strategy import create_strategy, leave_group
from trainer.optimizer import build_optimizer
from trainer.step import NonFiniteGuard, train_step
from trainer.task import task_of

BATCH, SHAPE, CLASSES = 16, (28, 28, 1), 10


def main(out_dir: str, compression: str, bucket_bytes: int, steps: int) -> int:
    cluster = from_environment()
    strategy = create_strategy(cluster, "auto", 120)
    keras.utils.set_random_seed(3)
    flags = ["--dataset", "synthetic", "--gradient-compression", compression]
    config = parse_config([*flags, "--gradient-bucket-bytes", str(bucket_bytes)], environ={})
    task = task_of(config)
    example = (tf.TensorSpec(SHAPE, tf.uint8), tf.TensorSpec((), tf.int64))
    source = Source(train=None, test=None, element_spec=example, num_classes=CLASSES)  # type: ignore[arg-type]
    with strategy.scope():
        model = task.build_model(source)
        optimizer = build_optimizer(task, config, 1e-3, steps)
        optimizer.build(model.trainable_variables)
    initial = [v.numpy() for v in model.trainable_variables]
    rng = np.random.default_rng(100 + cluster.rank)
    images = tf.constant(rng.integers(0, 256, (BATCH, *SHAPE), dtype=np.uint8))
    labels = tf.constant(rng.integers(0, CLASSES, (BATCH,), dtype=np.int64))
    global_batch_size = BATCH * cluster.num_workers
    guard = NonFiniteGuard(config.on_nonfinite, loss_scaled=False)  # the trainer's default step

    @functools.partial(tf.function, autograph=False)
    def train_steps(iterator: Any, count: tf.Tensor) -> None:
        def one_step(step: tf.Tensor) -> tuple[tf.Tensor]:
            batch = next(iterator)
            strategy.run(lambda b: train_step(task, model, optimizer, b, global_batch_size, guard), args=(batch,))
            return (step + 1,)

        tf.while_loop(lambda step: step < count, one_step, (tf.constant(0),))

    batches = iter(tf.data.Dataset.from_tensors((images, labels)).repeat())
    function = train_steps.get_concrete_function(batches, tf.constant(steps))
    graph = function.graph.as_graph_def()
    nodes = list(graph.node) + [node for f in graph.library.function for node in f.node_def]
    collectives = sum(1 for node in nodes if node.op.startswith("CollectiveReduce"))
    train_steps(batches, tf.constant(steps))
    # Keras's own reduction (no compression, no buckets) keeps no scales.
    scales = getattr(optimizer._all_reduce_sum_gradients, "exponents", {})
    exponents = [float(tf.convert_to_tensor(v.values[0] if hasattr(v, "values") else v)) for v in scales.values()]
    np.savez(
        f"{out_dir}/worker-{cluster.rank}.npz",
        *[v.numpy() for v in model.trainable_variables],
        initial=np.concatenate([w.ravel() for w in initial]),
        collectives=collectives,
        exponents=np.array(exponents),
    )
    leave_group(cluster, strategy, 60)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
