"""How a refused or failed request is answered and logged, over REST and gRPC alike.

A refusal (a bad request: 4xx or gRPC INVALID_ARGUMENT and kin; a full queue: 503 or RESOURCE_EXHAUSTED) is one log
line with its status and reason, and no traceback: it is the client's problem, or a full server doing its job, and
a burst of them must not bury the log. A 5xx that is the server's own failure keeps KServe's traceback, logged once;
the requests of a failed joined model call each get one line, the call's traceback having been logged by the
batcher.

KServe 0.21.0 logs a traceback for every refusal, a timing line per REST request (its TimingMiddleware, which
/metrics' request histograms repeat) and a line per gRPC call, and it builds its REST exception handlers and gRPC
interceptors only when its servers start, from its own module names. So `install` names ours there, before they
start, and drops the access line of a request whose refusal already logged its own.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import kserve.protocol.grpc.server
import kserve.protocol.rest.server
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from grpc.aio import ServerInterceptor
from kserve.errors import InvalidInput, ModelNotFound, ModelNotReady
from kserve.protocol.grpc.interceptors import ExceptionToStatusInterceptor
from starlette.exceptions import HTTPException

from trainer.serving.batching import JoinedCallFailed, QueueFull

log = logging.getLogger(__name__)

# The seconds a shed client should wait before it retries: the smallest Retry-After HTTP can say.
RETRY_AFTER_SECONDS = 1
# Per gRPC status, the refusals a client caused (one line each, at WARNING) and, last, the joined call that failed.
GRPC_STATUS: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (InvalidInput, grpc.StatusCode.INVALID_ARGUMENT),
    (ModelNotFound, grpc.StatusCode.NOT_FOUND),
    (ModelNotReady, grpc.StatusCode.UNAVAILABLE),
    (QueueFull, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (JoinedCallFailed, grpc.StatusCode.INTERNAL),
)
# Set while a REST request's refusal has logged its line: the access log then leaves that request out.
_LOGGED = contextvars.ContextVar("refusal_logged", default=False)


def logged(where: str, status: int | str, reason: str) -> None:
    """The one line of a refused or failed request."""
    if status == 500 or status == grpc.StatusCode.INTERNAL.name:
        log.error("%s failed with %s: %s", where, status, reason)
    else:
        log.warning("%s refused with %s: %s", where, status, reason)
    _LOGGED.set(True)


def rest_answer(request: Request, status: int, reason: str, headers: dict[str, str] | None = None) -> JSONResponse:
    logged(f"{request.method} {request.url.path}", status, reason)
    return JSONResponse(status_code=status, content={"error": reason}, headers=headers)


def rest_handler(status: int, headers: dict[str, str] | None = None) -> Callable[..., Awaitable[JSONResponse]]:
    async def handle(request: Request, error: Exception) -> JSONResponse:
        return rest_answer(request, status, str(error), headers)

    return handle


async def http_exception(request: Request, error: HTTPException) -> JSONResponse:
    """Starlette's own (a path no route serves: 404; a method it does not take: 405), in its own form."""
    logged(f"{request.method} {request.url.path}", error.status_code, str(error.detail))
    return JSONResponse(status_code=error.status_code, content={"detail": error.detail}, headers=error.headers)


class RefusalsToStatus(ExceptionToStatusInterceptor):
    """KServe's gRPC exception mapping, with one line and the right status for each refusal."""

    async def handle_exception(self, ex: Exception, request_or_iterator: Any, context: Any, method_name: str) -> None:
        for kind, code in GRPC_STATUS:
            if isinstance(ex, kind):
                reason = str(ex)
                logged(f"gRPC {method_name}", code.name, reason)
                await context.abort(code, reason)
        await super().handle_exception(ex, request_or_iterator, context, method_name)


class _SkipLoggedRefusals(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _LOGGED.get()


def install(app: FastAPI, first_interceptor: Callable[[], ServerInterceptor]) -> None:
    """Before ModelServer starts: KServe registers these handlers and interceptors as its servers start.
    `first_interceptor` makes the gRPC interceptor KServe puts first, in place of its per-call "grpc method" log line
    (/metrics counts the calls, and a refusal has its own line): the ModelInfer handler
    (trainer/serving/grpc_infer.py)."""
    kserve.protocol.rest.server.invalid_input_handler = rest_handler(400)
    kserve.protocol.rest.server.model_not_found_handler = rest_handler(404)
    kserve.protocol.rest.server.model_not_ready_handler = rest_handler(503)
    kserve.protocol.grpc.server.ExceptionToStatusInterceptor = RefusalsToStatus
    kserve.protocol.grpc.server.LoggingInterceptor = first_interceptor
    app.add_exception_handler(QueueFull, rest_handler(503, {"Retry-After": str(RETRY_AFTER_SECONDS)}))
    app.add_exception_handler(JoinedCallFailed, rest_handler(500))
    app.add_exception_handler(HTTPException, http_exception)  # type: ignore[arg-type]
    logging.getLogger("uvicorn.access").addFilter(_SkipLoggedRefusals())
    logging.getLogger("kserve.trace").setLevel(logging.WARNING)
