"""One worker of a real group training the trainer's step with trainer/distribution/allreduce.py's reduction.

    python -m allreduce_probe OUT_DIR COMPRESSION BUCKET_BYTES STEPS     # in each process, TF_CONFIG set

Each worker trains the cnn model with the trainer's own step function (trainer.train.step_functions) on its own
constant batch (seeded by rank, so the workers' gradients differ) and writes OUT_DIR/worker-<rank>.npz: the final
weights (and the initial ones, flattened), the CollectiveReduce ops in the traced step function, and the fp16
scale exponents (if any).
"""

from __future__ import annotations

import sys

import keras
import numpy as np
import tensorflow as tf

from trainer.distribution import allreduce
from trainer.distribution.cluster import from_environment
from trainer.distribution.strategy import create_strategy, leave_group
from trainer.model import build_model, build_optimizer
from trainer.train import Metrics, step_functions

BATCH, SHAPE, CLASSES = 16, (28, 28, 1), 10


def main(out_dir: str, compression: str, bucket_bytes: int, steps: int) -> int:
    cluster = from_environment()
    strategy = create_strategy(cluster, "auto", 120)
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = build_model("cnn", SHAPE, CLASSES)
        optimizer = allreduce.install(build_optimizer(1e-3), compression, bucket_bytes)
        optimizer.build(model.trainable_variables)
        metrics = Metrics()
    initial = [v.numpy() for v in model.trainable_variables]
    rng = np.random.default_rng(100 + cluster.rank)
    images = tf.constant(rng.integers(0, 256, (BATCH, *SHAPE), dtype=np.uint8))
    labels = tf.constant(rng.integers(0, CLASSES, (BATCH,), dtype=np.int64))
    train_steps, _ = step_functions(strategy, model, optimizer, metrics, BATCH * cluster.num_workers, None)
    batches = iter(tf.data.Dataset.from_tensors((images, labels)).repeat())
    function = train_steps.get_concrete_function(batches, tf.constant(steps), tf.constant(0))
    graph = function.graph.as_graph_def()
    nodes = list(graph.node) + [node for f in graph.library.function for node in f.node_def]
    collectives = sum(1 for node in nodes if node.op.startswith("CollectiveReduce"))
    train_steps(batches, tf.constant(steps), tf.constant(0))
    reducer = optimizer._all_reduce_sum_gradients
    exponents = [
        float(tf.convert_to_tensor(v.values[0] if hasattr(v, "values") else v)) for v in reducer.exponents.values()
    ]
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
