"""Peak RSS of one worker's training pipeline alone: `python -m rss_probe EXAMPLES CACHE BATCHES`.

Builds the synthetic training shard of EXAMPLES examples with the trainer's own pipeline (per-worker
batch 64, default shuffle buffer, as many epochs as BATCHES needs), reads BATCHES batches, and prints
{"examples", "peak_rss_mb", "seconds_to_first_batch"}; the peak is the kernel's figure (getrusage ru_maxrss).
"""

import json
import resource
import sys
import time

from trainer.data import catalog, pipeline, synthetic
from trainer.settings.config import Config


def main(examples: int, cache: str, batches: int) -> None:
    config = Config(dataset="synthetic", train_examples=examples)
    shard = catalog.load(config).train.shard(0, 1)
    steps = shard.size // 64
    epochs = -(-batches // steps)  # past the end of a small shard: a cache of it would then be full
    dataset = pipeline.train_batches(
        shard,
        0,
        64,
        steps * 64,
        config.seed,
        epochs,
        0,
        steps,
        config.shuffle_buffer,
        pipeline.cache_kind(cache, shard, synthetic.source(config).example_bytes),
    )
    started = time.perf_counter()
    iterator = iter(dataset)
    next(iterator)
    first = time.perf_counter() - started
    for _ in range(batches - 1):
        next(iterator)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        json.dumps({"examples": examples, "peak_rss_mb": round(peak_mb, 1), "seconds_to_first_batch": round(first, 2)})
    )


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
