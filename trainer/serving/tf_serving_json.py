"""TensorFlow Serving's REST predict format (its api_rest guide), so a client written for TF Serving or KServe's
TensorFlow runtime works unchanged against this server.

Request, row form:      {"instances": [row, ...]}  a row is the single input's value, or {input name: value}
Request, columnar form: {"inputs": value}          the single input's batch, or {input name: batch}
Either may name "signature_name", one of the SavedModel's signatures; without it the request goes to the signature
its inputs fit (trainer/serving/signature.py, `choose`). A string input's value is text, or {"b64": "<base64>"} for
binary data such as an image file: {"instances": [{"b64": "..."}]}.
Response: {"predictions": [...]} for rows (each row the single output's value, or {output name: value});
{"outputs": value or {output name: batch}} for columns; errors {"error": "..."}. A string output's value is its text;
one whose name ends in `_bytes`, or that is not UTF-8, is {"b64": "<base64>"}, as TF Serving writes binary.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Any

import numpy as np

from trainer.serving.signature import Signature, TensorInfo, choose

ROWS, COLUMNS = "instances", "inputs"
B64 = "b64"
# TF Serving's rule: a string output whose name ends so is binary, written as {"b64": ...}.
BINARY_OUTPUT_SUFFIX = "_bytes"


def decode(body: Any, signatures: Mapping[str, Signature]) -> tuple[dict[str, np.ndarray], str, Signature]:
    """The checked input arrays of a predict body, its form (ROWS or COLUMNS) and the signature that answers it."""
    default = next(iter(signatures.values()))
    if not isinstance(body, dict):
        raise default.refuse(f'the body must be a JSON object with "{ROWS}" (rows) or "{COLUMNS}" (columns)')
    forms = [form for form in (ROWS, COLUMNS) if form in body]
    if len(forms) != 1:
        raise default.refuse(
            f'the body must hold exactly one of "{ROWS}" (rows) and "{COLUMNS}" (columns), it has '
            f"{' and '.join(forms) if forms else 'neither'}"
        )
    form = forms[0]
    names, binary = _request_inputs(body[form], form)
    signature = choose(signatures, names, binary, body.get("signature_name"))
    columns = _rows_to_columns(body[ROWS], signature) if form == ROWS else _named_columns(body[COLUMNS], signature)
    arrays = {name: _array(signature, signature.input_named(name), value) for name, value in columns.items()}
    return signature.complete(arrays), form, signature


def encode(outputs: dict[str, np.ndarray], form: str) -> dict[str, Any]:
    """The response body for outputs computed from a request of this form."""
    columns = {name: _json_values(name, array) for name, array in outputs.items()}
    if form == COLUMNS:
        return {"outputs": next(iter(columns.values())) if len(columns) == 1 else columns}
    if len(columns) == 1:
        return {"predictions": next(iter(columns.values()))}
    batch = min(len(column) for column in columns.values())
    return {"predictions": [{name: column[row] for name, column in columns.items()} for row in range(batch)]}


def is_b64(value: Any) -> bool:
    """TF Serving's binary value: an object whose one key is "b64"."""
    return isinstance(value, dict) and len(value) == 1 and B64 in value


def _request_inputs(values: Any, form: str) -> tuple[set[str] | None, bool]:
    """What signature.choose reads of a request: the inputs it names (None: it names none), and whether an unnamed
    input's values are {"b64": ...}, judged by the first."""
    rows = values if form == ROWS and isinstance(values, list) and values else None
    if rows is not None and all(_is_named(row) for row in rows):
        return {name for row in rows for name in row}, False
    if form == COLUMNS and _is_named(values):
        return set(values), False
    first = rows[0] if rows is not None else values
    while isinstance(first, list) and first:
        first = first[0]
    return None, is_b64(first)


def _is_named(value: Any) -> bool:
    return isinstance(value, dict) and not is_b64(value)


def _array(signature: Signature, spec: TensorInfo, value: Any) -> np.ndarray:
    """A JSON value as the array input `spec` takes: numbers, or for a string input text and {"b64": ...} values."""
    if not spec.is_string:
        return signature.from_json(spec, value)
    try:
        array = np.array(value, dtype=object)
    except ValueError:
        raise signature.refuse(
            f"input {spec.name!r}: the values are not a rectangular array (rows differ in length)"
        ) from None
    flat = array.ravel()
    for index, element in enumerate(flat):
        if is_b64(element):
            flat[index] = _b64_decoded(signature, spec, index, element[B64])
        elif isinstance(element, list | dict):
            raise signature.refuse(f"input {spec.name!r}: the values are not a rectangular array of strings")
    return signature.checked(spec, flat.reshape(array.shape))


def _b64_decoded(signature: Signature, spec: TensorInfo, index: int, text: Any) -> bytes:
    try:
        if not isinstance(text, str):
            raise binascii.Error(f"a {type(text).__name__}, not a string")
        return base64.b64decode(text, validate=True)
    except binascii.Error as error:
        raise signature.refuse(f'element {index} of input {spec.name!r}: its "b64" is not base64 ({error})') from None


def _json_values(name: str, array: np.ndarray) -> Any:
    """An output as JSON values: numbers as they are, strings as text or, if binary, {"b64": ...}."""
    if array.dtype.kind not in "OS":
        return array.tolist()
    binary = name.endswith(BINARY_OUTPUT_SUFFIX)

    def value(element: Any) -> Any:
        if isinstance(element, bytes):
            if not binary:
                try:
                    return element.decode()
                except UnicodeDecodeError:
                    pass  # not text: written as binary, which JSON can carry
            return {B64: base64.b64encode(element).decode("ascii")}
        return element

    return np.asarray(np.frompyfunc(value, 1, 1)(array), dtype=object).tolist()


def _rows_to_columns(rows: Any, signature: Signature) -> dict[str, Any]:
    if not isinstance(rows, list) or not rows:
        raise signature.refuse(f'"{ROWS}" must be a non-empty list of rows')
    if all(_is_named(row) for row in rows):
        names = sorted({name for row in rows for name in row})
        for name in names:
            signature.input_named(name)
        incomplete = [index for index, row in enumerate(rows) if sorted(row) != names]
        if incomplete:
            raise signature.refuse(f"row {incomplete[0]} does not name the same inputs as the others ({names})")
        return {name: [row[name] for row in rows] for name in names}
    if len(signature.inputs) != 1:
        raise signature.refuse('with several inputs, each row of "instances" must be an object {input name: value}')
    return {signature.inputs[0].name: rows}


def _named_columns(columns: Any, signature: Signature) -> dict[str, Any]:
    if _is_named(columns):
        return dict(columns)
    if len(signature.inputs) != 1:
        raise signature.refuse(f'with several inputs, "{COLUMNS}" must be an object {{input name: batch}}')
    return {signature.inputs[0].name: columns}
