"""What a fork imports, all from this one module: the task interface, the dataset interface, options, the config
and the errors a fork raises. These names keep working when the trainer's rooms move; the examples and docs import
nothing else from the trainer (a test holds them to it).

    from trainer.api import Config, DataError, Objective, Task, datasets, option, register

`datasets` is the dataset interface (`datasets.register`, `Source`, `Generated`, `Arrays`, `arrays_spec`,
`image_spec`, ...); `RecordFiles` and `glob_files` read your own TFRecord files in a dataset of yours, and
`RecordOptions` and `TfdsOptions` are the built-in kinds' options (`config.group(RecordOptions)`); `Registry` is a
name -> builder table (a task's models by `--model`); `images` decodes image files with the input pipeline's ops (a
task that serves image bytes). The default task, trainer/tasks/image_classification.py, imports only this module.
docs/fork.md walks through a task and a dataset.
"""

from __future__ import annotations

from trainer.base.errors import ConfigError, DataError, UserError
from trainer.data import datasets, images
from trainer.data.tfds import TfdsOptions
from trainer.data.tfrecord import RecordFiles, RecordOptions, glob_files
from trainer.settings.config import Config
from trainer.settings.options import Registry, option
from trainer.task import NoOptions, Objective, Task, register

__all__ = [
    "Config",
    "ConfigError",
    "DataError",
    "NoOptions",
    "Objective",
    "RecordFiles",
    "RecordOptions",
    "Registry",
    "Task",
    "TfdsOptions",
    "UserError",
    "datasets",
    "glob_files",
    "images",
    "option",
    "register",
]
