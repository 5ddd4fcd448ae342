"""The trainer's command line, assembled: the core knobs (trainer/config.py), every dataset kind's options and the
chosen task's, each group under its own heading in --help.

The core flags are read first, without the task's module, so a bad flag or TF_CONFIG exits before TensorFlow
starts; the modules named by --task-module and --dataset-module are imported next, and their option groups join
the parser. Importing trainer.tasks here registers the built-in tasks.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import trainer.tasks  # noqa: F401 (registers the built-in tasks)
from trainer import task
from trainer.config import Config
from trainer.data import datasets
from trainer.options import ENV_PREFIX, add_options, take_options


def build_parser(
    environ: dict[str, str] | None = None, groups: Sequence[tuple[str, type]] = (), core_only: bool = False
) -> argparse.ArgumentParser:
    """The parser of Config's options and of each (title, option group class) in groups. A name that two of them
    share is refused (argparse's conflict error): every flag and variable names one option. core_only: the first
    pass, which leaves the task's flags for the second (no --help, and no abbreviations, which could take a task
    flag for a core one)."""
    environ = dict(os.environ if environ is None else environ)
    parser = argparse.ArgumentParser(
        prog="python -m trainer",
        description="Train a task (by default an image classifier) on TensorFlow: one process without "
        "TF_CONFIG, or one task of a group described by TF_CONFIG (as the Kubeflow TFJob sets it).",
        epilog=f"Every flag can also be set as an environment variable: {ENV_PREFIX}<FLAG_IN_CAPITALS>, "
        f"e.g. {ENV_PREFIX}PER_WORKER_BATCH_SIZE=128. A flag on the command line wins over the variable.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        add_help=not core_only,
        allow_abbrev=not core_only,
    )
    add_options(parser, Config, environ)
    for title, options_class in groups:
        add_options(parser.add_argument_group(title), options_class, environ)
    return parser


def parse_config(
    argv: Sequence[str] | None = None, environ: dict[str, str] | None = None, with_task: bool = True
) -> Config:
    """Flags over environment over defaults, validated. Raises ConfigError (DataError for a --dataset-module that
    cannot be imported).

    with_task=False reads the core options and the built-in dataset kinds' only, leaving the task's flags for
    later and its module and the dataset module unimported (so no TensorFlow): `__main__` checks TF_CONFIG with
    it before anything heavy starts."""
    argv = list(sys.argv[1:] if argv is None else argv)
    environ = dict(os.environ if environ is None else environ)
    core_args, _ = build_parser(environ, datasets.option_groups(), core_only=True).parse_known_args(argv)
    if not with_task:
        return _config(vars(core_args), datasets.option_groups())
    datasets.import_dataset_module(core_args.dataset_module)
    chosen = task.find(core_args.task, core_args.task_module)
    groups = [*datasets.option_groups(), (f"task {core_args.task}", chosen.Options)]
    config = _config(vars(build_parser(environ, groups).parse_args(argv)), groups)
    chosen.check_options(config.group(chosen.Options))
    return config


def _config(args: dict[str, Any], groups: Sequence[tuple[str, type]]) -> Config:
    parsed = tuple(take_options(args, options_class) for _, options_class in groups)
    return Config(**args, groups=parsed).validate()
