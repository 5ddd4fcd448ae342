"""Corrupt TFRecord files, named: which file, which record, and what to do; and `--on-corrupt-record skip`.

TensorFlow's reader says only "truncated record at <byte>" or "corrupted record at <byte>" (a checksum
mismatch), and a record that is not a tf.train.Example fails its parse; none names the file. Wherever such an
error surfaces (the record-counting pass, or a training or evaluation call mid-epoch, inside the traced steps)
the trainer reads this process's files again, one by one, to find the first bad one (`first_corrupt`), and
raises a CorruptRecordError (exit 2) that names it. That scan runs only after a failure: the healthy input
pipeline is the same graph with no per-record bookkeeping, so its speed and its record order stay as they were.

Skip mode (`--on-corrupt-record skip`) reads each file with TensorFlow's `ignore_errors`: a record that does not
parse is dropped alone, while a read error (truncation, checksum) ends that file for the epoch, since the reader
cannot find the next record boundary past a damaged one. Each file's kept records are compared with the record
index's count at its end: the difference is what was skipped, logged once per file and counted for metrics.json.
"""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from trainer.base.errors import CorruptRecordError, DataError, first_line
from trainer.data.datasets import LABEL_FIX, LABEL_OUT_OF_RANGE
from trainer.data.images import FORMATS

log = logging.getLogger(__name__)

FIX = (
    "restore or rewrite that file from its source, or pass --on-corrupt-record skip to train on without such "
    "records (docs/data.md says what skipping does to exact resume)"
)
Parse = Callable[[tf.Tensor], Any]  # a serialized record -> its parsed (or decoded) tensors


class CorruptRecord:
    """The first problem in one file: records before it (its record number, from 0) read and parse."""

    def __init__(self, path: str, record: int, problem: str, fix: str = FIX) -> None:
        self.path, self.record, self.problem, self.fix = path, record, problem, fix

    def error(self, where: str) -> CorruptRecordError:
        return CorruptRecordError(f"{where}: {self.path}: {self.problem}; {self.fix}")


def first_corrupt(path: str, expected: int | None = None, parse: Parse | None = None) -> CorruptRecord | None:
    """Reads one file through (and parses each record with `parse`, when given): its first problem, or None.
    expected: the record index's count, so a file cut at a record boundary, which reads cleanly, is caught too."""
    try:
        total = _count(tf.data.TFRecordDataset(path))
    except tf.errors.DataLossError as error:
        readable = _count(tf.data.TFRecordDataset(path).ignore_errors())
        return CorruptRecord(path, readable, _read_problem(plain(first_line(error)), readable))
    if parse is not None:
        unparsed = _first_unparsed(path, parse, total)
        if unparsed is not None:
            return unparsed
    if expected is not None and total < expected:
        return CorruptRecord(
            path,
            total,
            f"holds {total} records where the record index counted {expected}: it was truncated or rewritten "
            f"after it was counted",
        )
    return None


def from_input(error: BaseException) -> bool:
    """Whether a TensorFlow error may come from reading or parsing records (the input pipeline), not the model."""
    if isinstance(error, tf.errors.DataLossError):
        return True
    text = str(error)
    input_side = "GetNext" in text or "Error in user-defined function passed to" in text
    return isinstance(error, tf.errors.InvalidArgumentError | tf.errors.OutOfRangeError) and input_side


def named(error: BaseException, shards: Sequence[Any], where: str) -> DataError | None:
    """The DataError naming the file (or record) behind `error`, found by reading the shards' data again (each a
    trainer.data.datasets.Shard: its TFRecord `files`, or its own `scan`); None when the error is not the input's
    or everything reads."""
    if not from_input(error):
        return None
    for shard in shards:
        found_by_scan = shard.scan(where) if shard.scan is not None else None
        if found_by_scan is not None:
            return found_by_scan
    files = [(path, expected, shard.decode) for shard in shards for path, expected in shard.files]
    if files:
        log.warning(
            "%s (%s); reading this worker's %d file(s) again to name it", where, type(error).__name__, len(files)
        )
    for path, expected, decode in files:
        found = first_corrupt(path, expected, decode)
        if found is not None:
            return found.error(where)
    label = _label_problem(str(error))  # a traced call's error opens with "Graph execution error:", not with it
    return DataError(f"{where}: {label}; {LABEL_FIX}") if label is not None else None


