"""gRPC v2's ModelInfer, answered by this project's handler; every other gRPC method is KServe's servicer's.

KServe 0.21.0 runs each ModelInfer call through two interceptors, its servicer, its DataPlane and its Model.__call__
(three latency histograms, a coroutine check per stage, the request's headers copied), then its InferRequest and
InferResponse types, and that work, not gRPC and not the model, was most of the event loop's time per call
(docs/bench-log.md, "Serving: ModelInfer answered by the project"). With batching on, the loop is the bound: every
request passes through it while the model call is shared. So this handler, the first interceptor, answers ModelInfer
itself:

- the admission limit (trainer/serving/admission.py): a call past --max-concurrent-requests is refused at once,
  before its message is parsed;
- the model's name and readiness, refused as KServe refuses them (NOT_FOUND, UNAVAILABLE), and KServe's own request
  validation;
- raw tensors (`raw_input_contents`, what KServe's InferenceGRPCClient and Triton's clients send; BYTES in their
  length-prefixed form) are read straight into arrays and answered straight into a ModelInferResponse, in the form
  KServe's InferResponse.to_grpc gives them (tests/serving/test_grpc_infer.py holds the two equal); typed `contents`
  go through KServe's own types, as before;
- the signature that answers, chosen by the request's inputs (trainer/serving/signature.py, `choose`);
- each refusal's status and one log line (trainer/serving/refusals.py), and KServe's request_predict_seconds.
"""

from __future__ import annotations

import functools
import uuid
from typing import Any

import grpc
import numpy as np
from grpc.aio import ServerInterceptor
from kserve.errors import ModelNotFound, ModelNotReady
from kserve.metrics import PREDICT_HIST_TIME, get_labels
from kserve.protocol.grpc import grpc_predict_v2_pb2 as pb
from kserve.protocol.grpc.servicer import InferenceServicer
from kserve.protocol.infer_type import InferRequest, deserialize_bytes_tensor, serialize_byte_tensor
from kserve.utils.numpy_codec import from_np_dtype, to_np_dtype

from trainer.serving import refusals
from trainer.serving.admission import Admission
from trainer.serving.model import SavedModelVersions, v2_input
from trainer.serving.signature import Signature, choose

# gRPC's inference call; the others (health, metadata, the model repository) are KServe's and never refused.
GRPC_INFER = "/inference.GRPCInferenceService/ModelInfer"


class ModelInferHandler(ServerInterceptor):
    """The first gRPC interceptor: ModelInfer is answered here, every other method passes on to KServe."""

    def __init__(self, model: SavedModelVersions, admission: Admission) -> None:
        self.model, self.admission = model, admission
        self.latency = PREDICT_HIST_TIME.labels(**get_labels(model.name))
        self.handler = grpc.unary_unary_rpc_method_handler(
            self.infer,
            request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=pb.ModelInferResponse.SerializeToString,
        )
        # A full server refuses with this one: no deserializer, so the refused message is never parsed.
        self.refusing_handler = grpc.unary_unary_rpc_method_handler(self.refuse)

    async def intercept_service(self, continuation: Any, handler_call_details: Any) -> Any:
        if handler_call_details.method == GRPC_INFER:
            return self.refusing_handler if self.admission.full else self.handler
        return await continuation(handler_call_details)

    async def refuse(self, request: Any, context: grpc.aio.ServicerContext) -> None:
        reason = self.admission.refusal()
        refusals.logged(f"gRPC {GRPC_INFER}", grpc.StatusCode.RESOURCE_EXHAUSTED.name, reason)
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, reason)

    async def infer(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext) -> pb.ModelInferResponse:
        admission = self.admission
        if admission.full:  # checked again: others may have come in since this call's handler was chosen
            await self.refuse(request, context)
        admission.enter()
        try:
            with self.latency.time():
                return await self.answer(request)
        except Exception as error:  # each kind gets its status; any other INTERNAL, as from KServe
            await refusals.RefusalsToStatus().handle_exception(error, request, context, GRPC_INFER)
            raise
        finally:
            admission.leave()

    async def answer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        model = self.model
        if request.model_name != model.name:
            raise ModelNotFound(request.model_name)
        if not model.ready:
            raise ModelNotReady(model.name)
        InferenceServicer.validate_grpc_request(request)
        if not request.raw_input_contents:
            response = await model.predict(InferRequest.from_grpc(request))
            return response.to_grpc()  # type: ignore[union-attr]  # a v2 request is answered with an InferResponse
        served = model.served  # read once: the whole request runs on this version
        signature = choose(served.signatures, [tensor.name for tensor in request.inputs])
        outputs = await model.run(signature, signature.complete(raw_arrays(request, signature)))
        return raw_response(request.id or str(uuid.uuid4()), model.name, str(served.version), outputs)


def raw_arrays(request: pb.ModelInferRequest, signature: Signature) -> dict[str, np.ndarray]:
    """The request's raw tensors as checked arrays (their count already validated)."""

    def decoder(tensor: Any, raw: bytes) -> Any:
        if tensor.datatype == "BYTES":  # each element's length, then its bytes
            return lambda: deserialize_bytes_tensor(raw).reshape(tensor.shape)
        return lambda: np.frombuffer(raw, to_np_dtype(tensor.datatype)).reshape(tensor.shape)

    return dict(
        v2_input(signature, tensor.name, tensor.datatype, tensor.shape, decoder(tensor, raw))
        for tensor, raw in zip(request.inputs, request.raw_input_contents, strict=True)
    )


def raw_response(
    response_id: str, model_name: str, version: str, outputs: dict[str, np.ndarray]
) -> pb.ModelInferResponse:
    """The outputs as raw tensors, each with its binary_data_size, as KServe's InferResponse.to_grpc writes them."""
    response = pb.ModelInferResponse(id=response_id, model_name=model_name, model_version=version)
    for name, array in outputs.items():
        raw = raw_bytes(array)
        tensor = response.outputs.add(name=name, datatype=datatype_of(array.dtype), shape=array.shape)
        tensor.parameters["binary_data_size"].int64_param = len(raw)
        response.raw_output_contents.append(raw)
    return response


def raw_bytes(array: np.ndarray) -> bytes:
    if array.dtype.kind not in "OSU":
        return array.tobytes()
    serialized = serialize_byte_tensor(array)  # text: each element's length, then its bytes
    return serialized.item() if serialized.size else b""


@functools.cache
def datatype_of(dtype: np.dtype) -> str:
    return str(from_np_dtype(dtype))
