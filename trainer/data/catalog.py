"""Every dataset by its --dataset name: the built-in kinds (synthetic.py, tfrecord.py, image_folder.py, any TFDS name:
tfds.py) and those a --dataset-module registers (datasets.register), each with its options; checked before the group
forms, then loaded. A registered function that raises is named with its error in one line (DataError, exit 2)."""

from __future__ import annotations

from collections.abc import Callable

import trainer.data.synthetic  # noqa: F401 (registers --dataset synthetic)
from trainer.base.errors import DataError
from trainer.data import image_folder, tfds, tfrecord
from trainer.data.datasets import DATASET_OPTIONS, DATASETS, Source
from trainer.settings.config import Config
from trainer.settings.options import import_registering_module


def option_groups() -> list[tuple[str, type]]:
    """Every dataset kind's options, parsed beside the core ones whatever --dataset is (settings.env sets them
    all): (heading in --help, option group), the built-in kinds' first, then those of --dataset-module."""
    return [
        ("dataset tfrecord (your TFRecord files)", tfrecord.RecordOptions),
        ("TFDS datasets (--dataset <a TFDS name>)", tfds.TfdsOptions),
        *((f"dataset {name}", options) for name, options in DATASET_OPTIONS.items() if name != "tfrecord"),
    ]


def import_dataset_module(module: str, flag: str = "--dataset-module") -> None:
    """Imports the module `flag` names, which registers its datasets (and their option groups); DataError when it
    cannot be imported."""
    import_registering_module(module, flag, DataError)


def check_dataset(config: Config) -> None:
    """Validates --dataset (and the flags it needs) without touching data or TensorFlow's runtime: call it
    before the group forms, so a typo never costs a start-up. Raises DataError."""
    import_dataset_module(config.module, "--module")
    import_dataset_module(config.dataset_module)
    if config.dataset == "tfrecord":
        tfrecord.check_flags(config)
    elif config.dataset == "image_folder":
        image_folder.check_flags(config)
    elif config.dataset not in DATASETS and not tfds.knows(config.dataset):
        raise DataError(
            f"--dataset: unknown dataset {config.dataset!r}; choose one of {', '.join(sorted(DATASETS))}, "
            f"any TFDS image-classification dataset name, or register your own with "
            f"@datasets.register (from trainer.api) in a module given as --module"
        )


def load(config: Config) -> Source:
    """The Source of --dataset; for TFDS names, the prepared builder under --data-dir."""
    check_dataset(config)
    build = DATASETS.get(config.dataset, tfds.source)
    if build.__module__.startswith("trainer.data."):
        return build(config)
    # Not before the group forms: a function that runs a TensorFlow op would start TensorFlow's runtime before the
    # strategy configures it. The data check (python -m trainer.data) runs it first where there is one.
    return _own(build, config)


def _own(build: Callable[[Config], Source], config: Config) -> Source:
    try:  # your own dataset's function: whatever it raises is named with it, in one line
        return build(config)
    except DataError:
        raise
    except Exception as error:
        where = f"{build.__module__}.{getattr(build, '__qualname__', build)}"
        problem = str(error).strip().splitlines()[0][:300] if str(error).strip() else "no message"
        raise DataError(
            f"--dataset {config.dataset}: {where}() raised {type(error).__name__}: {problem}; fix it in that "
            f"function (run `python -m trainer.data` with the same flags to try it alone)"
        ) from error
