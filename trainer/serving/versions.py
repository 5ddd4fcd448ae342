"""The versions under a model base path, as TF Serving reads them: numbered folders, the highest one served.

A watcher thread looks for a new highest version, or new files in the served version's folder (a retrain that ended
at the same step publishes the same number with other weights: its fingerprint, each file's name, size, modification
time and inode, differs), loads it in the background beside the one being served, calls it once, and swaps it in
with one assignment: a request holds the version it started with until it finishes, so none fails during the swap.
A version that does not load is logged, reported in the model's status, and tried again: at once when its files
change (a copy still being written), else after a wait that doubles with each failure (a transient read error), up
to RETRY_MAX_SECONDS. When the served version's new files do not load, the copy in memory keeps answering.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable

import numpy as np

from trainer.artifacts.layout import numbered_versions, version_folders
from trainer.base.errors import ServingError, first_line
from trainer.serving.signature import Signature, class_names, load_signatures

log = logging.getLogger(__name__)

RETRY_MAX_SECONDS = 300.0  # the longest wait between two tries of a version whose files have not changed


# Each file of a version's folder, by its path there, with its size, modification time (ns) and inode.
Fingerprint = tuple[tuple[str, int, int, int], ...]


@dataclasses.dataclass(frozen=True)
class Loaded:
    """One version, loaded and ready to call."""

    version: int
    path: str
    fingerprint: Fingerprint  # its files as they were before it was read
    signature: Signature  # the one served by default
    signatures: dict[str, Signature]  # every one, by name, the default first
    class_names: tuple[str, ...] | None  # a classifier's, in class-id order, for the metadata; None if it has none


def load_version(path: str, version: int, fingerprint: Fingerprint) -> Loaded:
    signatures = load_signatures(path)
    signature = next(iter(signatures.values()))
    warm_up(signature)
    return Loaded(version, path, fingerprint, signature, signatures, class_names(signatures))


def warm_up(signature: Signature) -> None:
    """One call on a batch of zeros, so the first request on this version pays no tracing. Not for string inputs:
    no value is known to be one the model accepts (an empty string is no image)."""
    if any(spec.shape is None or spec.is_string for spec in signature.inputs):
        return
    arrays = {
        spec.name: np.zeros(tuple(1 if size == -1 else size for size in spec.shape or ()), spec.dtype)
        for spec in signature.inputs
    }
    signature.run(arrays)


@dataclasses.dataclass(frozen=True)
class Failure:
    """A version that did not load: why, after how many tries, and when it is tried again (at once if its files
    change)."""

    fingerprint: Fingerprint
    tries: int
    retry_at: float  # time.monotonic()
    error: str


def files_fingerprint(path: str) -> Fingerprint:
    """A version folder's files as stat sees them, read every poll (a SavedModel holds a few files): it changes when
    any file is written, added, removed or replaced, so a failed version is retried once it does (a copy that was
    still being written), and the served one is loaded anew (the same number published again)."""
    files = []
    for directory, _, names in os.walk(path):
        for name in names:
            full = os.path.join(directory, name)
            try:
                stat = os.lstat(full)  # a link as it is: its target appearing later is a retry, not a change
            except FileNotFoundError:
                continue
            files.append((os.path.relpath(full, path), stat.st_size, stat.st_mtime_ns, stat.st_ino))
    return tuple(sorted(files))


class VersionWatcher:
    """Holds the version being served and swaps in the highest numbered one as it appears."""

    def __init__(
        self, base_path: str, poll_seconds: float, on_swap: Callable[[Loaded, Loaded | None], None] | None = None
    ) -> None:
        self.base_path = base_path
        self.poll_seconds = poll_seconds
        self.on_swap = on_swap
        self._current: Loaded | None = None
        self._failed: dict[int, Failure] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def current(self) -> Loaded:
        loaded = self._current
        if loaded is None:
            raise RuntimeError("no version loaded yet")
        return loaded

    def failure_reports(self) -> dict[int, str]:
        """Why each version above the served one (or the served one's changed files) did not load, by version, as it
        stands now."""
        return {
            version: f"does not load (try {failure.tries}; tried again soon, or once its files change): {failure.error}"
            for version, failure in dict(self._failed).items()  # a copy: the watcher thread changes it
        }

    def load_first(self) -> Loaded:
        """Loads the highest version that loads; ServingError when none does."""
        versions = numbered_versions(self.base_path)
        if not versions:
            raise ServingError(
                f"{self.base_path} holds no numbered SavedModel folder (<base>/<version>/saved_model.pb): point "
                f"the server at a model dir's serving/ folder (SERVE_FROM=...), or train one first (make run-local)"
            )
        self.check_once()
        if self._current is None:
            raise ServingError(
                f"no version under {self.base_path} loads (tried {', '.join(map(str, reversed(versions)))}); the "
                f"log above says why: re-export the model, or remove the broken folders"
            )
        return self._current

    def check_once(self) -> None:
        """Serves the highest version that loads: newer ones as they appear, the served one anew when its files
        change, an older one if the served one is deleted."""
        folders = version_folders(self.base_path)
        # Only versions still there, from the one served up, are still being tried: the others' failures are over.
        served = self._current.version if self._current is not None else -1
        self._failed = {v: failure for v, failure in self._failed.items() if v in folders and v >= served}
        for version, folder in reversed(folders.items()):
            current = self._current
            path = os.path.join(self.base_path, folder)  # 0002 stays 0002: the number is not the name
            fingerprint = files_fingerprint(path)
            again = current is not None and current.version == version  # the served one: only if its files changed
            if current is not None and again and current.fingerprint == fingerprint:
                return
            failed = self._failed.get(version)
            if failed is not None and failed.fingerprint == fingerprint and time.monotonic() < failed.retry_at:
                if again:
                    return  # the served version is never passed over for an older one: it stays until it loads
                continue
            try:
                loaded = load_version(path, version, fingerprint)
            except Exception as error:  # noqa: BLE001 (a broken version must not stop the one being served)
                tries = failed.tries + 1 if failed is not None and failed.fingerprint == fingerprint else 1
                wait = min(self.poll_seconds * 2**tries, RETRY_MAX_SECONDS)
                message = first_line(error)[:500]
                self._failed[version] = Failure(fingerprint, tries, time.monotonic() + wait, message)
                log.error(
                    "version %d under %s does not load (try %d; tried again in %.0f s, or once its files change): %s",
                    version,
                    self.base_path,
                    tries,
                    wait,
                    message,
                )
                if again:
                    return
                continue
            self._failed.pop(version, None)
            self._current = loaded  # one assignment: a request reads either the old version or the new one
            log.info("serving version %d from %s%s", version, path, " anew: its files changed" if again else "")
            if self.on_swap is not None:
                self.on_swap(loaded, current)
            return

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="version-watcher", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.check_once()
            except Exception as error:  # noqa: BLE001 (the watcher must outlive a bad poll: a folder removed mid-read)
                log.error("checking %s for new versions failed: %s", self.base_path, first_line(error)[:500])
