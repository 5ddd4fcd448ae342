"""Which image files the model cannot read as the picture they hold, and why: the data check's verdict on each file,
and the skip mode's and a failed read's (image_folder.py).

A file is refused when it does not start as one of the served model's formats (images.SIGNATURES: a WebP named
.png decodes in TensorFlow but the server refuses it), when it is a JPEG cut short (TensorFlow refuses it or fills
the missing part grey), when its header says it holds more pixels than the served model decodes (images.MAX_PIXELS:
refused before any decode, so a small file holding a huge picture is never expanded), or when TensorFlow cannot
decode it.

The data check remembers its verdicts in the image folder itself, `DIR/.trainer-image-check.json` (`Record`),
keyed by each file's content (sha256), not its name or time: a rerun over an unchanged folder reads every file
but decodes none, and a changed, added or renamed file is decoded as it would be the first time. The folder is
what run-local's job folders, the pipeline's variants and the cluster's prepare-data Job share; where it is not
writable the check decodes every file each time, as without a record. The record names the checks and
TensorFlow's version it was made with: another version's record is not used.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Sequence
from importlib import metadata
from typing import NamedTuple

from trainer.base.atomic_file import replaced_on_success
from trainer.base.errors import first_line
from trainer.data import image_headers, images

log = logging.getLogger(__name__)

SKIP = "or pass --on-corrupt-record skip to train on without the refused files"
# The fix of each kind of refusal, by the name the record keeps.
FIXES = {
    "other format": f"convert it to PNG or JPEG (e.g. `magick photo.webp photo.png`) or delete it, {SKIP}",
    "git lfs pointer": f"run `git lfs pull` in the repository it came from to fetch the image, or delete it, {SKIP}",
    "not a picture": f"it holds no picture at all: replace it with the image file, or delete it, {SKIP}",
    "cut short": f"copy it again from its source or delete it, {SKIP}",
    "too large": f"resize it (e.g. `magick photo.png -resize {images.MAX_PIXELS}@ photo.png`) or delete it, {SKIP}",
    "undecodable": f"replace or delete that file (every file of a class folder is read as an image), {SKIP}",
}
RECORD_NAME = ".trainer-image-check.json"
# What the checks are: a change to what they refuse must not meet a record of the old ones.
CHECKS = "signature and its kind, jpeg end, pixels, decode"
# Files read at once: network volumes serve several reads in parallel.
PARALLEL_READS = 8


class Refused(NamedTuple):
    """A file the model cannot read as its picture: what is wrong, and which kind of refusal (a key of FIXES)."""

    path: str
    problem: str
    kind: str

    @property
    def fix(self) -> str:
        return FIXES[self.kind]


@dataclasses.dataclass
class Checked:
    """The check of a list of files: those refused (in the list's order), and how many the record knew."""

    refused: list[Refused]
    remembered: int = 0
    kept: bool = False  # whether the record now holds these files' verdicts


def refused(paths: Sequence[str], shape: tuple[int, int, int], record: Record | None = None) -> Checked:
    """Every file of `paths` that the model cannot read as its picture. Each is read and hashed; the files the
    record knows by content take its verdict, the others are checked from their bytes, then decoded as an image of
    `shape` (one parallel pass), and the record, if any, is rewritten with this list's verdicts."""
    known = record.verdicts() if record else {}
    verdicts: dict[str, Refused | None] = {}  # by content
    digest_of: dict[str, str] = {}
    to_decode: list[str] = []

    def examine(path: str) -> tuple[str, Refused | None]:
        """The file's digest and, unless the record knows it, what its bytes alone refuse: in the reading thread,
        so only the files being read are in memory."""
        with open(path, "rb") as file:
            data = file.read()
        digest = hashlib.sha256(data).hexdigest()
        found = None if digest in known else image_headers.refusal(data)
        return digest, None if found is None else Refused(path, *found)

    with concurrent.futures.ThreadPoolExecutor(PARALLEL_READS) as pool:
        for path, (digest, refusal) in zip(paths, pool.map(examine, paths), strict=True):
            digest_of[path] = digest
            if digest in verdicts:
                continue
            if digest in known:
                earlier = known[digest]
                verdicts[digest] = None if earlier is None else Refused(path, *earlier)
                continue
            verdicts[digest] = refusal
            if refusal is None:
                to_decode.append(path)
    for path, problem in undecodable(to_decode, shape):
        verdicts[digest_of[path]] = Refused(path, problem, "undecodable")
    kept = record.keep(verdicts, known) if record else False
    found = [(path, verdicts[digest_of[path]]) for path in paths]
    remembered = sum(digest_of[path] in known for path in paths)
    return Checked([Refused(path, *verdict[1:]) for path, verdict in found if verdict], remembered, kept)


def undecodable(paths: Sequence[str], shape: tuple[int, int, int]) -> list[tuple[str, str]]:
    """(path, problem) of every file that TensorFlow does not decode as an image of `shape`: one parallel pass over
    them all, then each failed one decoded again on its own for TensorFlow's words."""
    if not paths:
        return []  # before importing TensorFlow: a rerun over an unchanged folder starts no runtime
    import tensorflow as tf

    decoded = (
        tf.data.Dataset.from_tensor_slices(list(paths))
        .enumerate()
        .map(
            lambda number, path: (number, images.decoded(tf.io.read_file(path), shape)),
            num_parallel_calls=tf.data.AUTOTUNE,
            deterministic=True,
        )
    )
    numbers = decoded.ignore_errors().map(lambda number, image: number).batch(4096)
    good = {int(number) for batch in numbers.as_numpy_iterator() for number in batch}
    return [(path, problem_of(path, shape)) for number, path in enumerate(paths) if number not in good]


def problem_of(path: str, shape: tuple[int, int, int]) -> str:
    """Why TensorFlow does not decode one file as an image of `shape`, in a few words."""
    import tensorflow as tf

    try:
        images.decoded(tf.io.read_file(path), shape)
    except tf.errors.OpError as error:
        return decode_problem(error)
    return "it decoded when read again (the file changed while it was read)"


def decode_problem(error: Exception) -> str:
    from trainer.data.corrupt_records import plain  # TensorFlow is imported by then: the error is its

    return f"not a readable {images.FORMATS} image ({plain(first_line(error))[:200]})"


class Record:
    """The data check's verdicts on an image folder's files, by content, kept in the folder (RECORD_NAME)."""

    def __init__(self, image_dir: str) -> None:
        self.path = os.path.join(os.path.expanduser(image_dir), RECORD_NAME)

    def verdicts(self) -> dict[str, tuple[str, str] | None]:
        """sha256 -> None (read as its picture) or (problem, kind); empty when there is no usable record."""
        try:
            with open(self.path, encoding="utf-8") as file:
                record = json.load(file)
            if record.get("checks") != _checks():
                return {}
            return {
                digest: None if verdict is None else (str(verdict[0]), str(verdict[1]))
                for digest, verdict in record["files"].items()
                if verdict is None or verdict[1] in FIXES
            }
        except FileNotFoundError:
            return {}
        except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as error:
            log.info("ignoring the image check record %s: %s", self.path, error)  # a cache: checking again is safe
            return {}

    def keep(self, verdicts: dict[str, Refused | None], known: dict[str, tuple[str, str] | None]) -> bool:
        """Writes these verdicts as the whole record (files no longer listed leave it), renamed into place: a
        concurrent check's record is replaced whole, never mixed. False where the folder is not writable."""
        files = {digest: None if verdict is None else list(verdict[1:]) for digest, verdict in verdicts.items()}
        if files == {digest: None if verdict is None else list(verdict) for digest, verdict in known.items()}:
            return True
        if not os.access(os.path.dirname(self.path), os.W_OK):
            return False
        try:
            with replaced_on_success(self.path) as partial, open(partial, "w", encoding="utf-8") as file:
                json.dump({"checks": _checks(), "files": files}, file, indent=0, sort_keys=True)
        except OSError as error:
            log.info("could not write the image check record %s (%s): the next check decodes again", self.path, error)
            return False
        return True


def _checks() -> str:
    """The checks and the decoder a verdict was made with."""
    for distribution in ("tensorflow", "tensorflow-cpu", "tensorflow-gpu"):
        try:
            return f"{CHECKS}; {distribution} {metadata.version(distribution)}"
        except metadata.PackageNotFoundError:
            continue
    return f"{CHECKS}; tensorflow of unknown version"
