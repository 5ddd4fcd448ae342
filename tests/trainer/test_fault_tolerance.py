"""The chief as the group's persistence and reporting authority: resume after failures, live status.

Group failures run the project's TFJob manifest through the local runner (python -m scripts.localrun.run_local), which
restarts replicas as the Kubeflow operator does under restartPolicy ExitCode.
"""

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from local_runner import digests, finish, job_model_dir, replica, start_runner
from multiworker import ROOT, free_ports, start, wait_all, wait_for_step
from trainer.artifacts import layout
from trainer.reporting import status

CHECKPOINT_EVERY = 20
# 6400 examples / global batch 64 = 100 steps per epoch, 3 epochs: long enough to strike mid-run.
RUN = [
    "--train-examples",
    "6400",
    "--test-examples",
    "500",
    "--per-worker-batch-size",
    "32",
    "--checkpoint-every",
    str(CHECKPOINT_EVERY),
    "--log-every",
    "16",
    "--steps-per-loop",
    "4",
]
TOTAL_STEPS = 300
RUNNER_ARGS = ["--workers", "2", "--dataset", "synthetic", "--epochs", "3"]


def trainer_args():
    """RUN, and the live status on a free port."""
    return [*RUN, "--status-port", str(free_ports(1)[0]), "--status-host", "127.0.0.1"]


def work_redone(output, resumed_from_step):
    """Steps the group had finished when it broke, minus the step it resumed from."""
    lost = [int(step) for step in re.findall(r"lost the group after step (\d+)", output)]
    assert lost, output[-3000:]
    return max(lost) - resumed_from_step


@pytest.mark.slow
@pytest.mark.parametrize("victim", ["worker-1", "worker-0"])
def test_a_killed_worker_costs_at_most_one_checkpoint_interval(tmp_path, victim):
    runner = start_runner(tmp_path / "job", tmp_path / "scratch", RUNNER_ARGS, trainer_args())
    model_dir = job_model_dir(tmp_path / "job")
    wait_for_step(model_dir, 60, runner)
    replica(runner, victim).kill()
    output = finish(runner, tmp_path / "scratch")
    metrics = json.loads((model_dir / layout.METRICS).read_text())
    assert metrics["steps"] == TOTAL_STEPS
    assert metrics["restarts"] == 1
    assert metrics["resumed_from_step"] >= 60 - CHECKPOINT_EVERY
    assert 0 <= work_redone(output, metrics["resumed_from_step"]) <= CHECKPOINT_EVERY
    assert len(digests(output)) == 1  # both workers end with identical weights


def wait_for_listener(port, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.1)
    raise AssertionError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


@pytest.mark.slow
@pytest.mark.parametrize("restarted, survivor", [("worker-0", "worker-1"), ("worker-1", "worker-0")])
def test_a_survivor_that_meets_a_restarted_peer_restarts_too(tmp_path, restarted, survivor):
    """The race CI hit: a replica dies and its replacement is up before the survivor noticed. The
    survivor's next heartbeat or collective then fails with a coordination-service error of any code
    (InvalidArgument "must be registered", FailedPrecondition, ...), which must be retried like a lost peer."""
    runner = start_runner(tmp_path / "job", tmp_path / "scratch", RUNNER_ARGS, trainer_args())
    model_dir = job_model_dir(tmp_path / "job")
    wait_for_step(model_dir, 40, runner)
    victim, waiting = replica(runner, restarted), replica(runner, survivor)
    index = int(restarted.rsplit("-", 1)[1])
    port = int(json.loads(victim.environ()["TF_CONFIG"])["cluster"]["worker"][index].rsplit(":", 1)[1])
    waiting.suspend()
    victim.kill()
    victim.wait(30)
    wait_for_listener(port)  # the runner restarted the victim and it listens again
    waiting.resume()
    output = finish(runner, tmp_path / "scratch")
    assert f"{survivor} ended with exit code 144" in output, output[-3000:]
    metrics = json.loads((model_dir / layout.METRICS).read_text())
    assert (metrics["steps"], metrics["restarts"]) == (TOTAL_STEPS, 1)
    assert len(digests(output)) == 1


@pytest.mark.slow
def test_sigterm_checkpoints_the_group_and_resumes_where_it_stopped(tmp_path):
    runner = start_runner(tmp_path / "job", tmp_path / "scratch", RUNNER_ARGS, trainer_args())
    model_dir = job_model_dir(tmp_path / "job")
    wait_for_step(model_dir, 40, runner)
    replica(runner, "worker-1").send_signal(signal.SIGTERM)
    output = finish(runner, tmp_path / "scratch")
    stopped = [int(s) for s in re.findall(r"stopped at step (\d+) of", output)]
    assert stopped and len(set(stopped)) == 1, output[-3000:]
    assert "exit code 143" in output  # retryable under restartPolicy ExitCode
    metrics = json.loads((model_dir / layout.METRICS).read_text())
    assert metrics["resumed_from_step"] == stopped[0]  # nothing redone, nothing skipped
    assert (metrics["steps"], metrics["restarts"]) == (TOTAL_STEPS, 1)
    assert len(digests(output)) == 1


