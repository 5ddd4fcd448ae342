"""Verified exports: the SavedModel written for serving is loaded back and answers a few test examples, and its
answers must match the model in memory before serving/<version>/ is published.

What it compares: the signature TF Serving and KServe call (`serving_default`, the task's `serve` endpoint) on a
batch of the dataset's test features, against `Task.serving_reference`, what the task says the served outputs
must be, computed eagerly from the trained model (the default task states it from the model called as
evaluation calls it). A serving function that preprocesses differently from training, or weights that did not
make it into the SavedModel, show up as a difference beyond TOLERANCE; the run then fails (ExportCheckError, exit
2) and nothing is published. The result goes to metrics.json as "export_check", which model selection requires.

Every worker computes the reference at the same point (reading the model may read distributed variables); only
the chief, which publishes, loads the SavedModel back: that part is local and takes no collective.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from trainer.base.errors import ExportCheckError
from trainer.task import Task

log = logging.getLogger(__name__)

SIGNATURE = "serving_default"  # the signature servers call; Keras makes the first endpoint it
EXAMPLES = 8  # test examples the exported model answers
# Largest absolute difference allowed in any output: the same float32 graph, run eagerly and from the SavedModel,
# differs only by the order of floating-point sums; a real skew is orders of magnitude larger.
TOLERANCE = 1e-4


def test_features(task: Task, shards: Sequence[Any], count: int = EXAMPLES) -> Any | None:
    """The features of the first `count` examples of this process's test shard (its training shard when the test
    shard is empty), as one batch; None when the process has no shard (e.g. a custom Calls)."""
    for shard in reversed(shards):  # (train, test): the test shard first
        records = shard.records(tf.constant(0, tf.int64)).take(count)
        batches = list(records.map(shard.decode).batch(count).take(1))
        if batches:
            features, _ = task.features_and_targets(batches[0])
            return features
    return None


def serving_arguments(task: Task, model: keras.Model, features: Any) -> list[Any]:
    """The dataset's features as serve()'s arguments, each cast to its signature's dtype (what a client sends)."""
    specs = task.serving_signature(model)
    arguments = [features] if len(specs) == 1 else list(features)
    return [
        tf.nest.map_structure(lambda spec, value: tf.cast(value, spec.dtype), spec, argument)
        for spec, argument in zip(specs, arguments, strict=True)
    ]


def reference(task: Task, model: keras.Model, features: Any) -> dict[str, np.ndarray]:
    """What the exported model must answer for `features`, from the model in memory (every worker calls it)."""
    # Traced, as the SavedModel's graph is: both get the same graph rewrites (fused kernels round differently from
    # op-by-op execution in 16 bits), so what differs is what the task or the export changed.
    traced = tf.function(lambda *arguments: task.serving_reference(model, *arguments), autograph=False)
    outputs = traced(*serving_arguments(task, model, features))
    return {name: np.asarray(keras.ops.convert_to_numpy(value)) for name, value in outputs.items()}


def check(saved_model: str, task: Task, model: keras.Model, features: Any, expected: dict[str, np.ndarray]) -> dict:
    """Loads the SavedModel at `saved_model`, runs its serving signature on `features` and compares every output
    with `expected`; returns the metrics.json record, or raises ExportCheckError on a difference."""
    signature = tf.saved_model.load(saved_model).signatures[SIGNATURE]
    answered = signature(**_named_inputs(signature, task, model, features))
    examples = len(next(iter(expected.values()))) if expected else 0
    differences = {name: _difference(expected[name], answered.get(name)) for name in expected}
    extra = sorted(set(answered) - set(expected))
    # A NaN compares false with everything, so max() over it depends on the order: any NaN is the worst difference.
    worst = max((math.inf if math.isnan(diff) else diff for diff in differences.values()), default=0.0)
    record = {
        "passed": worst <= TOLERANCE and not extra,
        "examples": examples,
        "max_abs_diff": worst,
        "tolerance": TOLERANCE,
        "signature": SIGNATURE,
    }
    if not record["passed"]:
        # `not <=`: a NaN difference is named too.
        skewed = ", ".join(f"{name!r} by {diff:.3g}" for name, diff in differences.items() if not diff <= TOLERANCE)
        raise ExportCheckError(
            f"the exported SavedModel's {SIGNATURE} signature answers {examples} test examples differently from "
            f"the model in memory ({skewed or 'outputs ' + ', '.join(extra) + ' that serving_reference lacks'}; "
            f"tolerance {TOLERANCE:g}): a serving skew, so nothing was published under serving/. Make the task's "
            f"serve() compute what serving_reference() says (the same preprocessing as training), then run again"
        )
    return record


def _named_inputs(signature: Any, task: Task, model: keras.Model, features: Any) -> dict[str, tf.Tensor]:
    names = list(signature.structured_input_signature[1])
    values = tf.nest.flatten(serving_arguments(task, model, features))
    specs = tf.nest.flatten(task.serving_signature(model))
    if len(values) == 1 and len(names) == 1:
        return {names[0]: values[0]}
    if all(spec.name in names for spec in specs):
        return {spec.name: value for spec, value in zip(specs, values, strict=True)}
    raise ExportCheckError(
        f"cannot match the serving inputs {names} to the task's serving_signature(): give every tf.TensorSpec in it "
        f"a name (name=...)"
    )


def _difference(expected: np.ndarray, answered: Any) -> float:
    """The largest absolute difference; infinite when the output is missing or shaped differently."""
    if answered is None:
        return float("inf")
    if expected.dtype.kind in "OSU":  # names: equal or not
        same = expected.shape == tuple(answered.shape) and bool(np.all(answered.numpy() == expected))
        return 0.0 if same else float("inf")
    served = np.asarray(answered.numpy(), np.float64)
    if served.shape != expected.shape:
        return float("inf")
    return float(np.max(np.abs(served - expected.astype(np.float64)), initial=0.0))
