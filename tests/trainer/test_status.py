"""The chief's status in one process: what counts as a restart, and a status server that idle clients cannot exhaust."""

import json
import socket
import time
import urllib.error
import urllib.request

import pytest

from trainer.artifacts.layout import ModelDir
from trainer.reporting import status


def leave_status(model_dir, **fields):
    with open(ModelDir(str(model_dir)).status, "w") as handle:
        json.dump(fields, handle)


@pytest.mark.parametrize(
    "previous, restarts",
    [
        ({"state": "running", "restarts": 0}, 1),  # killed mid-run: this start is a restart
        ({"state": "preempted", "restarts": 2}, 3),
        ({"state": "failed", "restarts": 0, "exit_code": 144}, 1),  # lost a peer: retryable, the pod is recreated
        ({"state": "failed", "restarts": 1, "exit_code": 2}, 0),  # a permanent failure ended that run
        ({"state": "failed", "restarts": 0, "exit_code": 1}, 0),
        ({"state": "succeeded", "restarts": 4}, 0),
    ],
)
def test_a_start_counts_as_a_restart_only_after_a_run_that_was_to_be_restarted(tmp_path, previous, restarts):
    leave_status(tmp_path, **previous)
    assert status.StatusReporter(ModelDir(str(tmp_path)), enabled=True).restarts == restarts


def test_a_failed_status_records_its_exit_code(tmp_path):
    reporter = status.StatusReporter(ModelDir(str(tmp_path)), enabled=True)
    reporter.failed("bad flag", exit_code=2)
    recorded = status.read_status(str(tmp_path))
    assert (recorded["state"], recorded["error"], recorded["exit_code"]) == ("failed", "bad flag", 2)


@pytest.fixture
def server(status_server):
    return status_server(IDLE_TIMEOUT_S=0.5, MAX_CONNECTIONS=3)


def test_the_status_server_closes_an_idle_connection(server):
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as idle:
        assert idle.recv(1) == b""  # the server hung up on a client that sent nothing


def test_the_status_server_bounds_its_concurrent_connections_and_still_answers_after(server):
    idle = [socket.create_connection(("127.0.0.1", server.port), timeout=30) for _ in range(3)]
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as extra:
            extra.sendall(b"GET /status HTTP/1.0\r\n\r\n")
            answer = extra.recv(200)
        assert answer.startswith(b"HTTP/1.0 503"), answer  # refused at once, no thread held for it
    finally:
        for connection in idle:
            connection.close()
    assert answered_after_release(server.port)["global_step"] == 7


def answered_after_release(port, attempts=100):
    """/status once the closed connections' threads have let go of their slots (they notice the close at once)."""
    for _ in range(attempts):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=30) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            assert error.code == 503
            time.sleep(0.05)
    raise AssertionError("the status server never freed its slots")
