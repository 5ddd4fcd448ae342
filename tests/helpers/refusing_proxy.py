"""An HTTP proxy on 127.0.0.1 that refuses every request with 403 at once, as a locked-down network does: TFDS's
download then fails on its first request, where a missing network would retry for minutes."""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Iterator


class _Refuse(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_CONNECT = do_GET  # noqa: N815 (http.server's name)

    def log_message(self, *args: object) -> None:
        pass


# The default dataset's preparation, as the data Job runs it: TFDS's own code up to the download.
PREPARE_DEFAULT_DATASET = ("trainer.data", "--dataset", "fashion_mnist", "--data-dir")


@contextlib.contextmanager
def refused_downloads() -> Iterator[dict[str, str]]:
    """HTTP_PROXY and HTTPS_PROXY naming the proxy, while the block runs."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Refuse)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        yield {"HTTP_PROXY": url, "HTTPS_PROXY": url}
    finally:
        server.shutdown()
        server.server_close()