def _label_problem(text: str) -> str | None:
    """The label check's (datasets.with_label_check) words in a TensorFlow error's text, as one phrase; None when
    the error is not the label check's. Traced, its text reads "assertion failed: [class id out of range] [7]
    [is not in [0, 3)] [in record] [29]", after tf.data's words; eager, "Expected ... to be true. Summarized data:
    b'class id out of range'" with each value on a line of its own."""
    found = re.search(rf"{LABEL_OUT_OF_RANGE}\D*?(-?\d+)\D*?is not in \[0, (\d+)\)(?:\D*?in record\D*?(\d+))?", text)
    if found is None:
        return None
    class_id, num_classes, record = found.groups()
    at = f" (record {record})" if record else ""
    return f"{LABEL_OUT_OF_RANGE}: {class_id} is not in [0, {num_classes}){at}"


def plain(message: str) -> str:
    """A TensorFlow error's text without the kernel's function name and op tag around it."""
    return re.sub(r"\{\{function_node [^}]*\}\}\s*|\s*\[Op:[^\]]*\].*$", "", message).strip()


def _count(records: tf.data.Dataset) -> int:
    return int(records.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1))


def _read_problem(message: str, record: int) -> str:
    offset = re.search(r"record at (\d+)", message)
    at = f"record {record}, at byte offset {offset.group(1)}" if offset else f"record {record}"
    if "truncated record" in message:
        return f"truncated: the file ends inside {at} (a partial copy or an interrupted write)"
    if "corrupted record" in message:
        return f"checksum (CRC) mismatch in {at}: its bytes changed after it was written (a bad disk, copy or transfer)"
    return f"unreadable from {at}: {message}"


def parsed_only(records: tf.data.Dataset, parse: Parse) -> tf.data.Dataset:
    """The elements ((value, serialized record) pairs) whose record parses, as their values. The parse's outputs
    travel past ignore_errors: a control dependency alone was pruned from the map function (TF 2.21)."""
    parsed = records.map(lambda value, record: (value, parse(record))).ignore_errors()
    return parsed.map(lambda value, outputs: value)


