"""Each worker's input pipeline: its own shard, shuffled per epoch, in per-replica batches.

Every worker builds only its shard of the split (its Split decides which files or ranges), so
its memory and reading follow the shard, not the dataset. The group agrees on steps per epoch first
(the smallest shard decides), so every worker runs the same number of steps by construction.

Order: epoch e's records come in an order fixed by (seed, e, worker): a file order seeded by (seed, e) alone
(the same on every worker, as element sharding needs), a deterministic interleave, and a bounded shuffle
buffer (--shuffle-buffer) over the records, or over the decoded shard when it is cached (--cache); an
uncached generated shard is a full seeded permutation, no buffer needed.
Resuming at step s rebuilds epoch s // steps_per_epoch and skips the records of the steps already done
*before* decoding them: a resume costs reading (not decoding) that many records of this worker's shard
plus one shuffle buffer; an uncached generated shard skips for free.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import tensorflow as tf

from trainer.base.errors import DataError
from trainer.data.datasets import Shard

# --cache auto keeps a worker's decoded shard in memory below this size: small data stays fast.
AUTO_CACHE_BYTES = 256 * 1024 * 1024


def epoch_seed(seed: int | tf.Tensor, epoch: tf.Tensor, worker: int) -> tf.Tensor:
    """The seed of one worker's shuffle buffer in one epoch."""
    return shared_epoch_seed(seed, epoch) * 1_009 + worker


def shared_epoch_seed(seed: int | tf.Tensor, epoch: tf.Tensor) -> tf.Tensor:
    """The seed of the epoch's record order, the same on every worker: element sharding keeps every n-th record of
    one stream, which must be the same stream everywhere (a worker-dependent file order made shards overlap)."""
    return tf.cast(seed, tf.int64) * 1_000_003 + tf.cast(epoch, tf.int64)


def cache_kind(cache: str, shard: Shard, example_bytes: int) -> str:
    """What --cache means for this shard: auto is memory below AUTO_CACHE_BYTES of decoded examples, else none.
    example_bytes: one decoded example's size (Source.example_bytes)."""
    if cache != "auto":
        return cache
    return "memory" if shard.size * example_bytes <= AUTO_CACHE_BYTES else "none"


def steps_per_epoch(shard_sizes: list[int], per_worker_batch: int) -> int:
    """The steps every worker runs per epoch, given every worker's shard size: the smallest shard decides."""
    steps = min(shard_sizes) // per_worker_batch
    if steps < 1:
        raise DataError(
            f"the smallest worker's shard of the training split has {min(shard_sizes)} examples, fewer "
            f"than one per-worker batch of {per_worker_batch}; lower --per-worker-batch-size, use "
            f"fewer workers or more --train-examples"
        )
    return steps


def train_batches(
    shard: Shard,
    worker: int,
    batch_size: int,
    examples_per_epoch: int,
    seed: int,
    epochs: int,
    start_step: int,
    steps_per_epoch: int,
    shuffle_buffer: int,
    cache: str,
) -> tf.data.Dataset:
    """This worker's batches of `batch_size` for every step from `start_step` to the end of the last epoch.

    examples_per_epoch = steps_per_epoch x the worker's examples per step (all its replicas' batches);
    cache is what cache_kind() resolved: memory, disk or none.
    """
    start_epoch, steps_done = divmod(start_step, steps_per_epoch)
    skip = tf.constant(steps_done * examples_per_epoch // steps_per_epoch, tf.int64)
    cached = _cached(shard, cache)

    def epoch_records(epoch: tf.Tensor) -> tf.data.Dataset:
        records = shard.records(shared_epoch_seed(seed, epoch))
        if not shard.shuffled:
            records = records.shuffle(
                shuffle_buffer, seed=epoch_seed(seed, epoch, worker), reshuffle_each_iteration=False
            )
        return records.take(examples_per_epoch).skip(tf.where(epoch == start_epoch, skip, 0))

    def epoch_cached_batches(epoch: tf.Tensor) -> tf.data.Dataset:
        # A cache holds the shard in one fixed order: the buffer shuffles it anew each epoch. Batched before
        # take/skip (whole batches, since an epoch and a skip are whole steps), so those cost per batch.
        assert cached is not None
        shuffled = cached.shuffle(shuffle_buffer, seed=epoch_seed(seed, epoch, worker), reshuffle_each_iteration=False)
        batches = shuffled.batch(batch_size, drop_remainder=True).take(examples_per_epoch // batch_size)
        return batches.skip(tf.where(epoch == start_epoch, skip // batch_size, 0))

    # A shard that skips corrupt records falls short of its count: one more epoch behind the last fills the steps.
    epochs_range = tf.data.Dataset.range(start_epoch, epochs + (1 if shard.skipped is not None else 0))
    if cached is None:
        records = epochs_range.flat_map(epoch_records)  # skipped records are never decoded
        batches = records.map(shard.decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True).batch(
            batch_size, drop_remainder=True
        )
    else:
        batches = epochs_range.flat_map(epoch_cached_batches)
    return _deterministic(batches.prefetch(tf.data.AUTOTUNE))


def test_batches(shard: Shard, batch_size: int, limit: int, cache: str = "none") -> tf.data.Dataset:
    """This worker's test examples, each once, in batches; the last batch is partial (nothing is dropped or
    repeated), and workers with fewer batches idle while the others finish. cache (as cache_kind() resolved
    it for this shard) keeps the decoded examples for the evaluations after the first."""
    records = shard.records(tf.constant(0, tf.int64)).take(limit)
    decoded = records.map(shard.decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    if cache != "none":
        decoded = _stored(decoded, cache)
    return _deterministic(decoded.batch(batch_size).prefetch(tf.data.AUTOTUNE))


def _cached(shard: Shard, cache: str) -> tf.data.Dataset | None:
    if cache == "none":
        return None
    decoded = shard.records(tf.constant(0, tf.int64)).map(
        shard.decode, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True
    )
    return _stored(decoded, cache)


def _stored(decoded: tf.data.Dataset, cache: str) -> tf.data.Dataset:
    """decoded, filled once and then read from memory or from a scratch file (cache: memory or disk)."""
    if cache == "memory":
        return decoded.cache()
    directory = tempfile.mkdtemp(prefix="trainer-cache-")
    atexit.register(shutil.rmtree, directory, ignore_errors=True)  # a worker's scratch, gone with it
    return decoded.cache(os.path.join(directory, "shard"))


def _deterministic(dataset: tf.data.Dataset) -> tf.data.Dataset:
    options = tf.data.Options()
    options.deterministic = True
    # tf.data's autotuner runs a thread beside the step, and destroying its iterator at the end of a run could block
    # for seconds (docs/bench.md, "Start-up and exit"); AUTOTUNE values then mean the number of cores for parallel
    # maps and a fixed buffer for prefetch.
    options.autotune.enabled = False
    # Each worker's dataset is already its own shard: tf.distribute must not shard it again.
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return dataset.with_options(options)
