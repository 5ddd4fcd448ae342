"""The entry point's exit table: each failure the trainer knows ends with its code, its one line and its status;
anything else is a bug and keeps its traceback. The codes are what the engines' restart rules read."""

from __future__ import annotations

import errno

import pytest
import tensorflow as tf

from trainer.__main__ import ending
from trainer.base.errors import ConfigError, Diverged, ExitCode, StartupTimeout
from trainer.distribution.cluster import from_environment
from trainer.distribution.preemption import Preempted

CLUSTER = from_environment(environ={})
LOST_PEER = "Collective ops is aborted by: /job:worker/replica:0/task:1 crashed (heartbeat timeout)"
FAILURES = [
    (Preempted("stopped at step 3 of 9 after a checkpoint"), ExitCode.PREEMPTED, None),
    (Diverged("training diverged at step 4"), ExitCode.DIVERGED, "diverged"),
    (ConfigError("--epochs must be positive"), ExitCode.BAD_CONFIG, "failed"),
    (
        ModuleNotFoundError("No module named 'importlib_resources'", name="importlib_resources"),
        ExitCode.BAD_CONFIG,
        "failed",
    ),
    (OSError(errno.ENOSPC, "No space left on device", "/model/ckpt-3.index"), ExitCode.VOLUME_FULL, "failed"),
    (StartupTimeout("worker-0: these peers' host names never resolved: w1"), ExitCode.STARTUP_TIMEOUT, "failed"),
    (tf.errors.UnavailableError(None, None, LOST_PEER), ExitCode.GROUP_FAILED, "failed"),
]


@pytest.mark.parametrize(("error", "code", "state"), FAILURES, ids=lambda value: type(value).__name__)
def test_each_known_failure_ends_with_its_code_one_line_and_status(error, code, state, tmp_path):
    end = ending(error, str(tmp_path), CLUSTER)
    assert end is not None and end.code == code
    assert "\n" not in end.line and len(end.line) < 1200
    if state is None:  # a preemption is a restart the operator expects: a log warning; the status keeps its progress
        assert end.status is None and end.warning
    else:
        assert end.state == state and end.status and not end.warning


def test_every_exit_code_but_success_has_a_failure_that_ends_with_it():
    assert {code for _, code, _ in FAILURES} == set(ExitCode) - {ExitCode.OK}


def test_a_bug_is_no_known_failure_and_keeps_its_traceback(tmp_path):
    assert ending(ValueError("a bug"), str(tmp_path), CLUSTER) is None
    assert ending(KeyboardInterrupt(), str(tmp_path), None) is None
