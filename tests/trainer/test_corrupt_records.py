"""Corrupt TFRecord shards end the run with exit 2 and a line naming the file and the record, whether the
record-counting pass meets them or a training call does mid-epoch; --on-corrupt-record skip trains past them and
counts them in metrics.json. Real `python -m trainer` processes on files written by trainer.data.records."""

from __future__ import annotations

import json
import os
import pathlib
import shutil

import pytest
import tensorflow as tf

from multiworker import async_cluster, run_group, start, start_servers, stop_servers, tf_config, wait_all
from record_files import record_flags, write_records
from trainer.artifacts import layout
from trainer.base.errors import ExitCode
from trainer.data import corrupt_records
from trainer.data.record_counts import RecordCounts

SHARD = "train-00001-of-00004.tfrecord"  # worker 1's first file when two workers share four


@pytest.fixture(scope="module")
def sound_records(tmp_path_factory) -> pathlib.Path:
    """Four training shards of 64 examples each, one test shard and the record index beside them, written once."""
    data = tmp_path_factory.mktemp("sound") / "data"
    data.mkdir()
    write_records(data, 256, 4, 32, 1, seed=3)
    return data


@pytest.fixture
def records(sound_records: pathlib.Path, tmp_path: pathlib.Path) -> tuple[pathlib.Path, list[str]]:
    """A copy of the sound records for one test to damage; copy2 keeps each file's mtime, so the index holds."""
    data = shutil.copytree(sound_records, tmp_path / "data")
    return data, record_flags(data)


def trainer_args(files: list[str], model_dir: pathlib.Path, *flags: str) -> list[str]:
    return [
        "--dataset", "tfrecord", *files, "--image-shape", "28x28x1", "--num-classes", "10",
        "--epochs", "1", "--per-worker-batch-size", "16", "--steps-per-loop", "4",
        "--model-dir", str(model_dir), *flags,
    ]  # fmt: skip


def train_alone(files: list[str], model_dir: pathlib.Path, *flags: str) -> tuple[int, str]:
    finished = wait_all({"alone": start(trainer_args(files, model_dir, *flags), None)}, timeout=240)["alone"]
    return finished.returncode, finished.output


