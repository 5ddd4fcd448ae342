"""Live status from the chief: status.json on the volume, /status and /metrics over HTTP.

The chief is the group's reporting authority: it writes `<model-dir>/status.json`
atomically at every log interval and state change, and serves the same JSON at
GET /status and Prometheus metrics at GET /metrics. Other workers report nothing.

`python -m trainer.reporting.status <model-dir or http://host:port>` prints a one-screen view.
"""

from __future__ import annotations

import argparse
import datetime
import http.server
import json
import os
import socket
import sys
import threading
import urllib.request
from typing import Any

import prometheus_client

from trainer.artifacts.layout import STATUS, ModelDir
from trainer.base.atomic_file import json_safe, write_json
from trainer.base.errors import StatusPortError

STATES = ("starting", "running", "preempted", "succeeded", "failed", "diverged")


def _restarts_so_far(path: str) -> int:
    """A status file left by a run that was to be restarted (killed, preempted, or failed with a retryable exit
    code, >= 128) means this start is a restart of that run; after a success or a permanent failure it is a new run."""
    try:
        previous = read_status(path)
    except (OSError, ValueError):
        return 0  # none, or not a status (read_status says which): this start counts as a new run
    state, exit_code = previous.get("state"), previous.get("exit_code")
    if state in ("succeeded", "diverged") or (
        state == "failed" and not (isinstance(exit_code, int) and exit_code >= 128)
    ):
        return 0
    restarts = previous.get("restarts")
    return (restarts if isinstance(restarts, int) and not isinstance(restarts, bool) and restarts >= 0 else 0) + 1


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


class StatusReporter:
    """Keeps the chief's status; a disabled reporter (non-chief workers) does nothing."""

    def __init__(self, model_dir: ModelDir, enabled: bool) -> None:
        self.path = model_dir.status
        self.enabled = enabled
        self.restarts = _restarts_so_far(self.path) if enabled else 0
        self._lock = threading.Lock()
        self._status: dict[str, Any] = {
            "state": "starting",
            "started_at": _now(),
            "updated_at": _now(),
            "restarts": self.restarts,
        }
        self._registry = prometheus_client.CollectorRegistry()
        gauge = self._gauge
        # The task's metrics (loss, test_loss and each of metric_names with its test_ twin) get their gauges when
        # first reported: trainer_<name> and trainer_test_<name>, e.g. trainer_loss and trainer_test_loss.
        self._gauges = {
            "global_step": gauge("global_step", "Training steps finished by the group"),
            "total_steps": gauge("total_steps", "Steps the run will take in all"),
            "epoch": gauge("epoch", "Current epoch, 1-based"),
            "examples_per_second": gauge("examples_per_second", "Training throughput of the whole group"),
            "eta_seconds": gauge("eta_seconds", "Estimated seconds until training ends"),
            "workers": gauge("workers", "Workers training together"),
            "restarts": gauge("restarts", "Times the chief started again before the run succeeded"),
            "checkpoint_step": gauge("checkpoint_step", "Step of the newest checkpoint: where a restart resumes"),
        }
        self._state = prometheus_client.Enum("trainer_state", "Run state", states=list(STATES), registry=self._registry)
        self._server: http.server.ThreadingHTTPServer | None = None

    def _gauge(self, name: str, doc: str) -> prometheus_client.Gauge:
        return prometheus_client.Gauge(f"trainer_{name}", doc, registry=self._registry)

    def serve(self, host: str, port: int) -> None:
        """Starts answering /status and /metrics (not while the group forms: that wait holds the GIL)."""
        if self.enabled and port:
            try:
                self._server = _serve(self, host, port)
            except OSError as error:
                raise StatusPortError(
                    f"--status-port {port} on --status-host {host} cannot be bound "
                    f"({error.strerror}); choose a free port, or 0 to turn the server off"
                ) from None

    @property
    def port(self) -> int | None:
        return self._server.server_address[1] if self._server else None

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._status)

    def metrics_text(self) -> bytes:
        return prometheus_client.generate_latest(self._registry)

    def update(self, **fields: Any) -> None:
        """Merges fields into the status, then writes status.json atomically."""
        if not self.enabled:
            return
        if "state" in fields and fields["state"] not in STATES:
            raise ValueError(f"unknown state {fields['state']!r}")
        with self._lock:
            self._status.update(fields, updated_at=_now())
            status = dict(self._status)
            for name in status.get("metric_names", ()):
                for key, doc in ((name, "the current epoch's running training"), (f"test_{name}", "the last test")):
                    if key not in self._gauges:
                        self._gauges[key] = self._gauge(key, f"{name}: {doc} value")
        for name, gauge in self._gauges.items():
            if isinstance(status.get(name), (int, float)):
                gauge.set(status[name])
        self._state.state(status["state"])
        write_json(self.path, status)

    def failed(self, error: str, exit_code: int, state: str = "failed") -> None:
        """The run stops with this error and exit code; the next start reads the code to tell a restart (>= 128:
        the operator recreates the pod) from a new run after a permanent failure."""
        try:
            self.update(state=state, error=error, exit_code=int(exit_code))
        except OSError as write_error:  # e.g. the full volume that ended the run: the exit code still says it
            print(f"warning: cannot record the failure in {self.path}: {write_error}", file=sys.stderr)

    def close(self) -> None:
        if self._server:
            self._server.shutdown()
            self._server.server_close()


