"""Record counts from an index written once: no counting pass before the first step, and none after a restart."""

import json
import logging
import os
import subprocess
import sys
import threading

import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from multiworker import ROOT
from trainer.data import datasets, record_counts, records, tfrecord
from trainer.data.tfds import TfdsSplit


def write_elsewhere(directory, sizes):
    """TFRecord files written by someone else's tool: no index beside them."""
    paths = []
    for number, size in enumerate(sizes):
        path = str(directory / f"train-{number}.tfrecord")
        with tf.io.TFRecordWriter(path) as writer:
            for record in range(size):  # a 1x1x1 raw image and its class: what the data check decodes
                feature = {
                    "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[bytes([record % 256])])),
                    "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[record % 2])),
                }
                writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
        paths.append(path)
    return paths


@pytest.fixture
def no_counting(monkeypatch):
    """Any count of a file's records fails the test: the sizes must come from the index."""

    def count(files):
        raise AssertionError(f"counted the records of {files}")

    monkeypatch.setattr(record_counts, "count_records", count)


def test_files_written_by_the_records_tool_are_never_counted(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["records"])
    assert (
        records.main(
            ["--out", str(tmp_path), "--train-examples", "50", "--train-shards", "3"]
            + ["--test-examples", "7", "--test-shards", "1", "--encoding", "raw"]
        )
        == 0
    )
    assert os.path.exists(tmp_path / record_counts.INDEX_NAME)

    def count(files):
        raise AssertionError(f"counted the records of {files}")

    monkeypatch.setattr(record_counts, "count_records", count)
    train = tfrecord.RecordFiles(tfrecord.glob_files(str(tmp_path / "train-*"), "--train-files"), (28, 28, 1))
    assert [train.shard(rank, 2).size for rank in range(2)] == [17 + 16, 17]  # files 0, 2 and file 1
    assert train.shard(1, 4).size == datasets.share(50, 1, 4)  # element sharding: every file's count is known


def test_the_trainer_counts_once_and_writes_the_index_for_the_next_start(tmp_path, monkeypatch):
    files = tuple(write_elsewhere(tmp_path, [5, 7, 9]))
    assert tfrecord.RecordFiles(files, (1, 1, 1)).shard(0, 1).size == 21
    monkeypatch.setattr(record_counts, "count_records", lambda files: pytest.fail(f"counted {files} again"))
    assert tfrecord.RecordFiles(files, (1, 1, 1)).shard(0, 1).size == 21


def test_a_glob_of_the_whole_folder_does_not_take_the_index_for_a_data_file(tmp_path):
    write_elsewhere(tmp_path, [2, 3])
    files = tfrecord.glob_files(str(tmp_path / "*"), "--train-files")
    assert tfrecord.RecordFiles(files, (1, 1, 1)).shard(0, 1).size == 5  # writes the index beside them
    assert tfrecord.glob_files(str(tmp_path / "*"), "--train-files") == files


def test_a_changed_file_is_recounted_with_one_log_line(tmp_path, caplog):
    files = tuple(write_elsewhere(tmp_path, [5, 7]))
    assert tfrecord.RecordFiles(files, (1, 1, 1)).shard(0, 1).size == 12
    with tf.io.TFRecordWriter(files[1]) as writer:  # rewritten with other contents: size and mtime change
        for _ in range(11):
            writer.write(b"y" * 10)
    with caplog.at_level(logging.INFO, logger="trainer"):
        assert tfrecord.RecordFiles(files, (1, 1, 1)).shard(0, 1).size == 16
    stale = [record.getMessage() for record in caplog.records if "recount" in record.getMessage()]
    assert len(stale) == 1 and "train-1.tfrecord" in stale[0] and "changed" in stale[0], stale


def test_a_read_only_data_folder_keeps_its_index_in_the_model_dir(tmp_path, monkeypatch):
    data, model_dir = tmp_path / "data", tmp_path / "model"
    data.mkdir()
    files = tuple(write_elsewhere(data, [4, 6]))
    os.chmod(data, 0o555)
    monkeypatch.setattr(os, "access", lambda path, mode: not str(path).startswith(str(data)))  # root ignores modes
    try:
        split = tfrecord.RecordFiles(files, (1, 1, 1), counts=record_counts.RecordCounts(str(model_dir)))
        assert split.shard(0, 1).size == 10
        assert not os.path.exists(data / record_counts.INDEX_NAME)
        assert os.path.exists(model_dir / record_counts.INDEX_NAME)
        monkeypatch.setattr(record_counts, "count_records", lambda files: pytest.fail(f"counted {files} again"))
        assert (
            tfrecord.RecordFiles(files, (1, 1, 1), counts=record_counts.RecordCounts(str(model_dir))).shard(0, 1).size
            == 10
        )
    finally:
        os.chmod(data, 0o755)


