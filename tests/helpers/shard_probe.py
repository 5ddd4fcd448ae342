"""One worker of a real group: records the example ids its own input pipeline yields, step by step.

Run as `python -m shard_probe OUT.json TRAINER_FLAGS...` with TF_CONFIG set, on a --dataset tfrecord
whose --label-feature is `index` (trainer.data.records writes each example's position there). It builds the
pipeline through the trainer's own functions, feeds it through distribute_datasets_from_function as
the trainer does, and writes {"rank", "steps": [[ids of step 0], ...], "test": [ids]}.
"""

import json
import sys

import tensorflow as tf

from trainer.context import parse_config
from trainer.data import catalog, pipeline
from trainer.distribution.cluster import from_environment
from trainer.distribution.strategy import create_strategy


def main(out_path: str, argv: list[str]) -> None:
    config = parse_config(argv)
    cluster = from_environment()
    strategy = create_strategy(cluster, "auto", startup_timeout=60)
    source = catalog.load(config)
    train, test = (
        source.train.shard(cluster.rank, cluster.num_workers),
        source.test.shard(cluster.rank, cluster.num_workers),
    )
    sizes = strategy.reduce(
        "SUM", strategy.run(lambda: tf.one_hot(cluster.rank, cluster.num_workers) * train.size), axis=None
    )
    steps = pipeline.steps_per_epoch([int(size) for size in sizes.numpy()], config.per_worker_batch_size)
    batches = strategy.distribute_datasets_from_function(
        lambda context: pipeline.train_batches(
            train,
            cluster.rank,
            config.per_worker_batch_size,
            steps * config.per_worker_batch_size,
            config.seed,
            config.epochs,
            0,
            steps,
            config.shuffle_buffer,
            pipeline.cache_kind(config.cache, train, source.example_bytes),
        )
    )
    iterator = iter(batches)
    seen = [
        [int(v) for part in strategy.experimental_local_results(next(iterator)[1]) for v in part.numpy()]
        for _ in range(steps * config.epochs)
    ]
    tested = [
        int(v)
        for _, labels in pipeline.test_batches(test, config.per_worker_batch_size, test.size)
        for v in labels.numpy()
    ]
    # A last all-reduce so neither worker exits while the other still needs the group.
    strategy.reduce("SUM", strategy.run(lambda: tf.constant(1)), axis=None)
    with open(out_path, "w") as handle:
        json.dump({"rank": cluster.rank, "steps": seen, "test": tested, "reads": train.reads}, handle)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
