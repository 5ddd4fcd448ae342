"""The file work of make upload-images, in one place for both ends: run here on the local folder, and inside the
helper pod on the volume, where this file's text is the program (`python3 -c`, the trainer image's Python), so it
uses the standard library only. Both ends list and hash files with the same functions, so they compare alike.

  digests ROOT          print {relative path: [size, sha256]} of ROOT's files as JSON ({} when ROOT does not exist)
  receive ROOT STAGING  read a tar stream on stdin: write each file into STAGING, check its sha256, rename it into
                        ROOT; print {"files": N, "bytes": B}
  remove ROOT           read a JSON list of relative paths on stdin: remove those files and the folders left empty

Names that start with '.' (.DS_Store, an editor's swap file) are not data: left out on both ends, and counted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tarfile
from typing import BinaryIO

# The pax header that carries each file's sha256 in the tar stream, checked before the file gets its name.
SHA256_HEADER = "DISTML.sha256"
CHUNK = 1 << 20


def walk(root: str) -> tuple[list[str], list[str], int]:
    """(regular files, anything else, hidden names left out) below ROOT, as sorted '/'-joined relative paths. A link
    to a file counts as the file; a link to a folder is not followed but listed with the others."""
    files: list[str] = []
    others: list[str] = []
    hidden = 0
    for folder, dirs, names in os.walk(root):
        below = os.path.relpath(folder, root).replace(os.sep, "/")
        prefix = "" if below == "." else below + "/"
        kept = []
        for name in dirs:
            if name.startswith("."):
                hidden += 1
            elif os.path.islink(os.path.join(folder, name)):
                others.append(prefix + name)
            else:
                kept.append(name)
        dirs[:] = kept
        for name in names:
            if name.startswith("."):
                hidden += 1
            else:
                (files if os.path.isfile(os.path.join(folder, name)) else others).append(prefix + name)
    return sorted(files), sorted(others), hidden


def file_digest(path: str) -> tuple[int, str]:
    """(size, sha256 in hex) of one file, read in chunks."""
    with open(path, "rb") as handle:
        digest = hashlib.file_digest(handle, "sha256")
        return os.fstat(handle.fileno()).st_size, digest.hexdigest()


def digests(root: str) -> dict[str, list]:
    """{relative path: [size, sha256]} of ROOT's regular files; {} when ROOT does not exist (nothing copied yet)."""
    if not os.path.isdir(root):
        return {}
    return {name: list(file_digest(os.path.join(root, name))) for name in walk(root)[0]}


def checked_name(member: tarfile.TarInfo) -> str:
    """The member's relative path, refused unless it is a plain file that stays below the folder."""
    parts = member.name.split("/")
    if not member.isfile() or member.name.startswith("/") or any(part in ("", ".", "..") for part in parts):
        raise ValueError(f"refusing tar member {member.name!r}: only plain files below the folder are received")
    return member.name


def write_beside(source: BinaryIO, partial: str) -> tuple[int, str]:
    """Copies SOURCE into PARTIAL, flushed to disk; returns its (size, sha256)."""
    digest, size = hashlib.sha256(), 0
    with open(partial, "wb") as out:
        while chunk := source.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
        out.flush()
        os.fsync(out.fileno())
    return size, digest.hexdigest()


def receive(root: str, staging: str, stream: BinaryIO) -> tuple[int, int]:
    """Each file of the tar STREAM written into STAGING (on ROOT's filesystem), its sha256 checked against the one it
    was sent with, then renamed to its place in ROOT: a file has its final name only once it is whole. What an
    interrupted upload left in STAGING is removed first. Returns (files, bytes) received."""
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    files = size = 0
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            name = checked_name(member)
            partial = os.path.join(staging, str(files))
            source = archive.extractfile(member)
            assert source is not None  # a plain file (checked_name)
            written, digest = write_beside(source, partial)
            if digest != member.pax_headers.get(SHA256_HEADER):
                raise ValueError(
                    f"{name} arrived with sha256 {digest}, not the {member.pax_headers.get(SHA256_HEADER)} it was "
                    f"sent with: it changed while it was sent or was damaged on the way; run the upload again"
                )
            final = os.path.join(root, name)
            os.makedirs(os.path.dirname(final), exist_ok=True)
            os.replace(partial, final)
            files, size = files + 1, size + written
    shutil.rmtree(staging)
    return files, size


def remove(root: str, names: list[str]) -> int:
    """Removes ROOT's files NAMES, then each folder they leave empty (ROOT itself stays); returns how many went."""
    removed, top = 0, os.path.normpath(root)
    for name in names:
        checked_name(tarfile.TarInfo(name))
        path = os.path.join(top, name)
        if os.path.isfile(path):
            os.remove(path)
            removed += 1
        folder = os.path.dirname(path)
        while folder != top and os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)
            folder = os.path.dirname(folder)
    return removed


def main(argv: list[str]) -> int:
    command, *paths = argv or [""]
    try:
        if command == "digests" and len(paths) == 1:
            print(json.dumps(digests(paths[0])))
        elif command == "receive" and len(paths) == 2:
            files, size = receive(paths[0], paths[1], sys.stdin.buffer)
            print(json.dumps({"files": files, "bytes": size}))
        elif command == "remove" and len(paths) == 1:
            print(json.dumps({"removed": remove(paths[0], json.load(sys.stdin))}))
        else:
            print("usage: on_volume.py digests ROOT | receive ROOT STAGING | remove ROOT", file=sys.stderr)
            return 2
    except (OSError, ValueError, tarfile.TarError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