# A client that connects and sends nothing is dropped after this long, and at most this many are served at once (the
# others get 503 at once): each connection holds a thread and a file descriptor of the chief while it lasts.
IDLE_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 16
# The whole request, from connecting to the last byte of the answer: a client sending a byte at a time, each within
# IDLE_TIMEOUT_S, is cut off here, so slow clients cannot hold every slot for long.
REQUEST_DEADLINE_S = 15.0
# At most this many of the slots for one client address, so one slow host cannot hold them all.
MAX_PER_CLIENT = 4


class _BoundedServer(http.server.ThreadingHTTPServer):
    """A threading HTTP server with at most MAX_CONNECTIONS connections open at once."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        super().__init__(address, handler)
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._per_client: dict[str, int] = {}
        self._per_client_lock = threading.Lock()

    def _take(self, client: str) -> bool:
        with self._per_client_lock:
            if self._per_client.get(client, 0) >= MAX_PER_CLIENT:
                return False
            if not self._slots.acquire(blocking=False):
                return False
            self._per_client[client] = self._per_client.get(client, 0) + 1
            return True

    def _give_back(self, client: str) -> None:
        with self._per_client_lock:
            self._per_client[client] -= 1
            if not self._per_client[client]:
                del self._per_client[client]
            self._slots.release()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._take(client_address[0]):
            try:
                request.sendall(b"HTTP/1.0 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n")
            except OSError:
                pass  # the client is gone already
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._give_back(client_address[0])


def _serve(reporter: StatusReporter, host: str, port: int) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        timeout = IDLE_TIMEOUT_S  # a read that waits longer closes the connection

        def setup(self) -> None:
            super().setup()
            # The per-read timeout restarts with every byte; this bounds the connection as a whole.
            self._deadline = threading.Timer(REQUEST_DEADLINE_S, self._cut_off)
            self._deadline.daemon = True
            self._deadline.start()

        def _cut_off(self) -> None:
            try:
                self.connection.shutdown(socket.SHUT_RDWR)  # the blocked read returns and the handler ends
            except OSError:
                pass  # already closed

        def finish(self) -> None:
            self._deadline.cancel()
            try:
                super().finish()
            except OSError:
                pass  # cut off at the deadline: nothing more to flush

        def do_GET(self) -> None:
            route = self.path.split("?")[0]
            if route == "/status":
                status = json_safe(reporter.snapshot())
                body, kind = json.dumps(status, indent=2, allow_nan=False).encode(), "application/json"
            elif route == "/metrics":
                body, kind = reporter.metrics_text(), prometheus_client.CONTENT_TYPE_LATEST
            else:
                self.send_error(404, "try /status or /metrics")
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass  # a scrape every few seconds would drown the training log

    server = _BoundedServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="status-server", daemon=True).start()
    return server


def read_status(source: str) -> dict[str, Any]:
    """Reads the status from a model directory, a status.json path or a http(s):// URL."""
    if source.startswith(("http://", "https://")):
        url = source.rstrip("/")
        url = url if url.endswith("/status") else url + "/status"
        with urllib.request.urlopen(url, timeout=10) as response:
            status = json.load(response)
        if not isinstance(status, dict):
            raise ValueError(f"{url} answered {type(status).__name__}, not a status object")
        return status
    path = ModelDir(source).status if os.path.isdir(source) else source
    with open(path) as handle:
        status = json.load(handle)
    if not isinstance(status, dict):
        raise ValueError(f"{path} holds {type(status).__name__}, not a status object")
    return status


def render(status: dict[str, Any]) -> str:
    """A one-screen human view of a status."""

    def number(key: str, fmt: str) -> str:
        value = status.get(key)
        return format(value, fmt) if isinstance(value, (int, float)) else "-"

    def metrics(prefix: str) -> str:
        names = status.get("metric_names") or ["loss"]
        return "  ".join(f"{name} {number(prefix + name, '.4f')}" for name in names)

    step, total = status.get("global_step"), status.get("total_steps")
    done = f"{100 * step / total:.1f}%" if isinstance(step, int) and total else "-"
    eta = status.get("eta_seconds")
    eta_text = str(datetime.timedelta(seconds=round(eta))) if isinstance(eta, (int, float)) else "-"
    lines = [
        f"state        {status.get('state', '-')}" + (f" ({status['error']})" if status.get("error") else ""),
        f"progress     epoch {status.get('epoch', '-')}/{status.get('epochs', '-')}, "
        f"step {step if step is not None else '-'}/{total or '-'} ({done}), ETA {eta_text}",
        f"training     {metrics('')}",
        f"test         {metrics('test_')}",
        f"throughput   {number('examples_per_second', ',.0f')} examples/s",
        f"group        {status.get('workers', '-')} worker(s), {status.get('restarts', 0)} restart(s)",
        f"times        started {status.get('started_at', '-')}, updated {status.get('updated_at', '-')}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.reporting.status",
        description="Show a training run's live status, as the chief reports it.",
    )
    parser.add_argument("source", help="the run's --model-dir, its status.json, or the chief's http://host:port")
    parser.add_argument("--json", action="store_true", help="print the raw JSON instead")
    args = parser.parse_args(argv)
    try:
        status = read_status(args.source)
    except FileNotFoundError:
        print(f"error: no {STATUS} at {args.source}: has the chief started with this --model-dir?", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"error: cannot read the status from {args.source}: {error}", file=sys.stderr)
        return 1
    except ValueError:
        print(f"error: {args.source} is not a trainer status (expected the JSON of {STATUS})", file=sys.stderr)
        return 1
    print(json.dumps(status, indent=2) if args.json else render(status))
    return 0


if __name__ == "__main__":
    sys.exit(main())
