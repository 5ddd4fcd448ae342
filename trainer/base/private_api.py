"""Every private TensorFlow and Keras API the trainer uses, each behind one function, written for TensorFlow 2.21
and Keras 3.15 (the versions pyproject.toml pins). Each has a public purpose the public API does not serve; each
is exercised by tests/trainer/test_private_api.py, which names the version and fails by name when an upgrade
breaks one.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

WRITTEN_FOR = {"tensorflow": "2.21", "keras": "3.15"}
# Keras 3's TensorFlow optimizer sums the replicas' gradients in this method of its own, in replica context.
KERAS_GRADIENT_ALL_REDUCE = "_all_reduce_sum_gradients"


def replace_gradient_all_reduce(optimizer: Any, reducer: Any) -> None:
    """Makes `optimizer` sum its gradients across replicas with `reducer(grads_and_vars) -> grads_and_vars`."""
    if not callable(getattr(optimizer, KERAS_GRADIENT_ALL_REDUCE, None)):
        raise TypeError(
            f"{type(optimizer).__name__} has no {KERAS_GRADIENT_ALL_REDUCE} method (written for Keras "
            f"{WRITTEN_FOR['keras']} on TensorFlow): --gradient-compression, --gradient-bucket-bytes and --clip-norm "
            f"need a Keras 3 optimizer on the TensorFlow backend"
        )
    # On the instance, past Keras's attribute tracking: it is no state to checkpoint.
    object.__setattr__(optimizer, KERAS_GRADIENT_ALL_REDUCE, reducer)


def distributed_container(variable: Any) -> Any:
    """The distributed variable that a replica's component variable belongs to (itself when it belongs to none)."""
    container = getattr(variable, "_distributed_container", None)  # a distributed variable answers itself
    if container is None:
        # TensorFlow keeps the reference on a resource variable's handle; a distributed variable's handle is not
        # available outside replica context (ValueError), and such a variable answered above.
        try:
            container = getattr(variable.handle, "_distributed_container", None)
        except (AttributeError, ValueError):
            container = None
    return container() if container is not None else variable


def checkpoint_variable_shapes(checkpoint: tf.train.Checkpoint) -> dict[str, list[int]] | None:
    """The keys a save of `checkpoint` would write, with each variable's shape, from the object graph of the live
    objects (nothing written or read); None where one is not a plain variable. No public API names the keys;
    save_util is what tf.train.Checkpoint.write calls."""
    from tensorflow.python.checkpoint import graph_view, save_util

    serialized = save_util.serialize_graph_view(graph_view.ObjectGraphView(checkpoint))[0]
    shapes = {}
    for trackable, tensors in serialized.items():
        if not tensors:
            continue  # a layer or other container: its variables are trackables of their own
        # Mirrored variables come wrapped in a SaveableCompatibilityConverter: its _obj is the variable.
        shape = getattr(getattr(trackable, "_obj", trackable), "shape", None)
        if shape is None:
            return None
        shapes.update({key: list(shape) for key in tensors})
    return shapes


def wait_at_barrier(name: str, timeout_ms: int) -> None:
    """Blocks until every task of the coordination service reaches the barrier `name` (tf.errors.OpError past the
    timeout); TensorFlow has no public name for it."""
    from tensorflow.python.eager import context

    context.context().wait_at_barrier(name, timeout_ms)


def is_lost_worker(error: BaseException) -> bool:
    """Whether ClusterCoordinator counts `error` as a lost worker, whose call it runs again on another worker (or on
    that one once it is back) instead of failing it; TensorFlow has no public name for the test. For trainer/ps."""
    from tensorflow.python.distribute.coordinator import cluster_coordinator

    return cluster_coordinator._is_worker_failure(error)
