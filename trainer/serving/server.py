"""KServe's ModelServer around one SavedModelVersions, with what KServe 0.21.0 lacks for this use, added through
its own extension points:

- the served version in the v2 model metadata (`versions`; its DataPlane reports none): a DataPlane subclass, and
  the served version's class names (`class_names`, read from its `class_names` signature) beside them, answered by a
  route of ours (KServe's response model drops fields it does not know);
- REST v2's binary data extension with BYTES inputs that are not text, such as image files
  (trainer/serving/v2_binary.py; KServe's own reader takes only UTF-8 there);
- a request body limit on REST (KServe limits only gRPC messages, grpc_max_receive_message_length): an ASGI
  middleware answering 413, at the same limit as gRPC, naming the inputs of the signature the body's start is for;
- refusals that name the expected inputs for a body that is not JSON (v1: the DataPlane's decode) or not a v2
  request (v2: FastAPI's validation error, a 422 without them otherwise): 400 {"error": ...}, as its InvalidInput;
- TF Serving's model status (model_version_status) in GET /v1/models/<name>, beside KServe's readiness;
- one log line per refused request, and a 503 or RESOURCE_EXHAUSTED for a full queue (trainer/serving/refusals.py);
- uvloop as the event loop of both servers (KServe's ModelServer runs them on asyncio's own: its --event_loop reaches
  only uvicorn's config, which makes no loop here), for less time per request in the loop;
- an admission limit at the transport, refusing an inference request past --max-concurrent-requests before KServe
  decodes it (trainer/serving/admission.py): REST middleware outside the body limit, and gRPC's ModelInfer handler;
- ModelInfer answered by the project's own handler, the first gRPC interceptor (trainer/serving/grpc_infer.py), in
  place of KServe's servicer and the layers around it, which cost most of the event loop's time per request.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import Callable
from typing import Any

import kserve
import kserve.model_server
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from kserve.constants.constants import INFERENCE_CONTENT_LENGTH_HEADER, MAX_GRPC_MESSAGE_LENGTH, PredictorProtocol
from kserve.errors import InvalidInput, ModelNotFound
from kserve.protocol.dataplane import JSON_HEADERS, DataPlane
from kserve.protocol.rest.v2_datamodels import InferenceRequest
from pydantic import ValidationError

from trainer.serving import refusals, v2_binary
from trainer.serving.admission import Admission, RestAdmission
from trainer.serving.batching import describe
from trainer.serving.grpc_infer import ModelInferHandler
from trainer.serving.model import SavedModelVersions

log = logging.getLogger(__name__)

# How much of a body over the limit is read to tell which signature it is for: its JSON's start names the inputs.
SNIFFED_BYTES = 4096


class VersionedDataPlane(DataPlane):
    """KServe's data plane, reporting the served version and naming the expected inputs on undecodable bodies."""

    def __init__(self, model_registry: Any, model: SavedModelVersions) -> None:
        super().__init__(model_registry=model_registry)
        self.model = model

    async def model_metadata(self, model_name: str) -> dict[str, Any]:
        metadata: dict[str, Any] = await super().model_metadata(model_name)
        if model_name == self.model.name:
            served = self.model.served
            metadata.update(versions=[str(served.version)], platform="tensorflow_savedmodel")
            if served.class_names is not None:
                metadata.update(class_names=list(served.class_names))
        return metadata

    def decode(self, body: Any, headers: Any, *args: Any, **kwargs: Any) -> Any:
        v2 = kwargs.get("protocol_version", args[0] if args else None) == PredictorProtocol.REST_V2.value
        if v2 and isinstance(body, bytes) and headers and INFERENCE_CONTENT_LENGTH_HEADER in headers:
            try:
                return v2_binary.read(body, headers[INFERENCE_CONTENT_LENGTH_HEADER], self.model.name), {}
            except InvalidInput as error:
                raise InvalidInput(f"{error.reason}; {self.model.expected()}") from None
        if isinstance(body, bytes) and headers and INFERENCE_CONTENT_LENGTH_HEADER not in headers:
            # TF Serving reads every body as JSON, so `curl -d` (a form content type) works: here too.
            if headers.get("content-type", "application/json") not in JSON_HEADERS:
                headers = {key: value for key, value in headers.items() if key != "content-type"}
            if v2:
                try:
                    body = InferenceRequest.model_validate_json(body)
                except ValidationError as error:
                    raise InvalidInput(
                        f"the body is not a v2 inference request ({_problems(error.errors())}); {self.model.expected()}"
                    ) from None
        try:
            return super().decode(body, headers, *args, **kwargs)
        except InvalidInput as error:
            raise InvalidInput(f"{error.reason}; {self.model.expected()}") from None


def _problems(errors: Any) -> str:
    return "; ".join(f"{'.'.join(map(str, item['loc'])) or 'body'}: {item['msg']}" for item in list(errors)[:5])


