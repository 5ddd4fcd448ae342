"""The run's settings, resolved once: argv and the environment read into the config, the cluster, the task and the
model directory, which the entry point hands down (`RunContext`); the tools read a run's config here too
(`parse_config`).

The command line is read in two steps, each once. `read_core` reads the core knobs and the built-in dataset kinds'
options without the task's module, so no TensorFlow: a bad flag or `TF_CONFIG` exits before it starts.
`read_config` then imports `--module` (which may register the task, datasets and their options), resolves `--task`
and `--dataset` and reads every option.

This file stands above data/, task.py, distribution/ and artifacts/, whose facts it gathers: settings/ holds the
option mechanism they all import, so it cannot import them back (tests/tools/test_layers.py).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence

import trainer.tasks  # noqa: F401 (registers the built-in tasks)
from trainer import task
from trainer.artifacts.layout import ModelDir
from trainer.data import catalog
from trainer.distribution.cluster import Cluster
from trainer.reporting import tf_log_filter
from trainer.settings import flags
from trainer.settings.config import Config
from trainer.settings.options import option_variables, refuse_unknown_variables

# The TRAINER_* variables a run reads that are not options (the full read refuses any other that is none).
READ_ELSEWHERE = (tf_log_filter.SHOW_ALL_VARIABLE,)


@dataclasses.dataclass(frozen=True)
class CoreSettings:
    """The core knobs as read before anything heavy, and the argv and environment they were read from (the full
    read takes them again, with the groups the task's module adds)."""

    config: Config
    argv: tuple[str, ...]
    environ: Mapping[str, str]


@dataclasses.dataclass(frozen=True)
class RunContext:
    """What every part of a run reads: its settings, its place in the group, what it learns and where it writes."""

    config: Config
    cluster: Cluster
    task: task.Task
    model_dir: ModelDir


def read_core(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> CoreSettings:
    """The core knobs and every built-in dataset kind's options, flags over TRAINER_* variables over defaults,
    validated (ConfigError); the task's flags are left for read_config, and no module of the user's is imported."""
    argv = tuple(sys.argv[1:] if argv is None else argv)
    environ = dict(os.environ if environ is None else environ)
    core = flags.parse(argv, environ, catalog.option_groups(), partial=True, add_help=False)
    return CoreSettings(core, argv, environ)


def read_config(core: CoreSettings) -> Config:
    """Every option, with --module imported and --task and --dataset resolved (each the one --module registers where
    not given). Raises ConfigError (DataError for a module that cannot be imported)."""
    name, chosen = chosen_task(core.config)
    config = flags.parse(core.argv, dict(core.environ), option_groups(name, chosen))
    check_variables(core.environ, chosen)
    chosen.check_options(config.group(chosen.Options))
    given = catalog.dataset_given(core.argv, core.environ)
    dataset = catalog.chosen_dataset(config.dataset, config.module, given)
    return dataclasses.replace(config, task=name, dataset=dataset)


def chosen_task(core: Config) -> tuple[str, type[task.Task]]:
    """--task's name and class, once --module and the older --dataset-module (which may register it, and datasets)
    are imported."""
    catalog.import_dataset_module(core.module, "--module")
    catalog.import_dataset_module(core.dataset_module)
    name = task.chosen_name(core.task, core.module)
    return name, task.find(name, core.task_module)


def option_groups(name: str, chosen: type[task.Task]) -> list[tuple[str, type]]:
    """The option groups the full read (and --help) takes beside the core's: every dataset kind's, then the task's."""
    return [*catalog.option_groups(), (f"task {name}", chosen.Options)]


def check_variables(environ: Mapping[str, str], chosen: type[task.Task] | None) -> None:
    """Refuses a TRAINER_* variable that is no option of the run: the core's, the dataset kinds' and the chosen
    task's (None: the data Job's, which trains none, so any registered task's), naming an unchosen task's as such."""
    runs = [registered for registered in task.TASKS.values() if chosen in (None, registered)]
    unchosen = {
        variable: f"task {name}"
        for name, registered in task.TASKS.items()
        if registered not in runs
        for variable in option_variables(registered.Options)
    }
    groups = [Config, *(options_class for _, options_class in catalog.option_groups()), *(t.Options for t in runs)]
    refuse_unknown_variables(environ, groups, READ_ELSEWHERE, unchosen)


def parse_config(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> Config:
    """A run's whole config from argv and the environment (sys.argv and os.environ by default): what the tools read."""
    return read_config(read_core(argv, environ))


def run_context(core: CoreSettings, cluster: Cluster, model_dir: ModelDir) -> RunContext:
    """The run's context, once the core settings, the cluster and the model dir are known: every option read and
    the task built with its own."""
    config = read_config(core)
    return RunContext(config, cluster, task.task_of(config), model_dir)
