"""The exit codes, and the errors the user can fix, in one family: each one exits 2 (permanent: a restart cannot help).

`python -m trainer` maps UserError to exit code 2 in one place (`trainer/__main__.py`). Every message
names the problem and the fix; raise the subclass that says where the problem is.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """Exit codes, chosen for the TFJob restartPolicy ExitCode: 1-127 fail the job, >= 128 restart the pod."""

    OK = 0
    BAD_CONFIG = 2  # TF_CONFIG, flags or data are wrong; restarting cannot help
    PREEMPTED = 143  # SIGTERM: a checkpoint was saved, restart and resume (128 + SIGTERM)
    GROUP_FAILED = 144  # a peer was lost or never joined; restart every worker and resume
    STARTUP_TIMEOUT = 137  # the start-up watchdog killed the process (128 + SIGKILL)


class UserError(Exception):
    """A problem with what the user gave the trainer; the message names it and the fix."""


class ConfigError(UserError):
    """A bad flag or TRAINER_* variable."""


class ClusterConfigError(UserError):
    """TF_CONFIG cannot describe a group this trainer can run."""


class DataError(UserError):
    """The dataset cannot be read as asked: missing, unprepared, too small, or malformed."""


class ModelDirError(UserError):
    """--model-dir cannot be written, or holds checkpoints of another run."""


class StatusPortError(UserError):
    """The status server cannot listen where it was asked to."""


def first_line(error: BaseException) -> str:
    """An exception's first line, for one-line messages: TensorFlow's errors span many lines."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]
