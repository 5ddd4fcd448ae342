"""The HTTP side of the fake Kubernetes API servers that the submit tests put behind the real clients: each test
module writes the answers (a FakeAPIServer with `answer(...)`), this serves them on 127.0.0.1, and FakeClock lets
a follower's waits and retries run without sleeping."""

from __future__ import annotations

import http.server
import json
import threading
import urllib.parse
from collections.abc import Callable
from typing import Any

DROP = "drop"  # an answer that closes the connection without a response

# (method, path, query, JSON body or None) -> (status code, JSON-able payload or text) or DROP
Answer = Callable[[str, str, str, Any], Any]


def list_pods_or_services(api: Any, path: str, pods_path: str, pod: Callable[[str], dict]) -> tuple[int, dict]:
    """The answer to a pod or service listing of a fake server `api` with `pods`, `services`, `deleting` and
    `pods_gone_after`: once the job is being deleted, both are gone after that many pod listings."""
    if path == pods_path and api.deleting:
        api.pods_gone_after -= 1
        if api.pods_gone_after <= 0:
            api.pods, api.services = [], []
    names = api.pods if path == pods_path else api.services
    items = [pod(name) if path == pods_path else {"metadata": {"name": name}} for name in names]
    return 200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": items}


def serve(answer: Answer) -> http.server.ThreadingHTTPServer:
    """An HTTP/1.1 server on a free 127.0.0.1 port answering every GET, POST and DELETE with `answer`."""

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _handle(self):
            url = urllib.parse.urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length)) if length else None
            result = answer(self.command, url.path, urllib.parse.unquote(url.query), body)
            if result == DROP:
                self.close_connection = True
                return
            code, payload = result
            data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._handle()

        def do_POST(self):
            self._handle()

        def do_DELETE(self):
            self._handle()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class FakeClock:
    """time.monotonic and time.sleep for a follower: sleeping moves the clock at once."""

    def __init__(self):
        self.now = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