def train_once(model_dir, *extra, timeout=240):
    args = [
        "--dataset",
        "synthetic",
        "--train-examples",
        "2048",
        "--test-examples",
        "256",
        "--log-every",
        "16",
        "--checkpoint-every",
        "16",
        "--model-dir",
        str(model_dir),
        *extra,
    ]
    return wait_all({"single": start(args, None)}, timeout)["single"]


@pytest.mark.slow  # several processes for long: make test-slow
def test_a_truncated_latest_checkpoint_falls_back_to_the_previous_one(tmp_path):
    model_dir = tmp_path / "model"
    first = train_once(model_dir, "--epochs", "1")
    assert first.returncode == 0, first.output[-3000:]
    directory = model_dir / layout.CHECKPOINTS
    latest = directory / "ckpt-32.data-00000-of-00001"
    latest.write_bytes(latest.read_bytes()[:100])
    second = train_once(model_dir, "--epochs", "2")
    assert second.returncode == 0, second.output[-3000:]
    assert "ckpt-32 is unreadable" in second.output and "trying the one before it" in second.output
    metrics = json.loads((model_dir / layout.METRICS).read_text())
    # A continuation of a finished run (more epochs), not a restart of a failed one.
    assert (metrics["resumed_from_step"], metrics["steps"], metrics["restarts"]) == (16, 64, 0)


@pytest.mark.slow  # several processes for long: make test-slow
def test_no_readable_checkpoint_starts_fresh_with_a_log_line(tmp_path):
    model_dir = tmp_path / "model"
    directory = model_dir / layout.CHECKPOINTS
    directory.mkdir(parents=True)
    (directory / "ckpt-16.index").write_bytes(b"garbage")
    result = train_once(model_dir, "--epochs", "1")
    assert result.returncode == 0, result.output[-3000:]
    assert "no readable checkpoint" in result.output and "starting from step 0" in result.output
    assert json.loads((model_dir / layout.METRICS).read_text())["resumed_from_step"] == 0


@pytest.mark.slow  # several processes for long: make test-slow
def test_a_checkpoint_from_another_setup_is_refused_naming_the_mismatch(tmp_path):
    model_dir = tmp_path / "model"
    assert train_once(model_dir, "--epochs", "1").returncode == 0
    result = train_once(model_dir, "--epochs", "1", "--model", "dropout", "--per-worker-batch-size", "32")
    assert result.returncode == 2
    assert "model: checkpoint has 'cnn', this run has 'dropout'" in result.output
    assert "global_batch_size: checkpoint has 64, this run has 32" in result.output
    assert "new --model-dir" in result.output


@pytest.mark.slow  # several processes for long: make test-slow
def test_a_checkpoint_of_another_model_is_refused_before_any_weight_is_touched(tmp_path):
    model_dir = tmp_path / "model"
    assert train_once(model_dir, "--epochs", "1").returncode == 0
    (model_dir / layout.CHECKPOINTS / layout.RUN_SETUP).unlink()  # only the variables can tell now
    result = train_once(model_dir, "--epochs", "1", "--model", "batch_norm")
    assert result.returncode == 2
    assert "was written by a different model" in result.output and "new --model-dir" in result.output


def test_a_taken_status_port_is_a_clear_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = train_once(
            tmp_path / "model", "--epochs", "1", "--status-port", str(port), "--status-host", "127.0.0.1"
        )
    assert result.returncode == 2
    assert f"--status-port {port} on --status-host 127.0.0.1 cannot be bound" in result.output
    assert status.read_status(str(tmp_path / "model"))["state"] == "failed"


def test_status_view_explains_a_file_that_is_not_a_status(tmp_path):
    (tmp_path / "status.json").write_text("not json")
    view = subprocess.run(
        [sys.executable, "-m", "trainer.reporting.status", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert view.returncode == 1 and "is not a trainer status" in view.stderr


@pytest.mark.slow  # several processes for long: make test-slow
def test_status_answers_during_a_run_and_its_step_only_grows(tmp_path):
    port = free_ports(1)[0]
    process = start(
        [
            "--dataset",
            "synthetic",
            "--train-examples",
            "6400",
            "--test-examples",
            "256",
            "--epochs",
            "2",
            "--log-every",
            "16",
            "--model-dir",
            str(tmp_path / "model"),
            "--status-port",
            str(port),
            "--status-host",
            "127.0.0.1",
        ],
        None,
    )
    steps, states, scraped_states = [], set(), set()
    try:
        while process.poll() is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as response:
                    answer = json.load(response)
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as response:
                    scraped_states |= set(
                        re.findall(r'trainer_state\{trainer_state="(\w+)"\} 1\.0', response.read().decode())
                    )
            except OSError:
                time.sleep(0.1)
                continue
            states.add(answer["state"])
            steps.append(answer.get("global_step") or 0)
            time.sleep(0.05)
    finally:
        output, _ = process.communicate(timeout=120)
    assert process.returncode == 0, output[-3000:]
    assert "running" in states and len(set(steps)) >= 3
    assert steps == sorted(steps)
    assert "running" in scraped_states  # the Prometheus view follows the same state
    final = status.read_status(str(tmp_path / "model"))
    assert final["state"] == "succeeded" and final["global_step"] == final["total_steps"] == 200
    view = subprocess.run(
        [sys.executable, "-m", "trainer.reporting.status", str(tmp_path / "model")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert view.returncode == 0 and "succeeded" in view.stdout and "200/200 (100.0%)" in view.stdout
