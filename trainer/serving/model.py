"""The kserve.Model that serves a base path of SavedModel versions: REST v1 in TF Serving's format, and the Open
Inference Protocol (REST v2 and gRPC v2) through KServe's own InferRequest and InferResponse."""

from __future__ import annotations

import asyncio
import gc
import struct
import threading
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import kserve
import numpy as np
from kserve.protocol.infer_type import InferOutput, InferRequest, InferResponse
from kserve.utils.numpy_codec import from_np_dtype
from prometheus_client import Counter, Gauge

from trainer.serving import tf_serving_json
from trainer.serving.batching import Batcher, BatchingOptions
from trainer.serving.signature import Signature, choose
from trainer.serving.versions import Loaded, VersionWatcher

# One model per server process, so no model label.
SERVED_VERSION = Gauge("serving_model_version", "the version being served")
VERSION_SWAPS = Counter("serving_version_swaps_total", "versions swapped in after the first")
HEAP_FROZEN = Gauge("serving_heap_frozen_objects", "objects kept out of the garbage collector's scans (freeze_heap)")
# How long after a swap the heap is frozen again: by then the requests that started on the old version are answered.
REFREEZE_AFTER_SWAP_SECONDS = 10.0


def freeze_heap() -> None:
    """Every object alive now (the loaded SavedModels', TensorFlow's and KServe's: about 440,000 here) is moved out of
    the cyclic garbage collector's scans (gc.freeze). Each full collection used to walk them all, stopping the whole
    server for hundreds of milliseconds every few hundred REST requests (their JSON makes many objects), which set
    REST v1's p99 (docs/bench-log.md measures it with and without). Objects without cycles are still freed as
    before. What was frozen before is thawed and collected first, so after a swap the old version's objects are freed
    rather than kept: one full collection per swap, and one at start."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()
    HEAP_FROZEN.set(gc.get_freeze_count())


class SavedModelVersions(kserve.Model):
    """One model name, served from the highest numbered SavedModel under a base path; a newer version is loaded
    in the background and swapped in while requests keep being answered."""

    def __init__(self, name: str, base_path: str, poll_seconds: float, batching: BatchingOptions | None = None) -> None:
        super().__init__(name)
        self.base_path = base_path
        self.watcher = VersionWatcher(base_path, poll_seconds, on_swap=self._swapped)
        self.batching = batching
        self.batcher = Batcher(batching) if batching is not None else None

    def load(self) -> bool:
        self.watcher.load_first()
        freeze_heap()
        self.ready = True
        return True

    def start(self) -> None:
        """Called by ModelServer once the model is registered: the watcher runs from then on."""
        self.ready = True
        self.watcher.start()

    def stop(self) -> None:
        self.watcher.stop()
        self.ready = False

    @property
    def served(self) -> Loaded:
        return self.watcher.current

    def _swapped(self, loaded: Loaded, previous: Loaded | None) -> None:
        SERVED_VERSION.set(loaded.version)
        if previous is not None:
            VERSION_SWAPS.inc()
            refreeze = threading.Timer(REFREEZE_AFTER_SWAP_SECONDS, freeze_heap)
            refreeze.daemon = True
            refreeze.start()

    def get_input_types(self) -> list[dict[str, Any]]:
        return [spec.metadata() for spec in self.served.signature.inputs]

    def get_output_types(self) -> list[dict[str, Any]]:
        return [spec.metadata() for spec in self.served.signature.outputs]

    def expected(self) -> str:
        return self.served.signature.expected()

    def expected_by_start(self, start: bytes) -> str:
        """The expected inputs for a body refused unparsed (over the size limit), from its first bytes: those of the
        signature the inputs it names there, or its {"b64": ...} values, are for (`choose`), else the default's."""
        signatures = self.served.signatures
        names = {
            spec.name
            for signature in signatures.values()
            for spec in signature.inputs
            if f'"{spec.name}"'.encode() in start
        }
        return choose(signatures, names or None, binary=f'"{tf_serving_json.B64}"'.encode() in start).expected()

    async def predict(
        self, payload: Any, headers: dict[str, str] | None = None, response_headers: dict[str, str] | None = None
    ) -> dict[str, Any] | InferResponse:
        served = self.served  # read once: the whole request runs on this version
        if isinstance(payload, InferRequest):
            signature = choose(served.signatures, [tensor.name for tensor in payload.inputs])
            arrays = signature.complete(_v2_arrays(payload, signature))
            outputs = await self.run(signature, arrays)
            return _v2_response(payload, self.name, served.version, outputs)
        if isinstance(payload, bytes | str):
            raise served.signature.refuse("the body must be JSON (Content-Type: application/json)")
        arrays, form, named = tf_serving_json.decode(payload, served.signatures)
        return tf_serving_json.encode(await self.run(named, arrays), form)

    async def run(self, signature: Signature, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The outputs for checked inputs: joined with other requests' when batching is on, else a call of their own."""
        if self.batcher is not None:
            return await self.batcher.run(signature, arrays)
        # In the default executor: TensorFlow releases the GIL, so the event loop keeps accepting requests meanwhile.
        return await asyncio.get_running_loop().run_in_executor(None, signature.run, arrays)


def _v2_arrays(request: InferRequest, signature: Signature) -> dict[str, np.ndarray]:
    return dict(
        v2_input(signature, tensor.name, tensor.datatype, tensor.shape, tensor.as_numpy) for tensor in request.inputs
    )


def v2_input(
    signature: Signature, name: str, datatype: str, shape: Sequence[int], decode: Callable[[], np.ndarray]
) -> tuple[str, np.ndarray]:
    """One v2 input tensor, decoded and checked against the signature: (its input's name, the array)."""
    spec = signature.input_named(name)
    if datatype != spec.datatype:
        raise signature.refuse(f"input {spec.name!r} has datatype {datatype}, expected {spec.datatype}")
    try:
        array = decode()
    except (ValueError, TypeError, struct.error) as error:  # struct: BYTES whose length prefixes pass their end
        raise signature.refuse(
            f"input {spec.name!r}: its data does not fill its shape {list(shape)} ({error})"
        ) from None
    return spec.name, signature.checked(spec, array)


def _v2_response(request: InferRequest, model_name: str, version: int, outputs: dict[str, np.ndarray]) -> InferResponse:
    infer_outputs = []
    for name, array in outputs.items():
        output = InferOutput(name=name, shape=list(array.shape), datatype=str(from_np_dtype(array.dtype)))
        if request.from_grpc and not request.use_binary_outputs and array.dtype.kind == "O":
            output.data = array.ravel().tolist()  # bytes as they are: KServe's own conversion takes only UTF-8 text
        elif request.from_grpc:  # its to_grpc takes lists or raw bytes, not arrays; raw when the request was raw
            output.set_data_from_numpy(array, binary_data=request.use_binary_outputs)
        else:  # its to_rest encodes an array as JSON, or as binary when the request asks for binary outputs
            output.data = array
        infer_outputs.append(output)
    return InferResponse(
        response_id=request.id or str(uuid.uuid4()),
        model_name=model_name,
        model_version=str(version),
        infer_outputs=infer_outputs,
        use_binary_outputs=request.use_binary_outputs,
        requested_outputs=request.request_outputs,
    )
