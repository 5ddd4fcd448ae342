"""What a SavedModel serves, read from the SavedModel itself: its signatures' inputs and outputs (name, dtype,
shape), which signature a request goes to (`choose`), the checks that turn a request's values into arrays the
signature accepts, the call, and the class names a `class_names` signature holds.

Nothing here knows the task: the trainer's exported signatures name their inputs and outputs, so any task's model is
served as it was exported. A value that does not fit is refused with InvalidInput (HTTP 400, gRPC INVALID_ARGUMENT),
whose message names every input the signature expects. Strings (TensorFlow's DT_STRING: text, or encoded files such
as images) are numpy object arrays of bytes here, as TensorFlow returns them.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np
import tensorflow as tf
from kserve.errors import InvalidInput
from kserve.utils.numpy_codec import from_np_dtype

log = logging.getLogger(__name__)

# The trainer's endpoint first; serving_default so a SavedModel written by other tools is served too.
SIGNATURE_NAMES = ("serve", "serving_default")
# The signature (no inputs) and its output that hold a classifier's class names, in class-id order.
CLASS_NAMES = "class_names"
# A TensorFlow error's lines that say where it happened, not what: the line after them says what.
_WHERE_LINES = ("Graph execution error", "Detected at node", "<stack traces unavailable>")
# Where an eager call's error says which function failed, before what: "{{function_node __inference_serve_12}} ".
_FUNCTION_NODE = re.compile(r"^\{\{function_node [^}]*\}\} ")
# The escape tf.debugging.Assert adds to its string data: a backslash before each backslash and quote.
_ASSERT_ESCAPE = re.compile(r"\\([\\'\"])")


@dataclasses.dataclass(frozen=True)
class TensorInfo:
    """One named tensor of the signature; -1 in shape where any size is accepted (the batch)."""

    name: str
    dtype: str  # numpy's name: uint8, float32; object for strings
    shape: tuple[int, ...] | None  # None: any rank

    @property
    def is_string(self) -> bool:
        """A string input or output (DT_STRING): bytes, whether text or an encoded file."""
        return self.dtype == "object"

    @functools.cached_property
    def datatype(self) -> str:
        """The Open Inference Protocol's name of the dtype (UINT8, FP32); once, not per request."""
        return str(from_np_dtype(np.dtype(self.dtype)))

    def describe(self) -> str:
        dtype = "string" if self.is_string else self.dtype
        return f"{self.name}: {dtype} {list(self.shape) if self.shape is not None else '[any shape]'}"

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
        """`array` cast to the input's dtype (a string input's values to bytes), refused where the cast would change a
        value or the shape differs."""
        target = np.dtype(spec.dtype)
        if spec.is_string:
            array = self.as_bytes(spec, array)
        elif array.dtype.kind in "OSU":
            raise self.refuse(f"input {spec.name!r} takes {spec.dtype} numbers, got strings")
        elif array.dtype == target:
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

    def as_bytes(self, spec: TensorInfo, array: np.ndarray) -> np.ndarray:
        """A string input's values as an object array of bytes (text encoded as UTF-8), refused if any is not one."""
        if array.dtype.kind not in "OSU":
            raise self.refuse(f"input {spec.name!r} takes strings, got {array.dtype.name} values")
        flat = array.ravel()
        values = np.empty(flat.shape, object)
        for index, value in enumerate(flat):
            if isinstance(value, bytes):
                values[index] = value
            elif isinstance(value, str):
                values[index] = value.encode()
            else:
                raise self.refuse(f"element {index} of input {spec.name!r} is {type(value).__name__}, not a string")
        return values.reshape(array.shape)

    def fits(self, names: Collection[str] | None, binary: bool) -> bool:
        """Whether a request naming these inputs (None: one, unnamed, whose values are {"b64": ...} or not) is one for
        this signature (the rule: `choose`)."""
        if not self.inputs:
            return False
        if names is None:
            return len(self.inputs) == 1 and (self.inputs[0].is_string or not binary)
        return set(names) == {spec.name for spec in self.inputs}

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
            raise self.refuse(f"the model refused the input ({what_went_wrong(error)[:300]})") from None
        return {name: tensor.numpy() for name, tensor in outputs.items()}


