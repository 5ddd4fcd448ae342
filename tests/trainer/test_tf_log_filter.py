"""A healthy CPU run prints the trainer's own lines: TensorFlow's start-up noise is filtered before stderr,
everything else passes, and TRAINER_TF_NOISE=1 brings the noise back."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from multiworker import run_group

# A warning or error in any form a run prints one: TensorFlow's C++ lines at warning, error or fatal level (absl's
# form, and the older "<date> <time>: W ..." one); a Python logger's warning or error in the trainer's own format
# (`<date> <time>,<ms> worker-0 WARNING ...`, trainer/__main__.py: TensorFlow's and Keras's Python loggers reach the
# root handler it sets up) and in logging's default one (`WARNING:tensorflow:...`, and absl's banner); a Python
# warning (`...: UserWarning: ...`); a traceback.
TF_WARNING_OR_ERROR = re.compile(
    r"^(?:[WEF]\d{4} [\d:.]+ "
    r"|\d{4}-\d\d-\d\d [\d:.]+: [WEF] "
    r"|\d{4}-\d\d-\d\d [\d:,]+ \S+ (?:WARNING|ERROR|CRITICAL) "
    r"|(?:WARNING|ERROR|CRITICAL):"
    r"|Traceback \(most recent call last\):)"
    r"|Warning: "
)
# Lines a run has printed when something was wrong, one of each form, and lines of a healthy run.
WARNINGS_AND_ERRORS = [
    "2026-01-01 10:00:00,123 worker-0 WARNING 5 out of the last 5 calls to <function TrainStep.run at 0x7f> "
    "triggered tf.function retracing. Tracing is expensive and the excessive number of tracings could be due to ...",
    "2026-01-01 10:00:00,123 worker-1 WARNING Your input ran out of data; interrupting training. Make sure that your "
    "dataset or generator can generate at least `steps_per_epoch * epochs` batches.",
    "2026-01-01 10:00:00,123 chief-0 ERROR worker-1: these peers' host names never resolved: worker-1",
    "W0000 00:00:1796054796.802611    7248 local_rendezvous.cc:404] Local rendezvous is aborting with status: "
    "OUT_OF_RANGE: End of sequence",
    "E0000 00:00:1796054891.119096   12517 coordination_service_agent.cc:1] StartAbort UNAVAILABLE",
    "2026-01-01 10:00:00.123456: W tensorflow/core/framework/op_kernel.cc:1] OP_REQUIRES failed",
    "WARNING:tensorflow:5 out of the last 5 calls to <function f at 0x7f> triggered tf.function retracing.",
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "/venv/lib/python3.11/site-packages/keras/src/trainers/epoch_iterator.py:1: UserWarning: Your input ran out of "
    "data; interrupting training.",
    "Traceback (most recent call last):",
]
HEALTHY_LINES = [
    "2026-01-01 10:00:00,123 worker-0 INFO epoch 1/2: loss 0.52, accuracy 0.81",
    "2026-01-01 10:00:00,123 worker-0 INFO worker-0 finished: test loss 0.40, test accuracy 0.86",
    "I0000 00:00:1796054796.802611    7248 local_rendezvous.cc:405] Local rendezvous recv item cancelled.",
    "epoch 1: 0.5 s, no warning",
]
NOISE_AND_A_REAL_ERROR = (
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n"
    "I0000 00:00:1796054215.896370   12603 cudart_stub.cc:31] Could not find cuda drivers on your machine, GPU "
    "will not be used.\n"
    "E0000 00:00:1796054218.046982   12603 cuda_platform.cc:52] failed call to cuInit: INTERNAL: CUDA error: "
    "Failed call to cuInit: UNKNOWN ERROR (303)\n"
    "W0000 00:00:1796054796.802611    7248 dataset.cc:997] Input of GeneratorDatasetOp::Dataset will not be "
    "optimized because the dataset does not implement the AsGraphDefInternal() method\n"
    "W0000 00:00:1796506557.024544    4519 local_rendezvous.cc:412] Local rendezvous is aborting with status: "
    "INVALID_ARGUMENT: Invalid PNG data, size 954\n"
    "\t [[{{function_node __inference_from_files_757}}{{node Assert/Assert}}]]\n"
    "E0000 00:00:1796533997.649963   27883 jpeg_mem.cc:331] Premature end of JPEG data. Stopped at line 8/28\n"
    "W0000 00:00:1796054796.802611    7248 local_rendezvous.cc:404] Local rendezvous is aborting with status: "
    "OUT_OF_RANGE: End of sequence\n"
    "\t [[{{node IteratorGetNext}}]]\n"
    "E0000 00:00:1796533596.106115   13229 jpeg_mem.cc:331] Premature end of JPEG data. Stopped at line 30/90\n"
    "Improper call to JPEG library in state 201\n"
    "Corrupt JPEG data: premature end of data segment\n"
    "Bogus Huffman table definition\n"
    "Input file read error\n"
    "E0000 00:00:1796054891.119096   12517 some_op.cc:1] a real error\n"
    "error: the trainer's own message\n"
)
WRITER = (
    "import os, sys; from trainer.reporting import tf_log_filter; tf_log_filter.install(); "
    "os.write(2, sys.argv[1].encode()); print('stdout line', flush=True)"
)


def tf_warnings_and_errors(output: str) -> list[str]:
    return [line for line in output.splitlines() if TF_WARNING_OR_ERROR.search(line)]


def test_the_check_for_a_clean_run_flags_a_warning_or_error_in_every_form_a_run_prints_one():
    assert [line for line in WARNINGS_AND_ERRORS if not tf_warnings_and_errors(line)] == []
    assert tf_warnings_and_errors("\n".join(HEALTHY_LINES)) == []


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
        "W0000 00:00:1796054796.802611    7248 local_rendezvous.cc:404] Local rendezvous is aborting with status: "
        "OUT_OF_RANGE: End of sequence",
        "\t [[{{node IteratorGetNext}}]]",
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


@pytest.mark.slow  # two TensorFlow start-ups
@pytest.mark.parametrize(
    "module, args, said",
    [
        ("trainer.data", ["--dataset", "image_folder", "--image-dir", "{folder}"], "dataset image_folder is ready"),
        ("trainer.serving", ["--model-base-path", "{empty}"], "holds no numbered SavedModel"),
    ],
)
def test_the_data_check_and_the_server_start_without_tensorflows_noise(module, args, said, tmp_path):
    import image_folders

    folder, empty = image_folders.write(tmp_path / "images", per_class=2, test_per_class=1), tmp_path / "empty"
    empty.mkdir()
    command = [sys.executable, "-m", module, *(arg.format(folder=folder, empty=empty) for arg in args)]
    environ = {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=environ)
    output = done.stdout + done.stderr
    assert said in output, output[-2000:]
    assert not [line for line in output.splitlines() if TF_WARNING_OR_ERROR.match(line)], output[-2000:]