def _first_unparsed(path: str, parse: Parse, total: int) -> CorruptRecord | None:
    """The first record `parse` fails on, found in one pass: the record numbers that parse, the first gap."""
    parsed = parsed_only(tf.data.TFRecordDataset(path).enumerate(), parse)

    def first_gap(state: tuple[tf.Tensor, tf.Tensor], number: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        seen, gap = state
        return seen + 1, tf.where((gap < 0) & (number != seen), seen, gap)

    seen, gap = parsed.reduce((tf.constant(0, tf.int64), tf.constant(-1, tf.int64)), first_gap)
    record = int(gap) if int(gap) >= 0 else int(seen)
    if record >= total:
        return None
    serialized = tf.data.TFRecordDataset(path).skip(record).take(1).get_single_element()
    label = None
    try:
        parse(serialized)
        message = "it does not parse"
    except tf.errors.OpError as error:
        message, label = plain(first_line(error)).rstrip(". "), _label_problem(str(error))
    if label is not None:
        return CorruptRecord(path, record, f"record {record}: {label}", LABEL_FIX)
    if _is_example(serialized.numpy()):
        problem = (
            f"record {record} is a tf.train.Example, but its features do not decode as --image-feature and "
            f"--label-feature say (an image that is not a {FORMATS} file, nor raw HxWxC bytes, or a missing or "
            f"mistyped feature): {message[:300]}"
        )
        return CorruptRecord(path, record, problem)
    return CorruptRecord(path, record, f"record {record} is not a tf.train.Example ({message[:300]})")


def _is_example(serialized: bytes) -> bool:
    """Whether the bytes parse as a tf.train.Example with features (protobuf reads many byte strings as empty)."""
    try:
        return bool(tf.train.Example.FromString(serialized).features.feature)
    except Exception:  # noqa: BLE001 (protobuf's DecodeError and friends)
        return False


class SkippedRecords:
    """What --on-corrupt-record skip dropped in this process, per file: the records the index counted that a
    read did not yield (at most once per file however many epochs read it), and those the counting pass found."""

    def __init__(self) -> None:
        self.found_by_counting: dict[str, int] = {}
        self.variables: dict[tuple[str, ...], tf.Variable] = {}

    def counting_found(self, found: CorruptRecord) -> None:
        """A read error the counting pass met in skip mode: the file is counted (and read) up to it."""
        if found.path not in self.found_by_counting:
            log.warning(
                "skipping %s from record %d to its end: %s (--on-corrupt-record skip)",
                found.path,
                found.record,
                found.problem,
            )
        self.found_by_counting[found.path] = 1  # the damaged record; how many followed it is unknowable

    def total(self, files: Sequence[str]) -> int:
        """Records skipped so far among `files` (each counted once)."""
        variable = self.variables.get(tuple(files))
        dropped = int(tf.reduce_sum(variable)) if variable is not None else 0
        return dropped + sum(self.found_by_counting.get(path, 0) for path in files)

    def reader(self, files: Sequence[tuple[str, int]], parse: Parse) -> Callable[[tf.Tensor], tf.data.Dataset]:
        """A replacement for tf.data.TFRecordDataset over one of `files` ((path, the index's count)) that drops what
        cannot be read or parsed and tallies it."""
        paths = tuple(path for path, _ in files)
        if paths not in self.variables:
            with tf.init_scope():  # a plain local variable, whatever strategy scope or trace is around
                self.variables[paths] = tf.Variable(tf.zeros(len(paths), tf.int64), trainable=False)
        tally, names = self.variables[paths], tf.constant(paths)
        expected = tf.constant([count for _, count in files], tf.int64)

        def read(path: tf.Tensor) -> tf.data.Dataset:
            number = tf.argmax(tf.cast(tf.equal(names, path), tf.int32), output_type=tf.int64)
            kept = tf.data.TFRecordDataset(path).ignore_errors()  # a read error ends the file
            kept = parsed_only(kept.map(lambda record: (record, record)), parse)
            end = tf.data.Dataset.from_tensors((tf.constant(b""), tf.constant(True)))
            marked = kept.map(lambda record: (record, tf.constant(False))).concatenate(end)

            def count(kept_so_far: tf.Tensor, element: tuple[tf.Tensor, tf.Tensor]) -> tuple[tf.Tensor, Any]:
                record, last = element
                return kept_so_far + tf.cast(tf.logical_not(last), tf.int64), (record, last, kept_so_far)

            def passes(record: tf.Tensor, last: tf.Tensor, kept_count: tf.Tensor) -> tf.Tensor:
                return tf.cond(last, lambda: _tallied(kept_count), lambda: tf.constant(True))

            def _tallied(kept_count: tf.Tensor) -> tf.Tensor:
                dropped = tf.maximum(expected[number] - kept_count, 0)
                first = (tally[number] == 0) & (dropped > 0)
                note = tf.cond(first, lambda: _note(path, dropped, expected[number]), tf.no_op)
                with tf.control_dependencies([note]):
                    update = tally.scatter_max(tf.IndexedSlices(tf.reshape(dropped, [1]), tf.reshape(number, [1])))
                with tf.control_dependencies([update]):
                    return tf.constant(False)  # the end marker itself is no record

            counted = marked.scan(tf.constant(0, tf.int64), count).filter(passes)
            return counted.map(lambda record, last, kept_count: record)

        return read


def _note(path: tf.Tensor, dropped: tf.Tensor, expected: tf.Tensor) -> tf.Operation:
    """The one line per file: printed from the input pipeline, where the skip happens."""
    return tf.print(
        "WARNING skipped",
        dropped,
        "of the",
        expected,
        "records of",
        path,
        ": unreadable from some record on, not a tf.train.Example, or an image that does not decode "
        "(--on-corrupt-record skip)",
        output_stream=sys.stdout,
    )