def test_workers_writing_the_index_at_once_never_leave_it_partial_nor_drop_entries(tmp_path, monkeypatch):
    """Four writers, each its own RecordCounts (as each worker process has), store once each, all at the same
    moment. The read-modify-write window is held open: a writer that has read the index waits until every other
    writer has read it too or is waiting at the lock, so without the lock all four read the same index before any
    of them writes, and each write would drop the others' entries. With it, each waits at the lock in turn."""
    files = write_elsewhere(tmp_path, [3] * 8)
    index = tmp_path / record_counts.INDEX_NAME
    writers: list[threading.Thread] = []
    have_read, at_the_lock, changed = set(), set(), threading.Condition()
    real_read, real_flock = record_counts._read, record_counts.fcntl.flock

    def read_and_hold_the_window_open(path):
        entries = real_read(path)
        me = threading.current_thread()
        if me in writers:
            with changed:
                have_read.add(me)
                changed.notify_all()
                others = [writer for writer in writers if writer is not me]
                assert changed.wait_for(lambda: all(w in have_read or w in at_the_lock for w in others), timeout=60)
        return entries

    def flock(descriptor, operation):
        me = threading.current_thread()
        if operation == record_counts.fcntl.LOCK_EX:
            with changed:
                at_the_lock.add(me)
                changed.notify_all()
        real_flock(descriptor, operation)
        with changed:
            at_the_lock.discard(me)

    monkeypatch.setattr(record_counts, "_read", read_and_hold_the_window_open)
    monkeypatch.setattr(record_counts.fcntl, "flock", flock)
    start = threading.Barrier(4)
    failures = []

    def store_once(own):
        try:
            start.wait(timeout=60)
            record_counts.RecordCounts(None).store(dict.fromkeys(own, 3))
        except BaseException as error:  # noqa: BLE001 - reported by the test thread below
            failures.append(error)

    writers += [threading.Thread(target=store_once, args=(files[worker::4],)) for worker in range(4)]
    for writer in writers:
        writer.start()
    while any(writer.is_alive() for writer in writers):
        if index.exists():
            json.loads(index.read_text())  # whole, whatever moment it is read at
    for writer in writers:
        writer.join()
    assert failures == []
    assert have_read == set(writers)  # every writer went through the widened window
    assert set(json.loads(index.read_text())["files"]) == {os.path.basename(path) for path in files}
    assert not [name for name in os.listdir(tmp_path) if ".partial-" in name]


@pytest.mark.slow  # the data check to its end: make test-slow (the trainer's own index tests stay quick)
def test_the_data_check_writes_the_index_for_files_written_elsewhere(tmp_path):
    train, test = tmp_path / "train", tmp_path / "test"
    train.mkdir()
    test.mkdir()
    write_elsewhere(train, [4, 4])
    write_elsewhere(test, [3])
    result = subprocess.run(
        [sys.executable, "-m", "trainer.data", "--dataset", "tfrecord", "--image-shape", "1x1x1"]
        + ["--num-classes", "2", "--train-files", str(train / "*"), "--test-files", str(test / "*")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "train 2 files 8 examples, test 1 files 3 examples" in result.stdout
    assert os.path.exists(train / record_counts.INDEX_NAME) and os.path.exists(test / record_counts.INDEX_NAME)


class SupervisedDummyMnist(tfds.testing.DummyMnist):
    """A real TFDS builder with split metadata, prepared here without a download (mock_data has no metadata)."""

    def _info(self):
        info = super()._info()
        return tfds.core.DatasetInfo(builder=self, features=info.features, supervised_keys=("image", "label"))


def test_tfds_split_sizes_come_from_the_builders_metadata(tmp_path, monkeypatch):
    builder = SupervisedDummyMnist(data_dir=str(tmp_path))
    builder.download_and_prepare()
    monkeypatch.setattr(tf.data.Dataset, "reduce", lambda *args, **kwargs: pytest.fail("counted a TFDS split"))
    split = TfdsSplit(builder, "train")
    assert [split.shard(rank, 3).size for rank in range(3)] == [
        builder.info.splits[part].num_examples for part in tfds.even_splits("train", 3)
    ]
    assert sum(split.shard(rank, 3).size for rank in range(3)) == builder.info.splits["train"].num_examples == 20


@pytest.mark.parametrize(
    "index",
    [
        [1, 2],
        {"files": ["train-0.tfrecord"]},
        {"files": {"train-0.tfrecord": 5}},
        {"files": {"train-0.tfrecord": {"bytes": "many", "mtime_ns": 1, "records": 5}}},
        {"files": {"train-0.tfrecord": {"bytes": 1, "mtime_ns": 1, "records": None}}},
    ],
    ids=["a list", "files a list", "an entry a number", "bytes a string", "records null"],
)
def test_an_index_of_the_wrong_shape_counts_as_absent_and_the_files_are_counted_again(tmp_path, index):
    files = tuple(write_elsewhere(tmp_path, [5]))
    (tmp_path / record_counts.INDEX_NAME).write_text(json.dumps(index))
    assert tfrecord.RecordFiles(files, (1, 1, 1)).shard(0, 1).size == 5
    written = json.loads((tmp_path / record_counts.INDEX_NAME).read_text())
    assert written["files"]["train-0.tfrecord"]["records"] == 5  # rewritten in the right shape
