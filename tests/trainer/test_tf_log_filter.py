"""A healthy CPU run prints the trainer's own lines: TensorFlow's start-up noise is filtered before stderr,
everything else passes, and TRAINER_TF_NOISE=1 brings the noise back."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from multiworker import run_group

# TensorFlow's C++ lines at warning, error or fatal level, absl's banner, and Python warnings.
TF_WARNING_OR_ERROR = re.compile(r"^(?:[WEF]\d{4} [\d:.]+ |WARNING: |ERROR: )|Warning: ")
NOISE_AND_A_REAL_ERROR = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    "I0000 00:00:1796054215.896370   12603 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU "
    "will not be used.\n"
    "E0000 00:00:1796054218.046982   12603 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
    "Failed call to cuInit: UNKNOWN ERROR (303)\n"
    "W0000 00:00:1796054796.802611    7248 dataset.cc:997] Input of GeneratorDatasetOp::Dataset will not be "
    "optimized because the dataset does not implement the AsGraphDefInternal() method\n"
    "E0000 00:00:1796054891.119096   12517 some_op.cc:1] a real error\n"
    "error: the trainer's own message\n"
)
WRITER = (
    "import os, sys; from trainer.artifacts import tf_log_filter; tf_log_filter.install(); "
    "os.write(2, sys.argv[1].encode()); print('stdout line', flush=True)"
)


def tf_warnings_and_errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if TF_WARNING_OR_ERROR.search(line)]


def write_through_the_filter(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", WRITER, NOISE_AND_A_REAL_ERROR],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )


def test_the_filter_drops_the_start_up_noise_and_passes_everything_else():
    result = write_through_the_filter({})
    assert result.returncode == 0
    assert result.stderr.splitlines() == [
        "E0000 00:00:1796054891.119096   12517 some_op.cc:1] a real error",
        "error: the trainer's own message",
    ]
    assert result.stdout == "stdout line\n"


def test_trainer_tf_noise_1_brings_the_noise_back():
    assert write_through_the_filter({"TRAINER_TF_NOISE": "1"}).stderr == NOISE_AND_A_REAL_ERROR


@pytest.mark.slow  # several processes for long: make test-slow
def test_a_healthy_cpu_run_prints_no_tensorflow_warning_or_error(tmp_path):
    # Before: absl's banner, "failed call to cuInit ... (303)" at error level, CUDA and oneDNN notices.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "--dataset",
            "synthetic",
            "--epochs",
            "1",
            "--train-examples",
            "256",
            "--test-examples",
            "128",
            "--model-dir",
            str(tmp_path / "m"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={k: v for k, v in os.environ.items() if k != "TF_CONFIG"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert tf_warnings_and_errors(result.stdout + result.stderr) == []
    assert "finished: test loss" in result.stdout


def two_worker_run(tmp_path, module: str = "trainer", env: dict[str, str] | None = None) -> dict:
    return run_group(
        2,
        [
            "--dataset",
            "synthetic",
            "--epochs",
            "2",
            "--train-examples",
            "512",
            "--test-examples",
            "128",
            "--model-dir",
            str(tmp_path / "m"),
        ],
        module=module,
        env=env,
    )


def assert_clean_until_exit(finished: dict) -> None:
    """Each worker's whole output, to its exit, has its finished line and no TensorFlow warning or error."""
    for worker in finished.values():
        assert worker.returncode == 0, worker.output[-3000:]
        assert f"{worker.name} finished:" in worker.output
        assert tf_warnings_and_errors(worker.output) == [], worker.name


@pytest.mark.slow
def test_a_healthy_two_worker_run_prints_no_tensorflow_warning_or_error_until_both_exit(tmp_path):
    # Before: also "Input of GeneratorDatasetOp::Dataset will not be optimized" from tf.distribute's iterator.
    assert_clean_until_exit(two_worker_run(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("late, seconds", [("0", "20"), ("1", "3")], ids=["leader-last", "peer-last"])
def test_workers_that_finish_apart_leave_the_group_without_a_lost_peer_error(tmp_path, late, seconds):
    # Before, after both finished lines: the leader, still up 10 s after its peer exited, logged "StartAbort
    # UNAVAILABLE ... The following tasks are unhealthy (stopped sending heartbeats)"; a peer still up when the
    # leader exited logged "StartAbort UNAVAILABLE: Failed to send RPC to coordination service".
    assert_clean_until_exit(two_worker_run(tmp_path, "late_finisher", {"LATE_TASK": late, "LATE_S": seconds}))