def what_went_wrong(error: Exception) -> str:
    """The line of a model's error that says what is wrong, not where: a graph's error starts with where its node
    was defined, and tf.debugging.Assert's message is its data, bracketed and escaped once more. An error whose
    message is not UTF-8 (a model that put a file's raw bytes in it) reaches Python as the UnicodeDecodeError of
    reading it, which holds the message: read with those bytes escaped."""
    text = str(error)
    if isinstance(error, UnicodeDecodeError) and isinstance(error.object, bytes):
        text = error.object.decode("utf-8", "backslashreplace")
    lines = [_FUNCTION_NODE.sub("", line) for line in text.splitlines() if line.strip() and not line[0].isspace()]
    said = next((line for line in lines if not line.startswith(_WHERE_LINES)), lines[0] if lines else repr(error))
    asserted = said.removeprefix("assertion failed: ")
    if asserted != said and asserted.startswith("[") and asserted.endswith("]"):
        said = _ASSERT_ESCAPE.sub(r"\1", asserted[1:-1].replace("] [", " "))
    return said


def choose(
    signatures: Mapping[str, Signature], names: Collection[str] | None, binary: bool = False, named: Any = None
) -> Signature:
    """The signature a request goes to. `signatures` are the model's, the default first; `names` are the inputs the
    request names, None where a v1 request leaves its one input unnamed (then `binary` says whether its values are
    {"b64": ...}); `named` is a v1 request's signature_name. The rule (docs/serving.md, "Which signature answers"):

    1. A v1 request's signature_name picks that signature. A name the model lacks, or one of a signature without
       inputs (metadata such as `class_names`), is refused, naming those that answer requests.
    2. Otherwise the default signature (`serve`, else `serving_default`) answers every request that fits it.
    3. A request that does not fit the default goes to the first other signature, by name, that it fits; if none
       does, to the default, whose refusal names its inputs.

    A request fits a signature when it names exactly the signature's inputs (v1 named rows or columns, v2 and gRPC
    tensors); a v1 request that leaves its input unnamed fits a signature with one input, unless its values are
    {"b64": ...} (binary) and that input is not a string. So {"instances": [{"b64": ...}]} and a v2 tensor
    `image_bytes` go to `serve_image_bytes`; numbers, `images`, and whatever else fits `serve`, to `serve`. A
    signature without inputs answers no request."""
    default = next(iter(signatures.values()))
    answering = [name for name, signature in signatures.items() if signature.inputs]
    if named is not None:
        if named not in answering:
            metadata = isinstance(named, str) and named in signatures
            problem = (
                "names the model's metadata (a signature without inputs), not a signature that answers requests"
                if metadata
                else "is not one of this model's signatures"
            )
            raise default.refuse(
                f"signature_name {named!r} {problem} ({', '.join(repr(name) for name in answering)}): name one of "
                f"them, or leave it out for {default.name!r}"
            )
        return signatures[named]
    if default.fits(names, binary):
        return default
    return next((signatures[name] for name in answering if signatures[name].fits(names, binary)), default)


def class_names(signatures: Mapping[str, Signature]) -> tuple[str, ...] | None:
    """The class names the model holds in its `class_names` signature (no inputs, a string output of that name),
    read once per loaded version for the metadata; None when it has none."""
    signature = signatures.get(CLASS_NAMES)
    if signature is None or signature.inputs:
        return None
    names = signature.run({}).get(CLASS_NAMES)
    if names is None or names.dtype.kind != "O":
        log.warning("signature %r has no string output %r: the metadata has no class names", CLASS_NAMES, CLASS_NAMES)
        return None
    return tuple(name.decode("utf-8", "replace") for name in names.ravel())


def load_signatures(path: str) -> dict[str, Signature]:
    """Every signature of the SavedModel at `path` by name, the one served by default first (`serve`, else
    `serving_default`, else its only one with inputs); `choose` says which one answers a request."""
    saved_model = tf.saved_model.load(path)
    signatures = {name: Signature(saved_model, name) for name in sorted(saved_model.signatures.keys())}
    answering = [name for name, signature in signatures.items() if signature.inputs]
    chosen = next(
        (name for name in SIGNATURE_NAMES if name in answering), answering[0] if len(answering) == 1 else None
    )
    if chosen is None:
        raise ValueError(
            f"{path} has signatures {list(signatures) or 'none'}: export one named {' or '.join(SIGNATURE_NAMES)} "
            f"to serve it"
        )
    return {chosen: signatures.pop(chosen), **signatures}
