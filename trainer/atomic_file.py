"""Files written beside their final name and renamed into place: readers see old or new, never partial."""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def write_json(path: str, payload: dict[str, Any]) -> None:
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    with tempfile.NamedTemporaryFile("w", dir=directory, prefix=f".{os.path.basename(path)}.",
                                     delete=False) as handle:
        json.dump(payload, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.chmod(handle.name, 0o644)  # NamedTemporaryFile makes it owner-only; others fetch and read these
    os.replace(handle.name, path)
