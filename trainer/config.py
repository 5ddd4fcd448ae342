"""Every core knob of the trainer, with its default, and the machinery every option group plugs into.

Each field is a command-line flag (`--per-worker-batch-size`) and an environment variable
(`TRAINER_PER_WORKER_BATCH_SIZE`), so a pod spec can set it without editing args. Precedence: flag, then
environment, then the default below. A task's (or a model's) hyperparameters, and a dataset kind's own options,
are option groups: a frozen dataclass of `option(...)` fields declared beside the code that reads them
(`Task.Options`; `RecordOptions` and `TfdsOptions` in trainer/data/datasets.py); they are flags and variables in
the same way, listed in `--help` under their own heading, and read with `config.group(Options)`.
A field's type is its real annotation: bool, int, float or str; any other type is refused when the parser is
built, so a list or optional field can never silently arrive as a string.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import typing
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

from trainer.errors import ConfigError

ENV_PREFIX = "TRAINER_"
CACHES = ("auto", "memory", "disk", "none")
COLLECTIVES = ("auto", "ring", "nccl")
COMPRESSIONS = ("none", "bf16", "fp16")  # trainer/distribution/allreduce.py
STRATEGIES = ("auto", "sync", "async")
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
OPTION_TYPES = (bool, int, float, str)

# The name -> builder tables behind --task and --dataset, each filled by its module's @register("name").
Builder = TypeVar("Builder", bound=Callable[..., Any])


class Registry(dict[str, Builder], Generic[Builder]):
    def register(self, name: str) -> Callable[[Builder], Builder]:
        """A decorator: @register("name") puts the builder under that name and returns it unchanged."""

        def add(builder: Builder) -> Builder:
            self[name] = builder
            return builder

        return add


def option(default: Any, help: str, choices: Sequence[str] | None = None) -> Any:
    """A field of Config or of an option group: its default, its --help text and, for a str, its choices."""
    return dataclasses.field(default=default, metadata={"help": help, "choices": choices})


_field = option


@dataclasses.dataclass(frozen=True)
class Config:
    # Data
    dataset: str = _field(
        "fashion_mnist",
        "dataset: synthetic (no download), tfrecord (your files), any TFDS "
        "image-classification name, or one registered in --dataset-module",
    )
    dataset_module: str = _field(
        "",
        "your Python module that registers datasets with @trainer.data.datasets.register; "
        "imported before --dataset is looked up",
    )
    train_examples: int = _field(
        0,
        "synthetic: the training split's size (default 60000); other datasets: use at "
        "most N training examples per epoch, N / workers per worker (0 = all)",
    )
    test_examples: int = _field(
        0,
        "synthetic: the test split's size (default 10000); other datasets: evaluate at most N test examples (0 = all)",
    )
    shuffle_buffer: int = _field(
        10_000, "examples each worker holds to shuffle uncached records (memory: this x one encoded record)"
    )
    cache: str = _field(
        "auto",
        "keep each worker's decoded shard: memory, disk (a temporary file), none, or auto "
        "(memory when the shard's decoded images fit in 256 MiB)",
        CACHES,
    )
    # Model and optimisation
    task: str = _field(
        "image_classification",
        "what is learned: a task registered with @trainer.task.register (built in: image_classification), "
        "here or in --task-module; its own options follow under its name",
    )
    task_module: str = _field(
        "",
        "your Python module that registers tasks with @trainer.task.register (it may register its datasets "
        "too); imported before --task is looked up",
    )
    precision: str = _field(
        "float32",
        "Keras dtype policy, set before the model is built: mixed_bfloat16 and mixed_float16 compute in 16 bits "
        "and keep float32 weights (mixed_float16 with dynamic loss scaling)",
        PRECISIONS,
    )
    epochs: int = _field(3, "passes over the training data")
    per_worker_batch_size: int = _field(64, "examples per worker per step; global batch = this x workers")
    learning_rate: float = _field(1e-3, "Adam learning rate for one worker")
    scale_learning_rate: bool = _field(False, "multiply the learning rate by the number of workers (linear scaling)")
    seed: int = _field(42, "seed for weights, synthetic data and shuffling; same seed, same run")
    # Loop
    steps_per_loop: int = _field(16, "training steps per tf.function call (fewer Python round trips)")
    log_every: int = _field(100, "steps between progress lines; rounded up to a multiple of steps-per-loop")
    # Distribution
    strategy: str = _field(
        "auto",
        "sync: all-reduce (MultiWorkerMirroredStrategy); async: parameter servers "
        "(ParameterServerStrategy: the chief coordinates, workers and ps tasks serve); auto: async "
        "exactly when TF_CONFIG lists ps tasks",
        STRATEGIES,
    )
    collective: str = _field("auto", "all-reduce implementation for MultiWorkerMirroredStrategy", COLLECTIVES)
    gradient_bucket_bytes: int = _field(
        0,
        "all-reduce the gradients in buckets of about this many bytes, last layers first, so transfers overlap "
        "the backward pass; 0 = one batch after it (trainer/distribution/allreduce.py, docs/bench.md)",
    )
    gradient_compression: str = _field(
        "none",
        "gradients cross the network in 16 bits (bf16, or fp16 with a per-tensor scale): half the bytes; the "
        "optimizer applies their sum in float32",
        COMPRESSIONS,
    )
    threads: int = _field(
        0,
        "TensorFlow intra- and inter-op threads (0 = the visible cores, shared out among the TF_CONFIG tasks "
        "on this host); the manifests (k8s/components/trainer-pod) set TRAINER_THREADS to the pod's CPU limit "
        "(rounded up)",
    )
    startup_timeout: float = _field(600.0, "seconds to wait for every worker to join before giving up")
    verbose_workers: bool = _field(False, "let non-chief workers log their progress too")
    # Artifacts, checkpoints and status
    model_dir: str = _field(
        "runs/model", "where the chief writes the model, checkpoints, logs, metrics.json and status.json"
    )
    checkpoint_every: int = _field(100, "steps between checkpoints (also saved at each epoch end); 0 = epoch ends only")
    keep_checkpoints: int = _field(3, "how many recent checkpoints to keep")
    eval_in_loop: bool = _field(
        True,
        "the chief evaluates the test split at every epoch end; turn it off when an "
        "evaluator task follows the checkpoints, so training never pauses (the last "
        "epoch is still evaluated for metrics.json)",
    )
    status_port: int = _field(0, "port of the chief's HTTP status server (/status, /metrics); 0 = off")
    status_host: str = _field("0.0.0.0", "interface the status server binds (127.0.0.1 in tests)")
    # The option groups parsed beside these fields (the dataset kinds', the task's), one instance each; not a flag.
    groups: tuple[Any, ...] = dataclasses.field(default=(), metadata={"help": None, "choices": None})

    @property
    def effective_log_every(self) -> int:
        """Log interval in steps, a whole number of tf.function calls."""
        calls = max(1, -(-self.log_every // self.steps_per_loop))
        return calls * self.steps_per_loop

    def group(self, options_class: type[OptionGroup]) -> OptionGroup:
        """The parsed values of one option group (for example a task's Options)."""
        for group in self.groups:
            if type(group) is options_class:
                return group
        raise KeyError(f"{options_class.__qualname__} was not parsed with this config")

    def to_dict(self) -> dict[str, Any]:
        """Every option by name, the groups' beside the core ones (flag names are unique across them)."""
        values = {field.name: getattr(self, field.name) for field in option_fields(type(self))}
        for group in self.groups:
            values.update(dataclasses.asdict(group))
        return values

    def validate(self) -> Config:
        positive = ("epochs", "per_worker_batch_size", "steps_per_loop", "log_every", "shuffle_buffer")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"--{_flag(name)} must be at least 1, got {getattr(self, name)}")
        for name in (
            "train_examples",
            "test_examples",
            "checkpoint_every",
            "status_port",
            "gradient_bucket_bytes",
            "threads",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{_flag(name)} must be 0 (all) or a positive count, got {getattr(self, name)}")
        if self.keep_checkpoints < 1:
            raise ConfigError(f"--keep-checkpoints must be at least 1, got {self.keep_checkpoints}")
        if self.status_port > 65535:
            raise ConfigError(f"--status-port must be a TCP port (0-65535), got {self.status_port}")
        if not self.learning_rate > 0:
            raise ConfigError(f"--learning-rate must be positive, got {self.learning_rate}")
        if not self.startup_timeout > 0:
            raise ConfigError(f"--startup-timeout must be positive seconds, got {self.startup_timeout}")
        for options in (self, *self.groups):
            check_choices(options)
        for group in self.groups:
            check = getattr(group, "check", None)  # a group's own rule across its fields, if it has one
            if check is not None:
                check()
        return self


OptionGroup = TypeVar("OptionGroup")


def option_fields(options_class: type) -> list[dataclasses.Field]:
    """The fields of Config or of an option group that are options (flags and variables)."""
    return [field for field in dataclasses.fields(options_class) if field.metadata.get("help")]


def option_type(options_class: type, field: dataclasses.Field) -> type:
    """The field's real type (annotations are strings under `from __future__ import annotations`); TypeError for
    a type the flags and variables cannot carry, raised when the parser is built, never at a user's run."""
    kind = typing.get_type_hints(options_class)[field.name]
    if kind not in OPTION_TYPES:
        raise TypeError(
            f"option {options_class.__qualname__}.{field.name} has type {kind}; options are "
            f"{', '.join(t.__name__ for t in OPTION_TYPES)} (a list can be a comma-separated str)"
        )
    return kind


def check_choices(options: Any) -> None:
    """Refuses a value outside its option's choices (a variable's value never went through argparse's check)."""
    for field in option_fields(type(options)):
        choices = field.metadata["choices"]
        if choices and getattr(options, field.name) not in choices:
            raise ConfigError(
                f"--{_flag(field.name)}: unknown value {getattr(options, field.name)!r}; "
                f"choose one of {', '.join(choices)}"
            )


def _flag(name: str) -> str:
    return name.replace("_", "-")


def _env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _parse_bool(text: str, source: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{source}: expected true/false (or 1/0), got {text!r}")


def _from_env(field: dataclasses.Field, kind: type, environ: dict[str, str]) -> Any:
    env = _env_name(field.name)
    # Empty is unset: k8s/base/settings.env leaves the optional data settings empty, and the manifests carry them.
    if not environ.get(env):
        return field.default
    text = environ[env]
    if kind is bool:
        return _parse_bool(text, env)
    try:
        return kind(text)
    except ValueError:
        raise ConfigError(f"{env}: expected {kind.__name__}, got {text!r}") from None


def _add_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, options_class: type, environ: dict[str, str]
) -> None:
    for field in option_fields(options_class):
        kind = option_type(options_class, field)
        default = _from_env(field, kind, environ)
        help_text = f"{field.metadata['help']} [env {_env_name(field.name)}]"
        if kind is bool:
            parser.add_argument(
                f"--{_flag(field.name)}", action=argparse.BooleanOptionalAction, default=default, help=help_text
            )
        else:
            parser.add_argument(
                f"--{_flag(field.name)}", type=kind, default=default, choices=field.metadata["choices"], help=help_text
            )


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
    _add_options(parser, Config, environ)
    for title, options_class in groups:
        _add_options(parser.add_argument_group(title), options_class, environ)
    return parser


def parse_config(
    argv: Sequence[str] | None = None, environ: dict[str, str] | None = None, with_task: bool = True
) -> Config:
    """Flags over environment over defaults, validated. Raises ConfigError.

    with_task=False reads the core options only, leaving the task's flags for later and the task's module
    unimported (so no TensorFlow): `__main__` checks TF_CONFIG with it before anything heavy starts."""
    argv = list(sys.argv[1:] if argv is None else argv)
    environ = dict(os.environ if environ is None else environ)
    from trainer.data import datasets  # the dataset kinds' option groups (the module imports no TensorFlow)

    data_groups = list(datasets.OPTION_GROUPS)
    core_args, _ = build_parser(environ, data_groups, core_only=True).parse_known_args(argv)
    if not with_task:
        args = vars(core_args)
        parsed = _take_groups(args, data_groups)
        return Config(**args, groups=parsed).validate()
    from trainer import task  # the task registry; importing the task's module may import TensorFlow

    chosen = task.find(core_args.task, core_args.task_module)
    groups = [*data_groups, (f"task {core_args.task}", chosen.Options)]
    args = vars(build_parser(environ, groups).parse_args(argv))
    parsed = _take_groups(args, groups)
    chosen.check_options(parsed[-1])
    return Config(**args, groups=parsed).validate()


def _take_groups(args: dict[str, Any], groups: Sequence[tuple[str, type]]) -> tuple[Any, ...]:
    """Each group's instance from the parsed flags, its values popped from args (which keeps the core ones)."""
    return tuple(
        options_class(**{field.name: args.pop(field.name) for field in option_fields(options_class)})
        for _, options_class in groups
    )
