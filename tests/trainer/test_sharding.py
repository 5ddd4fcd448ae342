"""Sharding you can trust: every worker's pipeline built in this process, as each worker builds its own.

Per epoch, the workers' examples are pairwise disjoint and together they are the split minus the dropped remainder,
for every file count against every worker count (by file, and by element when there are fewer files than
workers) and every cache kind.
"""

import pytest

from trainer.data import pipeline, records, tfrecord

EXAMPLES, BATCH, EPOCHS, SEED = 75, 4, 2, 5


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    """A split of EXAMPLES records in 1..5 files (raw images, each example's index as its label)."""
    found = {}
    for files in range(1, 6):
        out = tmp_path_factory.mktemp(f"files{files}")
        paths = records.write_split(str(out), "train", EXAMPLES, files, seed=1, encoding="raw")
        found[files] = tfrecord.RecordFiles(tuple(paths), (28, 28, 1), label_feature="index")
    return found


def epochs_seen(split, workers, cache):
    """Each worker's example ids, per epoch: [epoch][worker] -> ids."""
    shards = [split.shard(rank, workers) for rank in range(workers)]
    steps = pipeline.steps_per_epoch([shard.size for shard in shards], BATCH)
    seen = []
    for rank, shard in enumerate(shards):
        batches = pipeline.train_batches(shard, rank, BATCH, steps * BATCH, SEED, EPOCHS, 0, steps, 10, cache)
        ids = [int(i) for _, labels in batches for i in labels.numpy()]
        assert len(ids) == EPOCHS * steps * BATCH
        seen.append([ids[epoch * steps * BATCH : (epoch + 1) * steps * BATCH] for epoch in range(EPOCHS)])
    return [[seen[rank][epoch] for rank in range(workers)] for epoch in range(EPOCHS)], steps


@pytest.mark.parametrize("cache", ["memory", "disk", "none"])
@pytest.mark.parametrize("workers", [1, 2, 3, 4])
# 1-3 files against 1-4 workers take both routes (by file, by element) and uneven shards; 4 and 5 files, slow.
@pytest.mark.parametrize("files", [1, 2, 3, *(pytest.param(files, marks=pytest.mark.slow) for files in (4, 5))])
def test_each_epoch_the_workers_examples_are_disjoint_and_make_up_the_split(splits, files, workers, cache):
    by_epoch, steps = epochs_seen(splits[files], workers, cache)
    for epoch, per_worker in enumerate(by_epoch):
        union = [i for ids in per_worker for i in ids]
        # No example twice, in one worker or across workers ...
        assert len(union) == len(set(union)), (epoch, [sorted(ids) for ids in per_worker])
        # ... and every example of the split but the remainder the whole batches leave out.
        assert set(union) <= set(range(EXAMPLES))
        assert len(union) == workers * steps * BATCH  # the smallest shard sets the steps: the rest is dropped
    assert [sorted(ids) for ids in by_epoch[0]] != [] and by_epoch[0] != by_epoch[1]  # a new order each epoch
