"""TensorFlow Serving's REST predict format (its api_rest guide), so a client written for TF Serving or KServe's
TensorFlow runtime works unchanged against this server.

Request, row form:      {"instances": [row, ...]}  a row is the single input's value, or {input name: value}
Request, columnar form: {"inputs": value}          the single input's batch, or {input name: batch}
Either may name "signature_name", one of the SavedModel's signatures (else the server's default, `serve`).
Response: {"predictions": [...]} for rows (each row the single output's value, or {output name: value});
{"outputs": value or {output name: batch}} for columns; errors {"error": "..."}.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from trainer.serving.signature import Signature

ROWS, COLUMNS = "instances", "inputs"


def decode(body: Any, signatures: Mapping[str, Signature]) -> tuple[dict[str, np.ndarray], str, Signature]:
    """The checked input arrays of a predict body, its form (ROWS or COLUMNS) and the signature it names (the first
    of `signatures`, the default, when it names none)."""
    signature = next(iter(signatures.values()))
    if not isinstance(body, dict):
        raise signature.refuse(f'the body must be a JSON object with "{ROWS}" (rows) or "{COLUMNS}" (columns)')
    forms = [form for form in (ROWS, COLUMNS) if form in body]
    if len(forms) != 1:
        raise signature.refuse(
            f'the body must hold exactly one of "{ROWS}" (rows) and "{COLUMNS}" (columns), it has '
            f"{' and '.join(forms) if forms else 'neither'}"
        )
    requested = body.get("signature_name")
    if requested is not None:
        if not isinstance(requested, str) or requested not in signatures:
            raise signature.refuse(
                f"signature_name {requested!r} is not one of this model's signatures "
                f"({', '.join(repr(name) for name in signatures)}): name one of them, or leave it out for "
                f"{signature.name!r}"
            )
        signature = signatures[requested]
    form = forms[0]
    columns = _rows_to_columns(body[ROWS], signature) if form == ROWS else _named_columns(body[COLUMNS], signature)
    arrays = {name: signature.from_json(signature.input_named(name), value) for name, value in columns.items()}
    return signature.complete(arrays), form, signature


def encode(outputs: dict[str, np.ndarray], form: str) -> dict[str, Any]:
    """The response body for outputs computed from a request of this form."""
    if form == COLUMNS:
        if len(outputs) == 1:
            return {"outputs": next(iter(outputs.values())).tolist()}
        return {"outputs": {name: array.tolist() for name, array in outputs.items()}}
    if len(outputs) == 1:
        return {"predictions": next(iter(outputs.values())).tolist()}
    batch = min(len(array) for array in outputs.values())
    return {"predictions": [{name: array[row].tolist() for name, array in outputs.items()} for row in range(batch)]}


def _rows_to_columns(rows: Any, signature: Signature) -> dict[str, Any]:
    if not isinstance(rows, list) or not rows:
        raise signature.refuse(f'"{ROWS}" must be a non-empty list of rows')
    if all(isinstance(row, dict) for row in rows):
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
    if isinstance(columns, dict):
        return columns
    if len(signature.inputs) != 1:
        raise signature.refuse(f'with several inputs, "{COLUMNS}" must be an object {{input name: batch}}')
    return {signature.inputs[0].name: columns}
