"""What a SavedModel serves, read from the SavedModel itself: its signature's inputs and outputs (name, dtype,
shape), the checks that turn a request's values into arrays the signature accepts, and the call.

Nothing here knows the task: the trainer's exported `serve` signature names its inputs and outputs, so any task's
model is served as it was exported. A value that does not fit is refused with InvalidInput (HTTP 400, gRPC
INVALID_ARGUMENT), whose message names every input the model expects.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np
import tensorflow as tf
from kserve.errors import InvalidInput
from kserve.utils.numpy_codec import from_np_dtype

# The trainer's endpoint first; serving_default so a SavedModel written by other tools is served too.
SIGNATURE_NAMES = ("serve", "serving_default")


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One named tensor of the signature; -1 in shape where any size is accepted (the batch)."""

    name: str
    dtype: str  # numpy's name: uint8, float32
    shape: tuple[int, ...] | None  # None: any rank

    @functools.cached_property
    def datatype(self) -> str:
        """The Open Inference Protocol's name of the dtype (UINT8, FP32); once, not per request."""
        return str(from_np_dtype(np.dtype(self.dtype)))

    def describe(self) -> str:
        return f"{self.name}: {self.dtype} {list(self.shape) if self.shape is not None else '[any shape]'}"

    def metadata(self) -> dict[str, Any]:
        """The v2 model metadata's entry for this tensor."""
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape or [])}


def tensor_info(name: str, spec: tf.TensorSpec) -> TensorInfo:
    shape = None if spec.shape.rank is None else tuple(-1 if d is None else int(d) for d in spec.shape.as_list())
    return TensorInfo(name, np.dtype(spec.dtype.as_numpy_dtype).name, shape)


class Signature:
    """A loaded SavedModel's serving function with its inputs and outputs."""

    def __init__(self, saved_model: Any, name: str) -> None:
        self._saved_model = saved_model  # the function's variables live as long as this object
        self.name = name
        self.function = saved_model.signatures[name]
        _, keyword_specs = self.function.structured_input_signature
        self.inputs = tuple(tensor_info(key, spec) for key, spec in sorted(keyword_specs.items()))
        outputs = self.function.structured_outputs
        self.outputs = tuple(tensor_info(key, spec) for key, spec in sorted(outputs.items()))

    def expected(self) -> str:
        """The sentence every refusal ends with."""
        return f"this model's inputs are {'; '.join(spec.describe() for spec in self.inputs)}"

    def refuse(self, problem: str) -> InvalidInput:
        return InvalidInput(f"{problem}; {self.expected()}")

    def input_named(self, name: str) -> TensorInfo:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise self.refuse(f"the model has no input named {name!r}")

    def from_json(self, spec: TensorInfo, value: Any) -> np.ndarray:
        """A JSON value (nested lists of numbers) as the array input `spec` takes."""
        try:
            array = np.asarray(value)
        except ValueError:
            raise self.refuse(
                f"input {spec.name!r}: the values are not a rectangular array (rows differ in length)"
            ) from None
        if array.dtype.kind not in "biuf":
            raise self.refuse(f"input {spec.name!r}: the values must be numbers, got {array.dtype.kind!r} values")
        return self.checked(spec, array)

    def checked(self, spec: TensorInfo, array: np.ndarray) -> np.ndarray:
        """`array` cast to the input's dtype, refused where the cast would change a value or the shape differs."""
        target = np.dtype(spec.dtype)
        if array.dtype == target:
            pass  # no cast, so no value can change: the value checks below are for casts
        elif target.kind in "iu":
            if array.dtype.kind == "b":
                raise self.refuse(f"input {spec.name!r} takes {spec.dtype} integers, got booleans")
            if array.dtype.kind == "f" and not np.all(np.isfinite(array) & (array == np.round(array))):
                raise self.refuse(f"input {spec.name!r} takes {spec.dtype} integers, got fractional values")
            limits = np.iinfo(target)
            if array.size and (array.min() < limits.min or array.max() > limits.max):
                raise self.refuse(
                    f"input {spec.name!r} takes {spec.dtype} values in [{limits.min}, {limits.max}], got values "
                    f"from {array.min()} to {array.max()}"
                )
        elif target.kind == "f" and array.dtype.kind == "b":
            raise self.refuse(f"input {spec.name!r} takes {spec.dtype} numbers, got booleans")
        elif target.kind == "b" and array.dtype.kind != "b":
            raise self.refuse(f"input {spec.name!r} takes booleans, got {array.dtype.name}")
        if spec.shape is not None and (
            array.ndim != len(spec.shape)
            or any(want not in (-1, got) for want, got in zip(spec.shape, array.shape, strict=True))
        ):
            raise self.refuse(f"input {spec.name!r} has shape {list(array.shape)}, expected {list(spec.shape)}")
        return array.astype(target, copy=False)

    def complete(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Refuses a request that misses an input, or whose inputs disagree on the batch size."""
        missing = [spec.name for spec in self.inputs if spec.name not in arrays]
        if missing:
            raise self.refuse(f"the request has no value for input {', '.join(repr(name) for name in missing)}")
        batches = {name: array.shape[0] for name, array in arrays.items() if array.ndim}
        if len(set(batches.values())) > 1:
            raise self.refuse(f"the inputs disagree on the batch size: {batches}")
        return arrays

    def run(self, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The signature's outputs by name, for complete, checked inputs."""
        try:
            outputs = self.function(**{name: tf.constant(array) for name, array in arrays.items()})
        except (tf.errors.InvalidArgumentError, ValueError, TypeError) as error:
            raise self.refuse(f"the model refused the input ({str(error).strip().splitlines()[0][:300]})") from None
        return {name: tensor.numpy() for name, tensor in outputs.items()}


def load_signatures(path: str) -> dict[str, Signature]:
    """Every signature of the SavedModel at `path` by name, the one served by default first (`serve`, else
    `serving_default`, else its only one); a v1 request's signature_name picks another, as in TF Serving."""
    saved_model = tf.saved_model.load(path)
    names = list(saved_model.signatures.keys())
    chosen = next((name for name in SIGNATURE_NAMES if name in names), names[0] if len(names) == 1 else None)
    if chosen is None:
        raise ValueError(
            f"{path} has signatures {names or 'none'}: export one named {' or '.join(SIGNATURE_NAMES)} to serve it"
        )
    return {name: Signature(saved_model, name) for name in [chosen, *sorted(set(names) - {chosen})]}
