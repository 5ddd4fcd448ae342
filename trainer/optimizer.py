"""The optimizer of a run: the task's choice (Adam unless it says otherwise), the learning-rate schedule, gradient
clipping after the all-reduce, and mixed_float16's loss scaling.

The schedule is a function of the optimizer's own step counter (`optimizer.iterations`), which every checkpoint
holds, so a resumed run continues the schedule exactly where it stopped.
"""

from __future__ import annotations

import math
from typing import Any

import keras
import tensorflow as tf

from trainer.distribution import allreduce
from trainer.settings.config import Config
from trainer.task import Task


def build_optimizer(task: Task, config: Config, learning_rate: float, total_steps: int) -> keras.optimizers.Optimizer:
    """The task's optimizer on this run's learning rate (a plain number without warmup or decay); the gradient
    all-reduce replaced where --gradient-compression, --gradient-bucket-bytes or --clip-norm ask (on the task's
    optimizer itself: the loss-scale wrapper hands it the unscaled gradients, and it reduces them); under
    mixed_float16 wrapped in dynamic loss scaling (the step scales the loss with optimizer.scale_loss, and
    apply_gradients unscales the gradients and skips a step that overflowed)."""
    rate: Any = learning_rate
    if config.warmup_steps or config.learning_rate_schedule != "constant":
        rate = WarmupThenDecay(learning_rate, config.warmup_steps, config.learning_rate_schedule, total_steps)
    optimizer = task.optimizer(rate)
    if config.gradient_compression != "none" or config.gradient_bucket_bytes or config.clip_norm:
        allreduce.install(optimizer, config.gradient_compression, config.gradient_bucket_bytes, config.clip_norm)
    return GroupLossScaleOptimizer(optimizer) if config.precision == "mixed_float16" else optimizer


class GroupLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Dynamic loss scaling whose overflow check the whole group agrees on. Keras's checks each replica's own
    gradients before they are summed, so a worker whose batch overflowed would skip the step, and the all-reduce in
    it, while the others wait in that all-reduce; one small all-reduce of the check keeps them together."""

    def check_finite(self, grads: Any) -> Any:
        finite = super().check_finite(grads)
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            return finite
        return context.all_reduce("SUM", tf.cast(tf.logical_not(finite), tf.float32)) == 0


def learning_rate_words(config: Config, learning_rate: float) -> str:
    """The learning rate for the run's first line, e.g. 'learning rate 0.002 (warmup 100 steps, cosine decay)'."""
    shape = [f"warmup {config.warmup_steps} steps"] if config.warmup_steps else []
    shape += ["cosine decay"] if config.learning_rate_schedule == "cosine" else []
    return f"learning rate {learning_rate:g}" + (f" ({', '.join(shape)})" if shape else "")


class WarmupThenDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to the peak over warmup_steps (the first step already moves), then constant or a
    cosine decay to 0 at total_steps."""

    def __init__(self, peak: float, warmup_steps: int, decay: str, total_steps: int) -> None:
        self.peak, self.warmup_steps, self.decay, self.total_steps = peak, warmup_steps, decay, total_steps

    def __call__(self, step: Any) -> tf.Tensor:
        step = tf.cast(step, tf.float32)
        warming = self.peak * (step + 1) / max(self.warmup_steps, 1)
        after = tf.constant(self.peak, tf.float32)
        if self.decay == "cosine":
            progress = tf.clip_by_value((step - self.warmup_steps) / max(self.total_steps - self.warmup_steps, 1), 0, 1)
            after = self.peak * 0.5 * (1 + tf.cos(math.pi * progress))
        return tf.where(step < self.warmup_steps, warming, after)

    def get_config(self) -> dict[str, Any]:
        return {
            "peak": self.peak,
            "warmup_steps": self.warmup_steps,
            "decay": self.decay,
            "total_steps": self.total_steps,
        }
