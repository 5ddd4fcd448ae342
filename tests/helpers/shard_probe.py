"""One worker of a real group: records which example ids its shard of the training pipeline yields.

Run as `python -m shard_probe OUT.json SIZE PER_WORKER_BATCH EPOCHS` with TF_CONFIG set.
"""

import json
import sys

import tensorflow as tf

from trainer import data
from trainer.cluster import from_environment
from trainer.strategy import create_strategy


def main(out_path: str, size: int, per_worker_batch: int, epochs: int) -> None:
    cluster = from_environment()
    strategy = create_strategy(cluster, "auto", startup_timeout=60)
    global_batch = per_worker_batch * cluster.num_workers
    examples = tf.data.Dataset.range(size).map(lambda i: (i, i))
    pipeline = data.train_pipeline(examples, size, global_batch, seed=11, epochs=epochs)
    iterator = iter(strategy.experimental_distribute_dataset(pipeline))
    steps = [[int(v) for part in strategy.experimental_local_results(next(iterator)[0]) for v in part.numpy()]
             for _ in range((size // global_batch) * epochs)]
    # A last all-reduce so neither worker exits while the other still needs the group.
    strategy.reduce("SUM", strategy.run(lambda: tf.constant(1)), axis=None)
    with open(out_path, "w") as handle:
        json.dump({"rank": cluster.rank, "steps": steps}, handle)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
