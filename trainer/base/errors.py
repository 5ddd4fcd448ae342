"""The exit codes, and the errors the user can fix, in one family: a UserError exits 2 (permanent: a restart cannot
help; a module missing from the image, BrokenEnvironmentError, is one); a full volume, VolumeFullError, exits 3; a
run whose training went non-finite, Diverged, exits 4.

`python -m trainer` maps each to its exit code in one place (`trainer/__main__.py`). Every message names the
problem and the fix; raise the subclass that says where the problem is.
"""

from __future__ import annotations

import enum
import errno
import os
import re
import shutil
import sys


class ExitCode(enum.IntEnum):
    """Exit codes, chosen for the TFJob restartPolicy ExitCode: 1-127 fail the job, >= 128 restart the pod."""

    OK = 0
    BAD_CONFIG = 2  # TF_CONFIG, flags or data are wrong; restarting cannot help
    PREEMPTED = 143  # SIGTERM: a checkpoint was saved, restart and resume (128 + SIGTERM)
    GROUP_FAILED = 144  # a peer was lost or never joined; restart every worker and resume
    STARTUP_TIMEOUT = 137  # the start-up watchdog killed the process (128 + SIGKILL)
    VOLUME_FULL = 3  # the model dir's volume is full: a restart cannot free it (permanent); free space, then resubmit
    DIVERGED = 4  # a loss, gradient or weight went non-finite: the same data would do it again (permanent)


class UserError(Exception):
    """A problem with what the user gave the trainer; the message names it and the fix."""


class ConfigError(UserError):
    """A bad flag or TRAINER_* variable."""


class ClusterConfigError(UserError):
    """TF_CONFIG cannot describe a group this trainer can run."""


class DataError(UserError):
    """The dataset cannot be read as asked: missing, unprepared, too small, or malformed."""


class CorruptRecordError(DataError):
    """A TFRecord file cannot be read through (truncated, a checksum mismatch) or holds a record that is not the
    expected tf.train.Example: the message names the file, the record and the fix."""


class BrokenEnvironmentError(UserError):
    """A module the code imports is not installed: the image or virtualenv was built incomplete (its lock left the
    package out), so neither the data, the flags nor the network can fix it, and a restart cannot either."""


class ModelDirError(UserError):
    """--model-dir cannot be written, or holds checkpoints of another run."""


class ExportCheckError(UserError):
    """The SavedModel written for serving, loaded back, answers differently from the model in memory (a serving
    skew): nothing was published."""


class StatusPortError(UserError):
    """The status server cannot listen where it was asked to."""


class ServingError(UserError):
    """The model server's base path holds no version it can load (trainer/serving/)."""


class SelectionError(UserError):
    """Model selection cannot choose or publish: no acceptable candidate, or an unwritable base path."""


def first_line(error: BaseException) -> str:
    """An exception's first line, for one-line messages: TensorFlow's errors span many lines."""
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


class Diverged(Exception):
    """Training went non-finite (exit 4): the message names the step, the epoch, what went non-finite and the likely
    causes. No checkpoint or export holds the non-finite weights."""


class StartupTimeout(Exception):
    """The group could not form in time (a peer's host name never resolved): retryable (exit 137), as the start-up
    watchdog's kill is, since pods' DNS records and late peers appear on a restart."""


class VolumeFullError(Exception):
    """A write to the model dir's volume failed for lack of space (exit 3): the message names the path, the bytes
    free and the fix."""


def volume_full(error: BaseException, model_dir: str) -> VolumeFullError | None:
    """The VolumeFullError for `error` when it (or what caused it) is a full volume (ENOSPC), else None."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, VolumeFullError):
            return seen
        text = str(seen)
        if (isinstance(seen, OSError) and seen.errno == errno.ENOSPC) or "No space left on device" in text:
            written = getattr(seen, "filename", None) or _path_in(text, model_dir) or model_dir
            try:
                free = f"{shutil.disk_usage(_existing(model_dir)).free:,} bytes free"
            except OSError:
                free = "free space unknown"
            return VolumeFullError(
                f"the volume holding {model_dir} is full ({free}) while writing {written}; the earlier checkpoints "
                f"are intact. Free space there (older runs, --keep-checkpoints) or give the job a larger volume, "
                f"then start it again: it resumes from the last checkpoint. Exit code {ExitCode.VOLUME_FULL}: a "
                f"restart alone cannot help"
            )
        seen = seen.__cause__ or seen.__context__
    return None


def missing_module(error: BaseException) -> BrokenEnvironmentError | None:
    """The BrokenEnvironmentError for `error` when it (or what caused it) is a module that is not installed, else
    None. Errors the trainer raises for a user's own module (--module) are UserErrors already
    and are not looked into."""
    seen: BaseException | None = error
    while seen is not None and not isinstance(seen, UserError):
        if isinstance(seen, ModuleNotFoundError) and seen.name:
            package = seen.name.partition(".")[0]
            return BrokenEnvironmentError(
                f"the Python module {seen.name!r} is not installed in {sys.prefix}: this image or virtualenv is "
                f"incomplete (the data, the flags and the network are not the cause, and a restart cannot help). "
                f"Locally, run `make install`; for the image, add the package that provides {package!r} to "
                f"pyproject.toml's dependencies, then `make lock` and `make image`, and submit again"
            )
        seen = seen.__cause__ or seen.__context__
    return None


def _path_in(text: str, model_dir: str) -> str | None:
    """The file under the model dir that a TensorFlow write error names."""
    for directory in dict.fromkeys((model_dir, os.path.abspath(model_dir))):
        match = re.search(re.escape(directory.rstrip("/")) + r"/[^\s;,']*", text)
        if match:
            return match.group(0)
    return None


def _existing(path: str) -> str:
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path
