"""What the two tuners' command lines share (make tune's scripts/tune/tune.py, make tune-cluster's
scripts/tune/cluster.py): the search space file, each trial's workers, dataset and epochs, and the trainer's flags
after `--`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from scripts.common.cli import split_trainer_flags

COUNTS = ("workers", "epochs", "trials", "parallel")  # each at least 1 where given


def study_parser(prog: str, doc: str, make_target: str) -> argparse.ArgumentParser:
    """A tuner's parser with the search space file; its own arguments follow."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=doc.split("\n\n")[0],
        epilog=f"Everything after -- goes to every trial's trainer (make {make_target}'s ARGS).",
    )
    parser.add_argument("--search-space", required=True, help="the search space file (SEARCH_SPACE=)")
    return parser


def add_trial_shape(parser: argparse.ArgumentParser) -> None:
    """What every trial runs alike: its workers, its dataset and its epochs."""
    parser.add_argument("--workers", type=int, default=2, help="workers per trial (WORKERS=)")
    parser.add_argument(
        "--dataset", help="every trial's dataset (DATASET=; default: TRAINER_DATASET, else the trainer's own choice)"
    )
    parser.add_argument("--epochs", type=int, required=True, help="every trial's epochs (EPOCHS=)")


def dataset_flags(args: argparse.Namespace) -> list[str]:
    """--dataset as the command line gave it; none where it did not: the trials read TRAINER_DATASET, else the
    trainer's own choice, as every other pod does."""
    return ["--dataset", args.dataset] if args.dataset else []


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """The tuner's arguments, with the trainer's flags as `trainer_flags`; a count under 1 is the parser's error."""
    ours, trainer_flags = split_trainer_flags(argv)
    args = parser.parse_args(ours)
    args.trainer_flags = trainer_flags
    for name in COUNTS:
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name} must be at least 1, got {value}")
    return args