class BodyLimit:
    """Refuses a request body over `limit` bytes with 413, before any of it reaches the model, naming the inputs of
    the signature its first bytes are for (`expected`, given them)."""

    def __init__(self, app: Any, limit: int, expected: Callable[[bytes], str]) -> None:
        self.app, self.limit, self.expected = app, limit, expected

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        declared = dict(scope.get("headers") or []).get(b"content-length")
        over = declared is not None and declared.isdigit() and int(declared) > self.limit
        # Read the whole body (chunked ones too) up to the limit, then hand it on as one message; one declared over
        # the limit only as far as its start, which says what it is for.
        chunks, size, more = [], 0, True
        while more and not (over and size >= SNIFFED_BYTES):
            message = await receive()
            if message["type"] != "http.request":
                await self.app(scope, _replay([message]), send)
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.limit:
                break
        if over or size > self.limit:
            await self._refuse(scope, send, int(declared) if over and declared else size, b"".join(chunks))
            return
        await self.app(scope, _replay([{"type": "http.request", "body": b"".join(chunks), "more_body": False}]), send)

    async def _refuse(self, scope: dict[str, Any], send: Any, size: int, start: bytes) -> None:
        message = (
            f"the request body ({size} bytes or more) is over this server's limit of {self.limit} bytes "
            f"(--max-request-bytes): send fewer examples per request; {self.expected(start[:SNIFFED_BYTES])}"
        )
        refusals.logged(f"{scope.get('method')} {scope.get('path')}", 413, message)
        body = json.dumps({"error": message}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 413, "headers": headers})
        await send({"type": "http.response.body", "body": body})


def _replay(messages: list[dict[str, Any]]) -> Any:
    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    return receive


def add_model_routes(app: FastAPI, model: SavedModelVersions, dataplane: DataPlane) -> None:
    """Routes registered before KServe's own for the same paths, so they answer: TF Serving's model status and the
    v2 model metadata with the class names."""

    async def model_status(model_name: str) -> JSONResponse:
        """KServe's v1 readiness ({"name", "ready"}) with TF Serving's model status beside it, so a client that polls
        either one reads what it expects."""
        if model_name != model.name:
            raise ModelNotFound(model_name)
        ok = {"error_code": "OK", "error_message": ""}
        served = {"version": str(model.served.version), "state": "AVAILABLE", "status": ok}
        # A version that did not load, as TF Serving reports one: ended, with its error (it is tried again).
        failed = [
            {"version": str(version), "state": "END", "status": {"error_code": "UNKNOWN", "error_message": why}}
            for version, why in sorted(model.watcher.failure_reports().items(), reverse=True)
        ]
        statuses = [*failed, served]
        return JSONResponse(content={"name": model_name, "ready": model.ready, "model_version_status": statuses})

    app.add_api_route("/v1/models/{model_name}", model_status, methods=["GET"])

    async def model_metadata(model_name: str) -> JSONResponse:
        """KServe's v2 model metadata with the served version's class names, which KServe's own route drops."""
        return JSONResponse(content=await dataplane.model_metadata(model_name))

    app.add_api_route("/v2/models/{model_name}", model_metadata, methods=["GET"])


def use_uvloop() -> None:
    """The loop ModelServer.start makes (asyncio.run) is uvloop's, where there is one (uvicorn[standard], which KServe
    requires, brings it on Linux and macOS). ModelServer first asks for the current loop (asyncio.get_event_loop), which
    uvloop's policy does not make by itself, so one is set."""
    try:
        import uvloop
    except ImportError:  # Windows: asyncio's own loop
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    asyncio.set_event_loop(asyncio.new_event_loop())


def serve(
    model: SavedModelVersions, http_port: int, grpc_port: int, max_request_bytes: int, max_concurrent_requests: int = 0
) -> None:
    """Loads the model's highest version, then serves REST (v1, v2, health, /metrics) and gRPC v2 until a signal;
    past max_concurrent_requests inference requests at once (0: no limit) a new one is refused at once."""
    model.load()
    # ModelServer reads the gRPC limits from its module's parsed arguments when it starts the gRPC server.
    kserve.model_server.args.grpc_max_receive_message_length = max_request_bytes
    kserve.model_server.args.grpc_max_send_message_length = max(max_request_bytes, MAX_GRPC_MESSAGE_LENGTH)
    server = kserve.ModelServer(
        http_port=http_port, grpc_port=grpc_port, enable_grpc=True, enable_latency_logging=False
    )
    server.dataplane = VersionedDataPlane(server.registered_models, model)
    app = kserve.model_server.app
    app.add_middleware(BodyLimit, limit=max_request_bytes, expected=model.expected_by_start)
    admission = Admission(max_concurrent_requests)
    app.add_middleware(RestAdmission, admission=admission)  # added last: it runs first, before the body is read
    refusals.install(app, functools.partial(ModelInferHandler, model, admission))

    async def malformed(request: Request, error: RequestValidationError) -> JSONResponse:
        return refusals.rest_answer(
            request, 400, f"the body is not a v2 inference request ({_problems(error.errors())}); {model.expected()}"
        )

    app.add_exception_handler(RequestValidationError, malformed)

    add_model_routes(app, model, server.dataplane)
    use_uvloop()
    log.info(
        "serving %s (version %d) from %s: REST on port %d, gRPC on port %d, %s, %s",
        model.name,
        model.served.version,
        model.base_path,
        http_port,
        grpc_port,
        describe(model.batching),
        f"refusing past {max_concurrent_requests} requests at once" if max_concurrent_requests else "no request limit",
    )
    server.start([model])
