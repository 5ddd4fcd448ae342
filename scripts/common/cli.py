"""The command line every tool shares: the tool's own arguments, then `--` and the trainer's flags; IMAGES=DIR."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence


def split_trainer_flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The tool's arguments and the trainer's flags: everything after the first `--` (none without one)."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]


def image_dir_of(parser: argparse.ArgumentParser, images: str | None) -> str | None:
    """--images (IMAGES=) as image_dir gives it, None where it is not given; a bad one is the parser's error."""
    if images is None:
        return None
    try:
        return image_dir(images)
    except ValueError as error:
        parser.error(str(error))


def image_dir(images: str) -> str:
    """IMAGES=DIR (make run-local's, make tune's): the folder by its absolute path, any character in it; ValueError
    naming the fix when it holds no train/ folder."""
    folder = os.path.abspath(os.path.expanduser(images))
    if not os.path.isdir(os.path.join(folder, "train")):
        raise ValueError(
            f"IMAGES={images}: no folder with a train/ folder there; give the folder that holds "
            f"train/<class>/ (and test/<class>/) images"
        )
    return folder
