"""How many records each TFRecord file holds, from an index written once, so no start counts them again.

The index is `record-counts.json` beside the files: for each file its size, modification time and record count.
`python -m trainer.data.records` writes it with the files, the data check (`python -m trainer.data`) for files
written elsewhere, and the trainer after it had to count. When the files' folder is not writable, the index
goes to the fallback folder (the model dir), where every worker and every restart finds it too. A file whose
size or modification time differs from its entry is counted again, with one log line.

Several workers may write an index at once: each merges its entries into what is there (under a lock file on
local and network file systems), writes beside it and renames into place, so a reader sees a whole index, never
a partial one.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import tensorflow as tf

from trainer.data.corrupt_records import SkippedRecords, first_corrupt

log = logging.getLogger(__name__)

INDEX_NAME = "record-counts.json"
# Files counted at once: each is one sequential read, and network storage serves several in parallel.
PARALLEL_COUNTS = 8


def count_records(files: Sequence[str], skipped: SkippedRecords | None = None) -> list[int]:
    """Reads the files through, several at once, and counts their records (the slow path the index avoids).
    A file that cannot be read through raises the CorruptRecordError naming it; with `skipped` (skip mode) it is
    counted up to the damage instead, and `skipped` told."""
    try:
        return _count_in_parallel(files, readable_only=False)
    except tf.errors.DataLossError:
        damaged = [found for found in map(first_corrupt, files) if found is not None]
        if not damaged:
            raise
        if skipped is None:
            raise damaged[0].error("the record-counting pass") from None
        for found in damaged:
            skipped.counting_found(found)
        return _count_in_parallel(files, readable_only=True)


def _count_in_parallel(files: Sequence[str], readable_only: bool) -> list[int]:
    def count(path: tf.Tensor) -> tf.Tensor:
        records = tf.data.TFRecordDataset(path)
        records = records.ignore_errors() if readable_only else records  # a read error ends the file
        return records.reduce(tf.constant(0, tf.int64), lambda n, _: n + 1)

    counted = tf.data.Dataset.from_tensor_slices(list(files)).map(
        count, num_parallel_calls=PARALLEL_COUNTS, deterministic=True
    )
    return [int(count) for count in counted.as_numpy_iterator()]


def _stat(path: str) -> dict[str, int]:
    stat = tf.io.gfile.stat(path)
    return {"bytes": int(stat.length), "mtime_ns": int(stat.mtime_nsec)}


class RecordCounts:
    """Record counts of TFRecord files, read from and kept in the index beside them, else in `fallback_dir`."""

    def __init__(self, fallback_dir: str | None) -> None:
        self.fallback_dir = fallback_dir

    def counts(self, files: Sequence[str], skipped: SkippedRecords | None = None) -> list[int]:
        """Each file's record count, in order; files missing from the index, or changed since, are counted
        (in parallel) and then stored. skipped: skip mode's tally (count_records)."""
        known: dict[str, int] = {}
        stale: list[str] = []
        indexes: dict[str, dict[str, Any]] = {}  # each index read once, however many files it lists
        for path in files:
            entry = self._entry(path, indexes)
            if entry is None:
                continue
            if {key: entry.get(key) for key in ("bytes", "mtime_ns")} == _stat(path):
                known[path] = int(entry["records"])
            else:
                stale.append(path)
        if stale:
            log.info(
                "record index out of date for %d file(s) (size or modification time changed since counted, e.g. %s): "
                "recounting them",
                len(stale),
                stale[0],
            )
        missing = [path for path in files if path not in known]
        if missing:
            known.update(self.store(dict(zip(missing, count_records(missing, skipped), strict=True))))
        return [known[path] for path in files]

    def store(self, counts: dict[str, int]) -> dict[str, int]:
        """Records these files' counts (with their current size and modification time); returns `counts`."""
        by_directory: dict[str, dict[str, int]] = {}
        for path, records in counts.items():
            by_directory.setdefault(os.path.dirname(path), {})[path] = records
        for directory, part in by_directory.items():
            entries = {path: {**_stat(path), "records": records} for path, records in part.items()}
            if _writable(directory):
                _merge_into(_index_path(directory), {os.path.basename(path): e for path, e in entries.items()})
            elif self.fallback_dir:
                _merge_into(_index_path(self.fallback_dir), entries)
            else:
                log.info("cannot keep the record counts of %s: the folder is not writable", directory)
        return counts

    def _entry(self, path: str, indexes: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
        def index(directory: str) -> dict[str, Any]:
            if directory not in indexes:
                indexes[directory] = _read(_index_path(directory))
            return indexes[directory]

        beside = _usable(index(os.path.dirname(path)).get(os.path.basename(path)))
        if beside is None and self.fallback_dir:
            return _usable(index(self.fallback_dir).get(path))
        return beside


def _usable(entry: Any) -> dict[str, Any] | None:
    """An index entry of the shape this module writes (whole numbers for bytes, mtime_ns and records), else None:
    the file is then counted again, as if the index did not list it."""
    if not isinstance(entry, dict):
        return None
    fields = [entry.get(key) for key in ("bytes", "mtime_ns", "records")]
    if not all(isinstance(value, int) and not isinstance(value, bool) for value in fields):
        return None
    return entry


def _index_path(directory: str) -> str:
    return os.path.join(directory, INDEX_NAME) if directory else INDEX_NAME


def _read(index: str) -> dict[str, Any]:
    """The index's entries; an unreadable index counts as empty (it is only a cache of counts)."""
    try:
        with tf.io.gfile.GFile(index) as handle:
            files = json.load(handle)["files"]
        if not isinstance(files, dict):
            raise TypeError(f"files is {type(files).__name__}, not an object")
        return files
    except (tf.errors.NotFoundError, tf.errors.PermissionDeniedError):
        return {}
    except (ValueError, KeyError, TypeError, tf.errors.OpError) as error:
        log.info("ignoring the record index %s: %s", index, error)
        return {}


def _beside(index: str, suffix: str) -> str:
    """A hidden file next to the index (its lock, a partial write), so globs of data files never match it."""
    directory, name = os.path.split(index)
    return os.path.join(directory, f".{name}.{suffix}")


def _writable(directory: str) -> bool:
    if "://" in directory:
        return True  # object stores: a failed write falls back below
    return os.access(directory or ".", os.W_OK)


def _merge_into(index: str, entries: dict[str, Any]) -> None:
    """Adds entries to the index: read, merge, write aside, rename into place (no reader sees a partial index).
    On a local folder the merge holds a lock, so concurrent writers never drop each other's entries."""
    partial = _beside(index, f"partial-{uuid.uuid4().hex[:12]}")
    try:
        tf.io.gfile.makedirs(os.path.dirname(index) or ".")
        with _merge_lock(index):
            with tf.io.gfile.GFile(partial, "w") as handle:
                json.dump({"files": {**_read(index), **entries}}, handle, indent=1, sort_keys=True)
            tf.io.gfile.rename(partial, index, overwrite=True)
    except (OSError, tf.errors.OpError) as error:
        log.info("could not write the record index %s (%s); the files will be counted again next time", index, error)
        if tf.io.gfile.exists(partial):
            tf.io.gfile.remove(partial)


@contextlib.contextmanager
def _merge_lock(index: str) -> Iterator[None]:
    if "://" in index:
        yield  # object stores have no advisory locks: a lost entry is only counted again
        return
    with open(_beside(index, "lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
