"""The chief's state files and status server against what a shared cluster can throw at them: files of the wrong
shape (valid JSON, wrong type) count as absent or are refused with a message, never a traceback; NaN is written as
null; writes reach the disk before they count; slow clients cannot hold the status server's slots."""

import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from multiworker import ROOT, free_ports
from trainer.artifacts import checkpoint
from trainer.artifacts.layout import ModelDir
from trainer.base import atomic_file
from trainer.base.errors import ModelDirError
from trainer.reporting import status


def strict_json(text):
    """JSON as the standard has it: NaN and Infinity are not JSON."""
    return json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} is not JSON"))


@pytest.mark.parametrize(
    "text, restarts",
    [("[1, 2]", 0), ('"running"', 0), ("7", 0), ("null", 0), ('{"state": "running", "restarts": "many"}', 1)],
)
def test_a_status_file_of_the_wrong_shape_counts_as_none_without_a_traceback(tmp_path, text, restarts):
    with open(ModelDir(str(tmp_path)).status, "w") as handle:
        handle.write(text)
    reporter = status.StatusReporter(ModelDir(str(tmp_path)), enabled=True)
    assert reporter.restarts == restarts  # a run killed mid-way, whose count is unreadable, is restart 1
    reporter.update(state="running")
    assert status.read_status(str(tmp_path))["state"] == "running"


