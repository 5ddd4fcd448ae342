"""The trainer's command line: the core knobs (config.py) and the option groups given beside them (each dataset
kind's, the chosen task's), each group under its own heading in --help; a flag wins over its TRAINER_* variable,
which wins over the default.

Which groups join is the caller's to say (`python -m trainer` gives every dataset kind's and the chosen task's): this
room imports nothing above it. A partial pass reads what it was given and leaves the other flags for a later one, so
the core flags are read, and a bad one refused, before the modules that declare the other groups are imported.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from trainer.settings.config import Config
from trainer.settings.options import ENV_PREFIX, add_options, take_options


def build_parser(
    environ: dict[str, str] | None = None,
    groups: Sequence[tuple[str, type]] = (),
    partial: bool = False,
    add_help: bool = True,
) -> argparse.ArgumentParser:
    """The parser of Config's options and of each (title, option group class) in groups. A name that two of them
    share is refused (argparse's conflict error): every flag and variable names one option. partial: a pass that
    leaves other flags for a later one (no abbreviations, which could take such a flag for one of these)."""
    environ = dict(os.environ if environ is None else environ)
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Train a task (by default an image classifier) on TensorFlow: one process without "
        "TF_CONFIG, or one task of a group described by TF_CONFIG (as the Kubeflow TFJob sets it).",
        epilog=f"Every flag can also be set as an environment variable: {ENV_PREFIX}<FLAG_IN_CAPITALS>, "
        f"e.g. {ENV_PREFIX}PER_WORKER_BATCH_SIZE=128. A flag on the command line wins over the variable; a "
        f"{ENV_PREFIX}* variable that names no flag of the run is refused.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        add_help=add_help,
        allow_abbrev=not partial,
    )
    add_options(parser, Config, environ)
    for title, options_class in groups:
        add_options(parser.add_argument_group(title), options_class, environ)
    return parser


def parse(
    argv: Sequence[str],
    environ: dict[str, str] | None = None,
    groups: Sequence[tuple[str, type]] = (),
    partial: bool = False,
    add_help: bool = True,
) -> Config:
    """The Config of argv over environ over defaults, with one parsed instance of each group, validated (ConfigError).
    partial: flags of no group given here are left alone, for a later pass that knows them."""
    parser = build_parser(environ, groups, partial, add_help)
    values = vars(parser.parse_known_args(list(argv))[0] if partial else parser.parse_args(list(argv)))
    parsed = tuple(take_options(values, options_class) for _, options_class in groups)
    return Config(**values, groups=parsed).validate()
