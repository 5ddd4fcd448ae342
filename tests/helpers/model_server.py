"""The serving tests' real pieces: tiny models trained by the real trainer, a real `python -m trainer.serving`
process on free ports, and the export check record metrics.json carries once training checks its export."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import httpx

from scripts.common.ports import free_ports

ROOT = pathlib.Path(__file__).resolve().parents[2]
REGRESSION = ["--task-module", "examples.regression", "--task", "regression", "--dataset-module", "examples.regression"]
REGRESSION_DATA = ["--dataset", "linear_features", "--train-examples", "256", "--test-examples", "64"]
IMAGE_DATA = ["--dataset", "synthetic", "--train-examples", "128", "--test-examples", "64"]


def train(model_dir: pathlib.Path, *flags: str, timeout: float = 300) -> pathlib.Path:
    """One short real training run into model_dir; returns it."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "--epochs",
            "1",
            "--per-worker-batch-size",
            "32",
            "--model-dir",
            str(model_dir),
        ]
        + list(flags),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return model_dir


def add_export_check(model_dir: pathlib.Path, passed: bool = True) -> None:
    """The record the export check writes into metrics.json (its shape as the trainer writes it)."""
    path = model_dir / "metrics.json"
    record = json.loads(path.read_text())
    record.setdefault(
        "export_check",
        {"passed": passed, "examples": 64, "max_abs_diff": 0.0, "tolerance": 1e-5, "signature": "serve"},
    )
    path.write_text(json.dumps(record))


def copy_versions(model_dir: pathlib.Path, base_path: pathlib.Path) -> pathlib.Path:
    """A served base path holding the model dir's SavedModel as version 1."""
    (version,) = [path for path in (model_dir / "serving").iterdir() if path.name.isdigit()]
    base_path.mkdir(parents=True, exist_ok=True)
    shutil.copytree(version, base_path / "1")
    return base_path


def publish_version(source: pathlib.Path, base_path: pathlib.Path, version: int | str) -> None:
    """A new version, whole or not at all: copied beside the others under a hidden name, then renamed."""
    partial = base_path / f".{version}.partial"
    shutil.copytree(source, partial)
    os.replace(partial, base_path / str(version))


class ServerProcess:
    """`python -m trainer.serving` on free ports, ready before start() returns."""

    def __init__(self, base_path: pathlib.Path, name: str, log: pathlib.Path, *flags: str) -> None:
        self.rest_port, self.grpc_port = free_ports(2)
        self.name, self.log = name, log
        self.url = f"http://127.0.0.1:{self.rest_port}"
        self.grpc_target = f"127.0.0.1:{self.grpc_port}"
        command = [
            sys.executable,
            "-m",
            "trainer.serving",
            "--model-base-path",
            str(base_path),
            "--model-name",
            name,
            "--rest-port",
            str(self.rest_port),
            "--grpc-port",
            str(self.grpc_port),
            "--poll-seconds",
            "0.2",
            *flags,
        ]
        with log.open("w") as out:
            self.process = subprocess.Popen(command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout: float = 120) -> ServerProcess:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"the server exited {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/v2/models/{self.name}/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise AssertionError(f"the server was not ready in {timeout} s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
