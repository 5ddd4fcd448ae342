"""Launches real trainer processes as a local training group, with TF_CONFIG on 127.0.0.1 ports."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from scripts.common.ports import free_ports
from scripts.common.processes import signal_group
from trainer.reporting import status

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclasses.dataclass
class Finished:
    name: str
    returncode: int
    output: str


def tf_config(cluster: dict[str, list[str]], task_type: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}, "environment": "cloud"})


def worker_cluster(workers: int) -> dict[str, list[str]]:
    return {"worker": [f"127.0.0.1:{port}" for port in free_ports(workers)]}


def start(
    args: Sequence[str],
    tf_config_text: str | None,
    env: dict[str, str] | None = None,
    module: str = "trainer",
    wrapper: Sequence[str] = (),
) -> subprocess.Popen:
    """`python -m module args`, with TF_CONFIG when given; `wrapper` runs it under a command such as strace."""
    environ = {**os.environ, **(env or {})}
    environ.pop("TF_CONFIG", None)
    if tf_config_text is not None:
        environ["TF_CONFIG"] = tf_config_text
    environ["PYTHONPATH"] = os.pathsep.join(
        [ROOT, os.path.join(ROOT, "tests", "helpers"), environ.get("PYTHONPATH", "")]
    )
    return subprocess.Popen(
        [*wrapper, sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=environ,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def wait_all(processes: dict[str, subprocess.Popen], timeout: float) -> dict[str, Finished]:
    """Waits for every process; on timeout kills them all (their process groups) and fails loudly."""
    finished = {}
    try:
        for name, process in processes.items():
            output, _ = process.communicate(timeout=timeout)
            finished[name] = Finished(name, process.returncode, output)
    except subprocess.TimeoutExpired:
        for process in processes.values():
            if process.poll() is None:
                signal_group(process.pid, signal.SIGKILL)
        outputs = {name: process.communicate()[0][-3000:] for name, process in processes.items()}
        raise AssertionError(f"group did not finish within {timeout} s; last output: {outputs}") from None
    return finished


def run_group(
    workers: int, args: Sequence[str], timeout: float = 240, env: dict[str, str] | None = None, module: str = "trainer"
) -> dict[str, Finished]:
    """Runs `workers` processes of `python -m module args` as worker-0..N-1 and waits for all."""
    cluster = worker_cluster(workers)
    processes = {f"worker-{i}": start(args, tf_config(cluster, "worker", i), env, module) for i in range(workers)}
    return wait_all(processes, timeout)


def async_cluster(workers: int, ps: int) -> dict[str, list[str]]:
    """A chief, `workers` workers and `ps` parameter servers on free 127.0.0.1 ports."""
    ports = [f"127.0.0.1:{port}" for port in free_ports(1 + workers + ps)]
    return {"chief": ports[:1], "worker": ports[1 : 1 + workers], "ps": ports[1 + workers :]}


def start_servers(
    cluster: dict[str, list[str]], args: Sequence[str] = (), env: dict[str, str] | None = None
) -> dict[str, subprocess.Popen]:
    """Every worker and ps task of an async cluster (they serve until stopped)."""
    return {
        f"{kind}-{i}": start(args, tf_config(cluster, kind, i), env)
        for kind in ("ps", "worker")
        for i in range(len(cluster.get(kind, ())))
    }


def stop_servers(servers: dict[str, subprocess.Popen], read: bool = True) -> dict[str, str]:
    """SIGTERMs the serving tasks (as the operator's cleanPodPolicy does) and returns their output (unless another
    reader owns it)."""
    for process in servers.values():
        if process.poll() is None:
            signal_group(process.pid, signal.SIGTERM)
    if not read:
        return {name: str(process.wait(timeout=30)) for name, process in servers.items()}
    return {name: process.communicate(timeout=30)[0] for name, process in servers.items()}


class OutputFollower:
    """Collects a process's output lines in a thread, so a test can wait for a line while the process runs."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.process = process
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float = 180) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = [line for line in self.lines if text in line]
            if found:
                return found[0]
            if self.process.poll() is not None and not self._thread.is_alive():
                break
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not printed; last output: {''.join(self.lines)[-3000:]}")

    def output(self) -> str:
        self._thread.join(timeout=30)
        return "".join(self.lines)


def trainer_flags(**values: object) -> list[str]:
    """The trainer's command-line flags for keyword arguments: trainer_flags(train_examples=64) is
    ["--train-examples", "64"]."""
    return [part for name, value in values.items() for part in (f"--{name.replace('_', '-')}", str(value))]


def wait_for_step(model_dir: object, at_least: int, process: subprocess.Popen, timeout: float = 180) -> int:
    """Waits until the run's status shows `at_least` global steps (the process must still be running); returns the
    step it shows."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[0][-3000:]
        try:
            step = status.read_status(str(model_dir)).get("global_step") or 0
        except (OSError, ValueError):
            step = 0
        if step >= at_least:
            return step
        time.sleep(0.05)
    raise AssertionError(f"step {at_least} not reached in {timeout} s")


def run_python(code: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`python -c code` in a fresh interpreter from the repository root, its output captured as text."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout
    )


def python_prints(code: str, env: dict[str, str]) -> str:
    """What `python -c code` prints (stripped); the run must succeed."""
    result = run_python(code, env)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()
