"""REST v2's binary data extension read with each tensor's bytes kept as they came: the body is a JSON header of
`Inference-Header-Content-Length` bytes, then each input that gives `binary_data_size` in its parameters (instead of
`data`) as that many bytes, in order; BYTES elements each as a 4-byte little-endian length and the bytes.

KServe 0.21.0's own reader (InferRequest.from_bytes) turns a binary BYTES tensor into UTF-8 text, so an image file,
which is not text, failed there with a 500. Here the raw bytes go to InferInput as KServe's gRPC path gives them, and
its as_numpy decodes them when the input is checked (trainer/serving/model.py).
"""

from __future__ import annotations

import json
from typing import Any

from kserve.errors import InvalidInput
from kserve.protocol.infer_type import InferInput, InferRequest, RequestedOutput


def read(body: bytes, json_length: str, model_name: str) -> InferRequest:
    """The request of a binary v2 body; InvalidInput (400) naming what is malformed."""
    try:
        length = int(json_length)
        header = json.loads(body[:length])
        inputs, end = _inputs(header["inputs"], body, length)
        outputs = [RequestedOutput(output["name"], output.get("parameters")) for output in header.get("outputs", [])]
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise InvalidInput(
            f"the body is not a v2 inference request with binary data ({type(error).__name__}: {error})"
        ) from None
    if end != len(body):
        raise InvalidInput(
            f"the body holds {len(body) - length} bytes after its JSON header, and its inputs' binary_data_size "
            f"add up to {end - length}"
        )
    parameters = header.get("parameters")
    return InferRequest(
        model_name,
        inputs,
        request_id=header.get("id"),
        parameters=parameters if isinstance(parameters, dict) else None,
        request_outputs=outputs or None,
    )


def _inputs(tensors: list[dict[str, Any]], body: bytes, offset: int) -> tuple[list[InferInput], int]:
    """The header's inputs, each binary one given its bytes from `offset` on; and the offset past the last."""
    inputs = []
    for tensor in tensors:
        shape = [int(size) for size in tensor["shape"]]
        infer_input = InferInput(tensor["name"], shape, str(tensor["datatype"]), tensor.get("data"))
        if "data" not in tensor:
            size = int((tensor.get("parameters") or {})["binary_data_size"])
            if not 0 <= size <= len(body) - offset:
                raise ValueError(f"the binary_data_size of input {tensor['name']!r}, {size}, passes the body's end")
            infer_input._raw_data = body[offset : offset + size]
            offset += size
        inputs.append(infer_input)
    return inputs, offset