def test_the_status_tool_says_a_file_of_the_wrong_shape_is_not_a_status(tmp_path):
    (tmp_path / "status.json").write_text("[1, 2]")
    result = subprocess.run(
        [sys.executable, "-m", "trainer.reporting.status", str(tmp_path)], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 1 and "is not a trainer status" in result.stderr
    assert "Traceback" not in result.stderr


def test_nan_is_written_as_null_in_the_file_and_over_http(tmp_path):
    reporter = status.StatusReporter(ModelDir(str(tmp_path)), enabled=True)
    reporter.serve("127.0.0.1", free_ports(1)[0])
    try:
        reporter.update(state="running", loss=float("nan"), eta_seconds=float("inf"), test_loss=0.5)
        written = strict_json(open(ModelDir(str(tmp_path)).status).read())
        with urllib.request.urlopen(f"http://127.0.0.1:{reporter.port}/status", timeout=30) as response:
            served = strict_json(response.read().decode())
    finally:
        reporter.close()
    for answer in (written, served):
        assert (answer["loss"], answer["eta_seconds"], answer["test_loss"]) == (None, None, 0.5)
    assert math.isnan(reporter.snapshot()["loss"])  # the live value stays what it is; only JSON spells it null


@pytest.fixture
def flushed(monkeypatch):
    """Every os.fsync from here on, as the path its descriptor is open on (the kernel's /proc/self/fd link) and
    the flush itself done, so the writes really reach the disk."""
    calls = []
    real_fsync = os.fsync

    def fsync(descriptor):
        calls.append(os.readlink(f"/proc/self/fd/{descriptor}"))
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    return calls


def test_an_atomic_write_flushes_the_file_before_the_rename_and_the_directory_after(tmp_path, flushed):
    target = tmp_path / "run-setup.json"
    with atomic_file.replaced_on_success(str(target)) as partial:
        with open(partial, "w") as handle:
            json.dump({"workers": 2}, handle)
        assert flushed == []
    # The partial file while it had its own name (the rename came after), then the directory holding the new name.
    assert flushed == [partial, str(tmp_path)]
    atomic_file.write_json(str(target), {"workers": 3})
    (written, directory) = flushed[2:]
    assert os.path.basename(written).startswith(".run-setup.partial-") and directory == str(tmp_path)
    assert json.loads(target.read_text()) == {"workers": 3}


def test_a_saved_models_every_file_and_directory_is_flushed_before_the_rename(tmp_path, flushed):
    target = tmp_path / "export"
    tree = ["saved_model.pb", "fingerprint.pb", "variables/variables.index", "variables/variables.data-00000-of-00001"]
    for version in ("old", "new"):
        flushed.clear()
        with atomic_file.replaced_on_success(str(target)) as partial:
            for name in tree:
                os.makedirs(os.path.join(partial, os.path.dirname(name)), exist_ok=True)
                with open(os.path.join(partial, name), "w") as handle:
                    handle.write(version)
            os.makedirs(os.path.join(partial, "assets"))
        *inside, directory = flushed
        assert directory == str(tmp_path)  # the rename, once the tree is on the disk
        relative = sorted(os.path.relpath(path, partial) for path in inside)
        assert relative == sorted([*tree, ".", "variables", "assets"])
        assert all(path.startswith(partial) for path in inside)  # each before the tree had its final name
        assert (target / "saved_model.pb").read_text() == version


def leave_checkpoints(model_dir, run_setup_text):
    layout = ModelDir(str(model_dir))
    os.makedirs(layout.checkpoints)
    open(os.path.join(layout.checkpoints, "ckpt-8.index"), "w").close()
    with open(layout.run_setup, "w") as handle:
        handle.write(run_setup_text)


@pytest.mark.parametrize(
    "text, problem",
    [
        ("[1, 2]", "expected an object, found list"),
        ('[["workers", 2]]', "expected an object, found list"),
        ('"setup"', "expected an object, found str"),
        ('{"global_batch_size": "128"}', "global_batch_size is '128', not a whole number"),
        ('{"workers": 2.5}', "workers is 2.5, not a whole number"),
    ],
)
def test_a_run_setup_of_the_wrong_shape_is_refused_naming_the_fix(tmp_path, text, problem):
    leave_checkpoints(tmp_path, text)
    with pytest.raises(ModelDirError) as refused:
        checkpoint.recorded_run_setup(ModelDir(str(tmp_path)))
    assert problem in str(refused.value) and "delete it to resume" in str(refused.value)


@pytest.fixture
def slow_server(status_server):
    return status_server(IDLE_TIMEOUT_S=1.0, REQUEST_DEADLINE_S=2.0, MAX_CONNECTIONS=3)


def drip(connections, stop):
    """A slowloris: one byte of a request on every connection, each well within the idle timeout, until stopped."""
    while not stop.is_set():
        for connection in connections:
            try:
                connection.sendall(b"G")
            except OSError:
                pass  # cut off by the server
        stop.wait(0.3)


def test_clients_sending_a_byte_at_a_time_cannot_hold_every_slot(slow_server):
    connections = [socket.create_connection(("127.0.0.1", slow_server.port), timeout=30) for _ in range(3)]
    stop = threading.Event()
    dripper = threading.Thread(target=drip, args=(connections, stop), daemon=True)
    dripper.start()
    try:
        answered = None
        for _ in range(200):  # each slow request is cut off at the deadline, whatever it still sends
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{slow_server.port}/status", timeout=30) as response:
                    answered = json.load(response)
                    break
            except urllib.error.HTTPError as error:
                assert error.code == 503
                time.sleep(0.05)
        assert answered is not None and answered["global_step"] == 7, "slow clients held every slot"
        for connection in connections:
            connection.settimeout(30)
            assert connection.recv(1) == b""  # the server hung up on each
    finally:
        stop.set()
        dripper.join()
        for connection in connections:
            connection.close()


def test_one_client_address_gets_at_most_its_share_of_the_slots(tmp_path, monkeypatch):
    monkeypatch.setattr(status, "MAX_PER_CLIENT", 2)
    reporter = status.StatusReporter(ModelDir(str(tmp_path)), enabled=True)
    reporter.serve("127.0.0.1", free_ports(1)[0])
    held = [socket.create_connection(("127.0.0.1", reporter.port), timeout=30) for _ in range(2)]
    try:
        # Accepted in order: the first two hold this address's share when the third arrives.
        with socket.create_connection(("127.0.0.1", reporter.port), timeout=30) as third:
            third.sendall(b"GET /status HTTP/1.0\r\n\r\n")
            assert third.recv(200).startswith(b"HTTP/1.0 503")
    finally:
        for connection in held:
            connection.close()
        reporter.close()
