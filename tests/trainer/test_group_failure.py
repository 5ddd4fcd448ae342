"""Which errors mean "the group broke up, restart and resume" (retryable 144) and which are this worker's bug."""

import pytest
import tensorflow as tf

from trainer.__main__ import main
from trainer.base.errors import ExitCode
from trainer.reporting import status

# What worker-1 raised in CI when the chief was SIGKILLed and came back before worker-1's next heartbeat.
CHIEF_RESTARTED = (
    "Collective ops is aborted by: Task with task_name=/job:worker/replica:0/task:1 must be "
    "registered before sending heartbeat messages. The service might have restarted, please "
    "restart / reset and register again.\n\nRPC: /tensorflow.CoordinationService/Heartbeat"
)

GROUP_FAILURES = [
    tf.errors.InvalidArgumentError(None, None, CHIEF_RESTARTED),
    tf.errors.UnavailableError(None, None, "failed to connect to all addresses"),
    tf.errors.CancelledError(None, None, "Cancelled"),
    tf.errors.DeadlineExceededError(None, None, "Deadline Exceeded"),
    tf.errors.InternalError(None, None, "Collective ops is aborted by: heartbeat timeout"),
]
BUGS = [
    tf.errors.InvalidArgumentError(None, None, "Incompatible shapes: [32,10] vs. [64,10]"),
    ValueError("a bug in the training step"),
]


def run_main_raising(error, tmp_path, monkeypatch):
    def train_and_evaluate(*args, **kwargs):
        raise error

    monkeypatch.delenv("TF_CONFIG", raising=False)
    monkeypatch.setattr("trainer.loop.train_and_evaluate", train_and_evaluate)
    return main(["--dataset", "synthetic", "--model-dir", str(tmp_path)])


@pytest.mark.parametrize("error", GROUP_FAILURES, ids=lambda error: type(error).__name__)
def test_a_broken_group_exits_with_the_retryable_code(error, tmp_path, monkeypatch):
    assert run_main_raising(error, tmp_path, monkeypatch) == ExitCode.GROUP_FAILED
    reported = status.read_status(str(tmp_path))
    assert reported["state"] == "failed" and "lost a peer" in reported["error"]


@pytest.mark.parametrize("error", BUGS, ids=lambda error: type(error).__name__)
def test_a_bug_is_not_retried_but_raised_and_reported(error, tmp_path, monkeypatch):
    with pytest.raises(type(error)):
        run_main_raising(error, tmp_path, monkeypatch)
    assert status.read_status(str(tmp_path))["state"] == "failed"
