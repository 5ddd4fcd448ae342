"""Every dataset by its --dataset name: the built-in kinds (synthetic.py, tfrecord.py, image_folder.py, any TFDS name:
tfds.py) and those a --module registers (datasets.register), each with its options; checked before the group
forms, then loaded. A registered function that raises is named with its error in one line (DataError, exit 2)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import trainer.data.synthetic  # noqa: F401 (registers --dataset synthetic)
from trainer.base.errors import ConfigError, DataError
from trainer.data import image_folder, tfds, tfrecord
from trainer.data.datasets import DATASET_OPTIONS, DATASETS, Source
from trainer.settings.config import Config
from trainer.settings.options import env_name, import_registering_module


def option_groups() -> list[tuple[str, type]]:
    """Every dataset kind's options, parsed beside the core ones whatever --dataset is (trainer.env sets them
    all): (heading in --help, option group), the built-in kinds' first, then those of --module."""
    return [
        ("dataset tfrecord (your TFRecord files)", tfrecord.RecordOptions),
        ("TFDS datasets (--dataset <a TFDS name>)", tfds.TfdsOptions),
        *((f"dataset {name}", options) for name, options in DATASET_OPTIONS.items() if name != "tfrecord"),
    ]


def import_dataset_module(module: str, flag: str = "--dataset-module") -> None:
    """Imports the module `flag` names, which registers its datasets (and their option groups); DataError when it
    cannot be imported."""
    import_registering_module(module, flag, DataError)


def dataset_given(argv: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Whether --dataset or TRAINER_DATASET names the dataset (else the one --module registers is the default)."""
    flag = any(arg == "--dataset" or arg.startswith("--dataset=") for arg in argv)
    return flag or bool(environ.get(env_name("dataset")))


def chosen_dataset(name: str, module: str, given: bool) -> str:
    """--dataset as given; without it, the one dataset --module (already imported) registers, else name (the
    default). ConfigError where the module registers several: the user picks one."""
    if given or not module:
        return name
    own = sorted(key for key, build in DATASETS.items() if build.__module__ == module)
    if len(own) > 1:
        raise ConfigError(
            f"--module {module} registers the datasets {', '.join(own)}: choose one with --dataset (or TRAINER_DATASET)"
        )
    return own[0] if own else name


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
