"""The gradient all-reduce: in buckets, last layers first, optionally 16 bits on the wire, and the clip by global norm
of the sum.

Keras 3's TensorFlow optimizer sums the gradients across replicas in its private hook
`_all_reduce_sum_gradients`, as one batched all-reduce that can start only once the whole backward pass is done.
`install(optimizer, compression, bucket_bytes)` replaces that hook on one optimizer:

- buckets: the dense gradients are reversed (the last layers' come first out of the backward pass) and cut into
  packs of about `bucket_bytes` (TensorFlow's `CommunicationOptions(bytes_per_pack=...)`), one all-reduce each, so
  a bucket crosses the network while earlier layers are still being differentiated. The sums are the same
  numbers: each element is still summed over the same workers. 0 = one batch, as Keras does.
- compression: `bf16` or `fp16` casts each dense float gradient to 16 bits before the all-reduce and the sum back
  to the variable's dtype before the optimizer applies it: half the bytes. The sum itself is taken in the wire
  type (as PyTorch DDP's and Horovod's compression hooks do). bf16 keeps float32's range and loses precision
  (8 bits of mantissa); fp16 keeps 11 bits but its range is narrow, so each gradient is multiplied by a power of
  two before the cast and divided after: the scale is chosen from the previous step's summed maximum (the same on
  every worker), with 16x head room, and values beyond fp16's range are clipped (saturated), never infinite.
  Sparse gradients (IndexedSlices, from embeddings) stay as they are: TensorFlow gathers them, and its gather
  refuses bf16.

- clip_norm: the summed gradients are clipped by their global norm (`--clip-norm`), so every worker clips the same
  sum; Keras's own clipnorm options would clip each worker's gradients before the sum.

In one process (nothing crosses a network) the hook only clips. The hook runs after weight decay and loss-scale
unscaling. docs/bench.md measures buckets and compression at several link rates and says when they pay.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from trainer.base import private_api
from trainer.settings.config import COMPRESSIONS

_WIRE_TYPES = {"bf16": tf.bfloat16, "fp16": tf.float16}
_FP16_MAX = 65504.0
# The fp16 scale leaves this factor between the last step's summed maximum and fp16's largest value.
_FP16_HEAD_ROOM = 16.0
# Scales are powers of two within these exponents: exact to apply and undo.
_FP16_EXPONENTS = (-24.0, 64.0)
_FP16_FIRST_EXPONENT = 10.0


def install(optimizer: Any, compression: str = "none", bucket_bytes: int = 0, clip_norm: float = 0.0) -> Any:
    """Makes `optimizer` (a Keras 3 optimizer, TensorFlow backend) all-reduce its gradients in buckets of
    `bucket_bytes` (0 = one batch) and in `compression`'s type, then clip the sum to `clip_norm` (0 = no clip);
    returns the optimizer. Call it before `optimizer.build(...)`, in the strategy's scope, where the optimizer is
    made."""
    if compression not in COMPRESSIONS:
        raise ValueError(f"gradient compression {compression!r}: choose one of {', '.join(COMPRESSIONS)}")
    if bucket_bytes < 0:
        raise ValueError(f"gradient bucket bytes must be 0 (one batch) or positive, got {bucket_bytes}")
    if clip_norm < 0:
        raise ValueError(f"clip norm must be 0 (off) or positive, got {clip_norm}")
    reducer = GradientReducer(compression, bucket_bytes, clip_norm)
    private_api.replace_gradient_all_reduce(optimizer, reducer)
    build = optimizer.build

    def build_with_scales(variables: Any) -> None:
        build(variables)
        reducer.build(variables)

    object.__setattr__(optimizer, "build", build_with_scales)  # past Keras's tracking, as the reducer is
    return optimizer


class GradientReducer:
    """The replacement for Keras's `_all_reduce_sum_gradients(grads_and_vars)`: called in replica context,
    returns the (summed gradient, variable) pairs, None gradients kept in place."""

    def __init__(self, compression: str, bucket_bytes: int, clip_norm: float = 0.0) -> None:
        self.compression, self.bucket_bytes, self.clip_norm = compression, bucket_bytes, clip_norm
        # fp16 only: one scale exponent per variable, kept per replica (ON_READ: set locally, never synchronised,
        # since every worker computes the same value from the same summed gradients).
        self.exponents: dict[int, tf.Variable] = {}

    def build(self, variables: Any) -> None:
        if self.compression != "fp16" or tf.distribute.get_strategy().num_replicas_in_sync == 1:
            return
        for variable in variables:
            self.exponents[_key(variable)] = tf.Variable(
                _FP16_FIRST_EXPONENT,
                trainable=False,
                name="fp16_gradient_scale_exponent",
                synchronization=tf.VariableSynchronization.ON_READ,
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )

    def __call__(self, grads_and_vars: Any) -> list[tuple[Any, Any]]:
        pairs = list(grads_and_vars)
        context = tf.distribute.get_replica_context()
        if context is not None and context.num_replicas_in_sync > 1:
            pairs = self._summed(context, pairs)
        return self._clipped(pairs) if self.clip_norm else pairs

    def _summed(self, context: Any, pairs: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        present = [(index, grad, var) for index, (grad, var) in enumerate(pairs) if grad is not None]
        if not present:
            return pairs
        wire = [self._to_wire(grad, var) for _, grad, var in present]
        options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=self.bucket_bytes)
        summed = context.all_reduce(tf.distribute.ReduceOp.SUM, wire, options=options)
        result = list(pairs)
        for (index, grad, var), total in zip(present, summed, strict=True):
            result[index] = (self._from_wire(total, grad, var), var)
        return result

    def _clipped(self, pairs: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        present = [index for index, (grad, _) in enumerate(pairs) if grad is not None]
        clipped, _ = tf.clip_by_global_norm([pairs[index][0] for index in present], self.clip_norm)
        result = list(pairs)
        for index, grad in zip(present, clipped, strict=True):
            result[index] = (grad, pairs[index][1])
        return result

    def _compressed(self, grad: Any) -> bool:
        return self.compression != "none" and not isinstance(grad, tf.IndexedSlices) and grad.dtype.is_floating

    def _to_wire(self, grad: Any, var: Any) -> Any:
        if not self._compressed(grad):
            return grad
        if self.compression == "fp16":
            limit = _FP16_MAX / tf.distribute.get_replica_context().num_replicas_in_sync
            scaled = tf.cast(grad, tf.float32) * tf.pow(2.0, self._exponent(var).read_value())
            # Saturate: no worker's share can push a partial sum past fp16's largest value.
            grad = tf.clip_by_value(scaled, -limit, limit)
        return tf.cast(grad, _WIRE_TYPES[self.compression])

    def _from_wire(self, total: Any, grad: Any, var: Any) -> Any:
        if not self._compressed(grad):
            return total
        total = tf.cast(total, tf.float32)
        if self.compression == "fp16":
            exponent = self._exponent(var)
            total = total / tf.pow(2.0, exponent.read_value())
            largest = tf.reduce_max(tf.abs(total))
            wanted = tf.floor(tf.math.log(_FP16_MAX / (_FP16_HEAD_ROOM * largest)) / tf.math.log(2.0))
            # An all-zero gradient says nothing about the next one: keep the scale.
            chosen = tf.where(largest > 0, tf.clip_by_value(wanted, *_FP16_EXPONENTS), exponent.read_value())
            exponent.assign(chosen)
        return tf.cast(total, var.dtype)

    def _exponent(self, var: Any) -> tf.Variable:
        return self.exponents[_key(var)]


def _key(variable: Any) -> int:
    """One identity for a model variable, whether seen as the Keras variable, its tf.Variable, or a replica's."""
    variable = getattr(variable, "value", variable) if not isinstance(variable, tf.Variable) else variable
    return id(private_api.distributed_container(variable))
