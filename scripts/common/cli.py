"""The command line every tool shares: the tool's own arguments, then `--` and the trainer's flags."""

from __future__ import annotations

from collections.abc import Sequence


def split_trainer_flags(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """The tool's arguments and the trainer's flags: everything after the first `--` (none without one)."""
    argv = list(argv)
    if "--" not in argv:
        return argv, []
    at = argv.index("--")
    return argv[:at], argv[at + 1 :]
