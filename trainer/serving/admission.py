"""The admission limit at the transport (`--max-concurrent-requests`): past this many inference requests in the
server at once, over REST and gRPC together, a new one is refused as soon as its transport hands it over, before
KServe decodes it and before it queues behind the requests already in.

Why at the transport: under overload the cost of a request is the event loop's, not the model's. The batcher's own
limit (`--max-queued-examples`) sees a request only once KServe has decoded it, and by then it has waited its turn
behind every request ahead of it in the loop, so a shed answer took as long as an admitted one. Here a request is
counted from the moment its transport (the REST middleware; for gRPC, the ModelInfer handler in
trainer/serving/grpc_infer.py) runs for it to the moment its answer is handed back, and refused with one comparison
when the count is at the limit: REST 503 with Retry-After, gRPC RESOURCE_EXHAUSTED, each with a message naming the
limit and the fix. Health, readiness, metadata and /metrics are never counted nor refused: the server is healthy,
only full.

REST and gRPC share one event loop in this server (KServe's ModelServer with one worker), so one plain counter holds
both, with no lock.
"""

from __future__ import annotations

import json
from typing import Any

from prometheus_client import Counter, Gauge

from trainer.serving import refusals
from trainer.serving.batching import REQUESTS_SHED

# REST inference: a POST to a model's path (v1 :predict and :explain, v2 /infer); GETs (health, readiness, metadata,
# /metrics, TF Serving's model status) are never refused.
REST_INFER_PREFIXES = ("/v1/models/", "/v2/models/")

IN_FLIGHT = Gauge("serving_requests_in_flight", "inference requests in the server now, over REST and gRPC together")
SHED_AT_ADMISSION = Counter(
    "serving_requests_shed_at_admission_total",
    "requests refused by --max-concurrent-requests before they were decoded (in serving_requests_shed_total too)",
)


class Admission:
    """The count of inference requests in the server, against its limit (0: no limit, counted all the same)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        IN_FLIGHT.set_function(lambda: self.in_flight)  # read when /metrics is scraped, not set per request

    @property
    def full(self) -> bool:
        return 0 < self.limit <= self.in_flight

    def enter(self) -> None:
        self.in_flight += 1

    def leave(self) -> None:
        self.in_flight -= 1

    def refusal(self) -> str:
        """The reason a refused request is given (and logged); counts the refusal."""
        REQUESTS_SHED.inc()
        SHED_AT_ADMISSION.inc()
        return (
            f"the server is full: it holds {self.limit} requests at once, its limit (--max-concurrent-requests); retry "
            f"shortly, or send from fewer clients at once"
        )


class RestAdmission:
    """ASGI middleware: an inference request past the limit gets 503 with Retry-After at once; others pass."""

    def __init__(self, app: Any, admission: Admission) -> None:
        self.app, self.admission = app, admission

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith(REST_INFER_PREFIXES):
            await self.app(scope, receive, send)
            return
        admission = self.admission
        if admission.full:
            reason = admission.refusal()
            refusals.logged(f"POST {scope['path']}", 503, reason)
            body = json.dumps({"error": reason}).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", str(refusals.RETRY_AFTER_SECONDS).encode()),
            ]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        admission.enter()
        try:
            await self.app(scope, receive, send)
        finally:
            admission.leave()
