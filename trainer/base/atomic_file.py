"""Files and directories written beside their final name and renamed into place: readers see old or new,
never partial."""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import uuid
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def replaced_on_success(path: str) -> Iterator[str]:
    """Yields a path beside `path`, with its extension, to write a file or directory to. If the block
    succeeds, what was written there replaces `path`; if it fails, it is removed and `path` is untouched."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    stem, extension = os.path.splitext(os.path.basename(path))
    # Hidden, unique per writer, and ending in the extension that writers such as Keras insist on.
    partial = os.path.join(directory, f".{stem}.partial-{uuid.uuid4().hex[:12]}{extension}")
    retired = f"{partial}.old"
    try:
        yield partial
        _fsync_tree(partial)  # the contents are on disk before the name points at them
        if os.path.isdir(path):
            # A directory cannot be replaced in one rename: the old one moves aside, then is deleted.
            os.replace(path, retired)
        os.replace(partial, path)
        _fsync(directory)  # and the rename itself survives a crash of the node
    finally:
        for leftover in (partial, retired):
            if os.path.isdir(leftover):
                shutil.rmtree(leftover, ignore_errors=True)
            elif os.path.lexists(leftover):
                os.remove(leftover)


def copy_tree_to_first_free_number(source: str, parent: str, first: int) -> str:
    """Copies the tree `source` to parent/<n>, n the first free number from `first`, whole or not at all: written
    under a hidden name and flushed, then renamed onto an empty folder made for it by a create that fails if the
    number is taken (then the next is tried), so two writers never take one number. Returns the new folder."""
    os.makedirs(parent, exist_ok=True)
    partial = os.path.join(parent, f".copy.partial-{uuid.uuid4().hex[:12]}")
    try:
        shutil.copytree(source, partial)
        _fsync_tree(partial)
        number = first
        while True:
            target = os.path.join(parent, str(number))
            try:
                os.mkdir(target)  # the reservation
            except FileExistsError:
                number += 1
                continue
            os.replace(partial, target)  # a directory renamed onto an empty one replaces it in one step
            _fsync(parent)
            return target
    finally:
        if os.path.isdir(partial):
            shutil.rmtree(partial, ignore_errors=True)


def _fsync(path: str) -> None:
    """Flushes a file or a directory (its entries) to the disk."""
    descriptor = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if os.path.isdir(path) else 0))
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _fsync_tree(path: str) -> None:
    """A written file, or every file and directory of a written tree (a SavedModel), flushed to the disk."""
    if not os.path.isdir(path):
        if os.path.exists(path):
            _fsync(path)
        return
    for root, _, files in os.walk(path, topdown=False):
        for name in files:
            _fsync(os.path.join(root, name))
        _fsync(root)


def json_safe(value: Any) -> Any:
    """value with every NaN or infinity (a diverged loss) as None, so it is written as null: JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def write_json(path: str, payload: dict[str, Any], sort_keys: bool = True) -> None:
    """JSON, indented, replaced in one rename and flushed to the disk; NaN and infinities are written as null.
    sort_keys=False keeps the payload's own order."""
    with replaced_on_success(path) as partial:
        with open(partial, "w") as handle:
            json.dump(json_safe(payload), handle, indent=2, sort_keys=sort_keys, allow_nan=False)
            handle.write("\n")
