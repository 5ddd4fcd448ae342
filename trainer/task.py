"""What is learned, in one class: the Task interface, the task registry, and --task.

A task builds its model from its own hyperparameters (`Options`), says what a batch holds (features and targets,
each any nest of tensors), defines the per-example loss and its metrics, and what the exported model serves.
Everything else (both training loops, the evaluator, saving, the status, TensorBoard, the progress lines and
metrics.json) only calls these methods and reads `metric_names`: a new task is one new module.

To add one: subclass Task in your own module, decorate it with @register("name"), and run with
`--module your_module` (docs/fork.md walks through one); its one task is then the default --task. The built-in
tasks live in trainer/tasks/; image_classification is the default.

This module imports no TensorFlow: the flags are parsed, and a bad one refused, before TensorFlow starts.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar

from trainer.base.errors import ConfigError
from trainer.settings.options import Registry, import_registering_module

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from trainer.data.datasets import Source

# Metric names become status fields, Prometheus gauges (trainer_<name>) and metrics.json keys (train_<name>).
METRIC_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")


@dataclasses.dataclass(frozen=True)
class Objective:
    """What makes one trained model better than another: a test metric (its metrics.json key is test_<metric>) and
    its direction. Model selection (trainer/serving/select.py) keeps the candidate best at it."""

    metric: str  # "loss" or one of the task's metric_names
    higher_is_better: bool

    @property
    def key(self) -> str:
        return f"test_{self.metric}"


@dataclasses.dataclass(frozen=True)
class NoOptions:
    """A task without hyperparameters of its own."""


class Task:
    """One learning problem. Subclass it; every method below has the signature the loops call."""

    # The task's hyperparameters: a frozen dataclass of trainer.settings.options.option(...) fields. Each is a flag
    # and a TRAINER_* variable, listed in --help under the task's name; read them as self.options.<name>.
    Options: ClassVar[type] = NoOptions
    # Reported beside "loss", in this order: progress lines, status, TensorBoard, metrics.json (train_<name>,
    # test_<name>). Each is the mean of the values metrics() returns, over every example seen.
    metric_names: ClassVar[tuple[str, ...]] = ()
    # Which trained model is best (model selection): by default the lowest test loss.
    objective: ClassVar[Objective] = Objective("loss", higher_is_better=False)

    def __init__(self, options: Any) -> None:
        self.options = options

    @classmethod
    def check_options(cls, options: Any) -> None:
        """Raises ConfigError for hyperparameters that cannot work together (called before TensorFlow starts); one
        value's choices and bounds are its option's own: option(..., choices=..., at_least=..., below=...)."""

    def describe(self) -> str:
        """A few words for the run's first line, e.g. the model's name."""
        return type(self).__name__

    def build_model(self, source: Source) -> keras.Model:
        """The model for this dataset; called inside strategy.scope() after the dtype policy is set (--precision).
        Its final outputs should be float32 (a float32 last layer) so the loss is computed in full precision."""
        raise NotImplementedError

    def optimizer(self, learning_rate: Any) -> keras.optimizers.Optimizer:
        """The optimizer, given the learning rate: a number, or a schedule of the step (--warmup-steps,
        --learning-rate-schedule). Return any Keras optimizer, e.g. keras.optimizers.SGD(learning_rate,
        momentum=0.9) or AdamW(learning_rate, weight_decay=1e-4); the core adds --clip-norm and loss scaling."""
        import keras

        return keras.optimizers.Adam(learning_rate=learning_rate)

    def features_and_targets(self, batch: Any) -> tuple[Any, Any]:
        """Splits one batch of the dataset into (features, targets), each any nest of tensors. The datasets yield
        (features, targets) pairs, so the default passes them on."""
        features, targets = batch
        return features, targets

    def loss(self, targets: Any, outputs: Any) -> tf.Tensor:
        """The loss of each example, shape [batch]; the loops average it over the global batch."""
        raise NotImplementedError

    def metrics(self, targets: Any, outputs: Any) -> dict[str, tf.Tensor]:
        """For each name in metric_names, values (any shape) whose mean over the examples is the metric."""
        return {}

    def serving_signature(self, model: keras.Model) -> list[Any]:
        """The exported model's input signature: a list of tf.TensorSpec (or nests of them), one per argument of
        serve(); give each a name, which clients use (`saved_model_cli run --inputs name=...`)."""
        raise NotImplementedError

    def serve(self, model: keras.Model, *features: Any) -> dict[str, tf.Tensor]:
        """The exported model's outputs by name, for features shaped as serving_signature says."""
        raise NotImplementedError

    def serving_endpoints(self, model: keras.Model) -> dict[str, tuple[Callable[..., Any], list[Any]]]:
        """More signatures the export carries beside `serve`, by name: (function returning outputs by name, its input
        signature). The default task adds `serve_image_bytes` (image files in) and `class_names` (no inputs)."""
        return {}

    def serving_reference(self, model: keras.Model, *features: Any) -> dict[str, tf.Tensor]:
        """What serve() must answer for these features, computed eagerly from the trained model: before
        serving/<version>/ is published, the SavedModel loaded back is compared with it (export_check.py). Override
        it to state the outputs from the model call as training and evaluation make it, so a serve() that
        preprocesses differently is caught; the default runs serve() itself eagerly, which catches what the export
        loses (weights, state) but not a serve() that is wrong by design."""
        return self.serve(model, *features)


TASKS: Registry[type[Task]] = Registry()


def register(name: str) -> Any:
    """A class decorator: @register("name") makes a Task subclass --task name."""

    def add(task_class: type[Task]) -> type[Task]:
        bad = [m for m in ("loss", *task_class.metric_names) if not METRIC_NAME.match(m)]
        if (
            bad
            or len(set(task_class.metric_names)) != len(task_class.metric_names)
            or "loss" in task_class.metric_names
        ):
            raise TypeError(
                f"task {name}: metric_names {task_class.metric_names} must be distinct lower_case names other "
                f"than 'loss' (the loss is always reported)"
            )
        if task_class.objective.metric not in ("loss", *task_class.metric_names):
            raise TypeError(
                f"task {name}: objective metric {task_class.objective.metric!r} is not reported; use 'loss' or "
                f"one of metric_names {task_class.metric_names}"
            )
        return TASKS.register(name)(task_class)

    return add


DEFAULT_TASK = "image_classification"


def chosen_name(name: str, module: str = "") -> str:
    """--task as given; without it, the one task that --module (already imported) registers, else the default."""
    if name:
        return name
    own = sorted(key for key, task_class in TASKS.items() if module and task_class.__module__ == module)
    if len(own) > 1:
        raise ConfigError(f"--module {module} registers the tasks {', '.join(own)}: choose one with --task")
    return own[0] if own else DEFAULT_TASK


def find(name: str, module: str = "") -> type[Task]:
    """The Task class of --task, after importing the older --task-module (if any); trainer/context.py has
    registered the built-in tasks."""
    import_registering_module(module, "--task-module")
    if name not in TASKS:
        raise ConfigError(
            f"--task: unknown task {name!r}; choose one of {', '.join(sorted(TASKS))}, or register your own "
            f"with @trainer.api.register in a module given as --module"
        )
    return TASKS[name]


def task_of(config: Any) -> Task:
    """The task the config names, with its parsed options."""
    task_class = find(config.task, config.task_module)
    return task_class(config.group(task_class.Options))
