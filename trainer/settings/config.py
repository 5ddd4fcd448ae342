"""Every core knob of the trainer, with its default: the data, the optimisation, the loop, the distribution and the
artifacts. Each field is a flag and a TRAINER_* variable (options.py says how). The options of a dataset kind or of a
task are groups of their own, declared beside the code that reads them and read with `config.group(Options)`; the
parser (flags.py) reads them beside these.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, TypeVar

from trainer.base.errors import ConfigError
from trainer.settings.options import check_values, flag, option, option_fields

CACHES = ("auto", "memory", "disk", "none")
COLLECTIVES = ("auto", "ring", "nccl")
COMPRESSIONS = ("none", "bf16", "fp16")  # trainer/distribution/allreduce.py
STRATEGIES = ("auto", "sync", "async")
PRECISIONS = ("float32", "mixed_bfloat16", "mixed_float16")
SCHEDULES = ("constant", "cosine")
NONFINITE_ACTIONS = ("stop", "skip", "ignore")
URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")

OptionGroup = TypeVar("OptionGroup")


@dataclasses.dataclass(frozen=True)
class Config:
    # Data
    dataset: str = option(
        "fashion_mnist",
        "dataset: synthetic (no download), tfrecord (your files), image_folder (your class folders), any TFDS "
        "image-classification name, or one your --module registers (default: the one dataset --module "
        "registers, else fashion_mnist)",
    )
    module: str = option(
        "",
        "your Python module (e.g. modules.my_task): imported first, it registers its tasks and datasets; "
        "the one task and the one dataset it registers are the defaults of --task and --dataset",
    )
    # The older ways to import a fork's module (before --module): they keep working, out of --help.
    dataset_module: str = option(
        "", "a module that registers datasets, imported before --dataset is looked up", hidden=True
    )
    train_examples: int = option(
        0,
        "synthetic: the training split's size (default 60000); other datasets: use at "
        "most N training examples per epoch, N / workers per worker (0 = all)",
    )
    test_examples: int = option(
        0,
        "synthetic: the test split's size (default 10000); other datasets: evaluate at most N test examples (0 = all)",
    )
    shuffle_buffer: int = option(
        10_000, "examples each worker holds to shuffle uncached records (memory: this x one encoded record)", at_least=1
    )
    cache: str = option(
        "auto",
        "keep each worker's decoded shard: memory, disk (a temporary file), none, or auto "
        "(memory when the shard's decoded images fit in 256 MiB)",
        CACHES,
    )
    # Model and optimisation
    task: str = option(
        "",
        "what is learned: a task registered with @trainer.task.register (built in: image_classification), "
        "here or in --module; its own options follow under its name (default: the one task --module "
        "registers, else image_classification)",
    )
    task_module: str = option("", "a module that registers tasks, imported before --task is looked up", hidden=True)
    precision: str = option(
        "float32",
        "Keras dtype policy, set before the model is built: mixed_bfloat16 and mixed_float16 compute in 16 bits "
        "and keep float32 weights (mixed_float16 with dynamic loss scaling)",
        PRECISIONS,
    )
    epochs: int = option(3, "passes over the training data", at_least=1)
    per_worker_batch_size: int = option(64, "examples per worker per step; global batch = this x workers", at_least=1)
    learning_rate: float = option(
        1e-3, "the optimizer's (peak) learning rate for one worker; the task picks the optimizer"
    )
    scale_learning_rate: bool = option(False, "multiply the learning rate by the number of workers (linear scaling)")
    learning_rate_schedule: str = option(
        "constant", "after the warmup: constant, or cosine decay to 0 at the last step", SCHEDULES
    )
    warmup_steps: int = option(0, "steps of linear warmup from 0 to the learning rate (0 = none)")
    clip_norm: float = option(
        0.0, "clip the gradients to this global norm, after the all-reduce so every worker clips the same sum (0 = off)"
    )
    seed: int = option(42, "seed for weights, synthetic data and shuffling; same seed, same run")
    on_nonfinite: str = option(
        "stop",
        "a step whose loss or gradients are not finite (NaN, Inf), or weights that became so: stop (exit 4, no "
        "checkpoint or export of them), skip the step's update (every worker agrees; one small all-reduce per "
        "step), or ignore",
        NONFINITE_ACTIONS,
    )
    max_skipped_steps: int = option(
        10, "--on-nonfinite skip: stop as above after this many skipped steps in a row", at_least=1
    )
    # Loop
    steps_per_loop: int = option(16, "training steps per tf.function call (fewer Python round trips)", at_least=1)
    log_every: int = option(100, "steps between progress lines; rounded up to a multiple of steps-per-loop", at_least=1)
    # Distribution
    strategy: str = option(
        "auto",
        "sync: all-reduce (MultiWorkerMirroredStrategy); async: parameter servers "
        "(ParameterServerStrategy: the chief coordinates, workers and ps tasks serve); auto: async "
        "exactly when TF_CONFIG lists ps tasks",
        STRATEGIES,
    )
    collective: str = option("auto", "all-reduce implementation for MultiWorkerMirroredStrategy", COLLECTIVES)
    gradient_bucket_bytes: int = option(
        0,
        "all-reduce the gradients in buckets of about this many bytes, last layers first, so transfers overlap "
        "the backward pass; 0 = one batch after it (trainer/distribution/allreduce.py, docs/bench.md)",
    )
    gradient_compression: str = option(
        "none",
        "gradients cross the network in 16 bits (bf16, or fp16 with a per-tensor scale): half the bytes; the "
        "optimizer applies their sum in float32",
        COMPRESSIONS,
    )
    threads: int = option(
        0,
        "TensorFlow intra- and inter-op threads (0 = the visible cores, shared out among the TF_CONFIG tasks "
        "on this host); the manifests (k8s/base/trainer-pod.yaml) set TRAINER_THREADS to the pod's CPU limit "
        "(rounded up)",
    )
    startup_timeout: float = option(600.0, "seconds to wait for every worker to join before giving up")
    verbose_workers: bool = option(False, "let non-chief workers log their progress too")
    # Artifacts, checkpoints and status
    model_dir: str = option(
        "runs/model",
        "where the chief writes the model, checkpoints, logs, metrics.json and status.json: a path on a filesystem "
        "(gs:// and s3:// are refused)",
    )
    checkpoint_every: int = option(100, "steps between checkpoints (also saved at each epoch end); 0 = epoch ends only")
    keep_checkpoints: int = option(3, "how many recent checkpoints to keep", at_least=1)
    eval_in_loop: bool = option(
        True,
        "the chief evaluates the test split at every epoch end; turn it off when an "
        "evaluator task follows the checkpoints, so training never pauses (the last "
        "epoch is still evaluated for metrics.json)",
    )
    status_port: int = option(0, "port of the chief's HTTP status server (/status, /metrics); 0 = off")
    status_host: str = option("0.0.0.0", "interface the status server binds (127.0.0.1 in tests)")
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
        for options in (self, *self.groups):
            check_values(options)
        for name in (
            "train_examples",
            "test_examples",
            "checkpoint_every",
            "status_port",
            "gradient_bucket_bytes",
            "threads",
            "warmup_steps",
        ):
            if getattr(self, name) < 0:
                raise ConfigError(f"--{flag(name)} must be 0 (all) or a positive count, got {getattr(self, name)}")
        if self.status_port > 65535:
            raise ConfigError(f"--status-port must be a TCP port (0-65535), got {self.status_port}")
        if not self.learning_rate > 0:
            raise ConfigError(f"--learning-rate must be positive, got {self.learning_rate}")
        if not self.clip_norm >= 0:
            raise ConfigError(f"--clip-norm must be 0 (off) or a positive norm, got {self.clip_norm}")
        if not self.startup_timeout > 0:
            raise ConfigError(f"--startup-timeout must be positive seconds, got {self.startup_timeout}")
        check_model_dir(self.model_dir)
        for group in self.groups:
            check = getattr(group, "check", None)  # a group's own rule across its fields, if it has one
            if check is not None:
                check()
        return self


def check_model_dir(model_dir: str) -> None:
    """A model dir is a path on a filesystem: the chief writes it with renames, a lock and an owner record, which
    object storage (gs://, s3://) cannot do, and TensorFlow 2.21 has no s3:// filesystem at all."""
    scheme = URL_SCHEME.match(model_dir)
    if scheme is None:
        return
    name = scheme.group(1).lower()
    if name == "file":
        raise ConfigError(f"--model-dir {model_dir}: give the path without file://")
    raise ConfigError(
        f"--model-dir {model_dir}: a model directory on {name}:// is not supported; the chief writes checkpoints "
        f"and exports with atomic renames and a lock, which object storage cannot do. Give a path on a mounted "
        f"volume: a ReadWriteMany claim, or a bucket mounted as a filesystem that can rename; docs/cluster.md says "
        f"what each cluster needs"
    )
