"""Files and directories written beside their final name and renamed into place: readers see old or new,
never partial."""

from __future__ import annotations

import contextlib
import json
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
        if os.path.isdir(path):
            # A directory cannot be replaced in one rename: the old one moves aside, then is deleted.
            os.replace(path, retired)
        os.replace(partial, path)
    finally:
        for leftover in (partial, retired):
            if os.path.isdir(leftover):
                shutil.rmtree(leftover, ignore_errors=True)
            elif os.path.lexists(leftover):
                os.remove(leftover)


def write_json(path: str, payload: dict[str, Any], sort_keys: bool = True) -> None:
    """JSON, indented, replaced in one rename; sort_keys=False keeps the payload's own order."""
    with replaced_on_success(path) as partial:
        with open(partial, "w") as handle:
            json.dump(payload, handle, indent=2, sort_keys=sort_keys)
            handle.write("\n")