def truncate_inside_a_record(path: pathlib.Path) -> None:
    """A partial copy: the file ends in the middle of a record (a cut exactly between records reads as a shorter
    file, which only the record index can tell)."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2 + 100])


def flip_a_byte(path: pathlib.Path, keep_mtime: bool) -> None:
    """Bit rot: one byte in the middle changes; with keep_mtime the size and modification time stay as indexed."""
    before = os.stat(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


def replace_a_record(path: pathlib.Path, number: int, serialized: bytes) -> None:
    records = list(tf.data.TFRecordDataset(str(path)).as_numpy_iterator())
    records[number] = serialized
    with tf.io.TFRecordWriter(str(path)) as writer:
        for record in records:
            writer.write(record)


def index_as_it_is_now(path: pathlib.Path, records: int) -> None:
    """The record index already holds the damaged file (as if counted before the damage, same size and time):
    no counting pass runs, so the damage shows mid-epoch."""
    RecordCounts(None).store({str(path): records})


def readable(path: pathlib.Path) -> int:
    """Records TensorFlow reads from the file before its first damage (the images are PNGs of varying size)."""
    return int(tf.data.TFRecordDataset(str(path)).ignore_errors().reduce(0, lambda n, _: n + 1))


def error_line(output: str) -> str:
    (line,) = [line for line in output.splitlines() if line.startswith("error: ")]
    return line


@pytest.mark.slow
def test_a_truncated_shard_is_named_by_the_counting_pass(records, tmp_path):
    data, files = records
    truncate_inside_a_record(data / SHARD)  # its size no longer matches the index: it is counted again
    code, output = train_alone(files, tmp_path / "model")
    assert code == ExitCode.BAD_CONFIG, output[-3000:]
    line = error_line(output)
    assert "record-counting pass" in line and str(data / SHARD) in line, line
    assert "truncated" in line and "byte offset" in line and "--on-corrupt-record skip" in line, line


def test_a_truncated_shard_is_named_mid_epoch(records, tmp_path):
    data, files = records
    truncate_inside_a_record(data / SHARD)
    index_as_it_is_now(data / SHARD, 64)
    code, output = train_alone(files, tmp_path / "model")
    assert code == ExitCode.BAD_CONFIG, output[-3000:]
    line = error_line(output)
    assert "reading the input failed in the steps after step" in line and str(data / SHARD) in line, line
    assert f"truncated: the file ends inside record {readable(data / SHARD)}, at byte offset" in line, line
    assert not (tmp_path / "model" / layout.SERVING).exists()


def test_a_flipped_byte_is_named_by_the_counting_pass(records, tmp_path):
    data, files = records
    flip_a_byte(data / SHARD, keep_mtime=False)  # a new modification time: counted again
    code, output = train_alone(files, tmp_path / "model")
    assert code == ExitCode.BAD_CONFIG, output[-3000:]
    line = error_line(output)
    assert "record-counting pass" in line and str(data / SHARD) in line and "checksum (CRC) mismatch" in line, line


@pytest.mark.slow  # several processes for long: make test-slow
def test_a_flipped_byte_is_named_mid_epoch(records, tmp_path):
    data, files = records
    flip_a_byte(data / SHARD, keep_mtime=True)  # the index still matches: only reading finds it
    code, output = train_alone(files, tmp_path / "model")
    assert code == ExitCode.BAD_CONFIG, output[-3000:]
    line = error_line(output)
    assert "reading the input failed" in line and str(data / SHARD) in line, line
    assert f"checksum (CRC) mismatch in record {readable(data / SHARD)}, at byte offset" in line, line


@pytest.mark.slow  # several processes for long: make test-slow
def test_a_record_that_is_not_an_example_is_named_with_its_number(records, tmp_path):
    data, files = records
    replace_a_record(data / SHARD, 17, b"\x08\x01not an example")
    index_as_it_is_now(data / SHARD, 64)
    code, output = train_alone(files, tmp_path / "model")
    assert code == ExitCode.BAD_CONFIG, output[-3000:]
    line = error_line(output)
    assert str(data / SHARD) in line and "record 17 is not a tf.train.Example" in line, line


@pytest.mark.slow  # several processes for long: make test-slow
def test_skip_trains_past_every_kind_and_counts_what_it_skipped(records, tmp_path):
    data, files = records
    replace_a_record(data / SHARD, 17, b"not an example")
    index_as_it_is_now(data / SHARD, 64)
    flipped, truncated = data / "train-00002-of-00004.tfrecord", data / "train-00003-of-00004.tfrecord"
    flip_a_byte(flipped, keep_mtime=True)  # the records from the damaged one on are lost
    truncate_inside_a_record(truncated)  # found by the counting pass
    code, output = train_alone(files, tmp_path / "model", "--on-corrupt-record", "skip")
    assert code == ExitCode.OK, output[-3000:]
    metrics = json.loads((tmp_path / "model" / layout.METRICS).read_text())
    # 1 unparsed + those from the checksum mismatch on + 1 for the truncation the counting pass met (what
    # followed it is unknowable)
    assert metrics["corrupt_records_skipped"] == 1 + (64 - readable(flipped)) + 1
    assert metrics["steps"] == (64 + 64 + 64 + readable(truncated)) // 16  # as indexed; a filler epoch covers drops
    lines = [line for line in output.splitlines() if "--on-corrupt-record skip" in line]
    assert len(lines) == 3, lines  # one per damaged file
    assert any(SHARD in line and "skipped 1 of the 64" in line for line in lines), lines
    assert (tmp_path / "model" / layout.SERVING).is_dir()


def test_a_file_cut_between_records_is_caught_by_its_count(tmp_path):
    path = tmp_path / "cut.tfrecord"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for _ in range(10):
            writer.write(b"x" * 100)
    path.write_bytes(path.read_bytes()[: 4 * (12 + 100 + 4)])  # four whole records remain
    assert corrupt_records.first_corrupt(str(path)) is None  # TensorFlow reads it as a shorter file
    found = corrupt_records.first_corrupt(str(path), expected=10)
    assert found is not None and found.record == 4 and "counted 10" in found.problem


@pytest.mark.slow
def test_two_workers_the_one_reading_the_file_names_it(records, tmp_path):
    data, files = records
    flip_a_byte(data / SHARD, keep_mtime=True)
    finished = run_group(2, trainer_args(files, tmp_path / "model"), timeout=240)
    reader, other = finished["worker-1"], finished["worker-0"]
    assert reader.returncode == ExitCode.BAD_CONFIG, reader.output[-3000:]
    assert str(data / SHARD) in error_line(reader.output)
    # The peer loses the group (retryable); the reader's permanent exit 2 fails the job.
    assert other.returncode in (ExitCode.GROUP_FAILED, ExitCode.BAD_CONFIG), other.output[-3000:]


@pytest.mark.slow
def test_two_workers_skip_together_and_count_once(records, tmp_path):
    data, files = records
    flip_a_byte(data / SHARD, keep_mtime=True)
    finished = run_group(2, trainer_args(files, tmp_path / "model", "--on-corrupt-record", "skip"), timeout=240)
    assert all(run.returncode == 0 for run in finished.values()), {n: r.output[-2000:] for n, r in finished.items()}
    digests = {run.output.split("weights sha256 ")[-1].split()[0] for run in finished.values()}
    assert len(digests) == 1  # the group stayed in step
    metrics = json.loads((tmp_path / "model" / layout.METRICS).read_text())
    assert metrics["corrupt_records_skipped"] == 64 - readable(data / SHARD)


@pytest.mark.slow  # several processes for long: make test-slow
def test_skip_on_sound_files_trains_exactly_as_fail(records, tmp_path):
    _, files = records
    digests = []
    for mode in ("fail", "skip"):
        code, output = train_alone(files, tmp_path / mode, "--on-corrupt-record", mode)
        assert code == ExitCode.OK, output[-3000:]
        digests.append(json.loads((tmp_path / mode / layout.METRICS).read_text())["weights_sha256"])
    assert digests[0] == digests[1]  # the same records in the same order: exact resume is untouched
    assert json.loads((tmp_path / "skip" / layout.METRICS).read_text())["corrupt_records_skipped"] == 0


def test_skip_is_refused_under_parameter_servers_before_the_group_forms(records, tmp_path):
    _, files = records
    cluster = async_cluster(1, 1)
    chief = start(
        trainer_args(files, tmp_path / "model", "--on-corrupt-record", "skip"), tf_config(cluster, "chief", 0)
    )
    finished = wait_all({"chief": chief}, timeout=120)["chief"]
    assert finished.returncode == ExitCode.BAD_CONFIG, finished.output[-3000:]
    assert "--on-corrupt-record skip" in error_line(finished.output)


@pytest.mark.slow  # several processes for long: make test-slow
def test_the_data_check_names_a_corrupt_file_before_any_trainer_starts(records, tmp_path):
    data, files = records
    flip_a_byte(data / SHARD, keep_mtime=False)
    flags = [*files, "--image-shape", "28x28x1", "--num-classes", "10", "--model-dir", str(tmp_path / "model")]
    checked = wait_all({"check": start(["--dataset", "tfrecord", *flags], None, module="trainer.data")}, 120)["check"]
    assert checked.returncode == ExitCode.BAD_CONFIG, checked.output[-3000:]
    assert str(data / SHARD) in error_line(checked.output) and "checksum (CRC) mismatch" in checked.output


@pytest.mark.slow
def test_parameter_servers_the_chief_names_the_file_a_worker_failed_on(records, tmp_path):
    data, files = records
    flip_a_byte(data / SHARD, keep_mtime=True)
    cluster = async_cluster(1, 1)
    args = trainer_args(files, tmp_path / "model")
    servers = start_servers(cluster, args)
    try:
        chief = wait_all({"chief": start(args, tf_config(cluster, "chief", 0))}, timeout=240)["chief"]
    finally:
        stop_servers(servers)
    assert chief.returncode == ExitCode.BAD_CONFIG, chief.output[-3000:]
    line = error_line(chief.output)
    assert str(data / SHARD) in line and "checksum (CRC) mismatch" in line, line
