"""In a pod, why the trainer stopped is the container's termination message: what `kubectl describe pod`, the
engines and make tune-cluster read. Katib's metrics collector wraps the chief's command so its output goes to a
file, leaving its logs empty; the message still says why (a CI run showed a diverged trial as a bare `exit 4`)."""

from __future__ import annotations

import pytest
from test_nonfinite import POISONED, RUN

import trainer.__main__ as entry
from multiworker import start, wait_all
from trainer.base.errors import ExitCode
from trainer.reporting import termination_message

# Katib's StdOut collector rewrites the chief's command this way: its output goes to a file, its exit code stays.
KATIB_WRAPPER = ["sh", "-c", '"$@" 1>"$METRICS_LOG" 2>&1 && echo completed >"$METRICS_LOG.done"', "sh"]


def run_in_pod(tmp_path, args):
    """One trainer process as Katib runs a trial's chief: the kubelet's empty message file, the output elsewhere."""
    message_file = tmp_path / "termination-log"
    message_file.touch()
    env = {termination_message.PATH_VARIABLE: str(message_file), "METRICS_LOG": str(tmp_path / "metrics.log")}
    (result,) = wait_all({"chief": start(args, None, env, wrapper=KATIB_WRAPPER)}, timeout=240).values()
    assert result.output == ""  # the container's logs: nothing for the kubelet to fall back to
    return result, message_file.read_text()


def test_a_diverged_run_says_why_in_its_termination_message(tmp_path):
    result, message = run_in_pod(tmp_path, [*POISONED, *RUN, "--model-dir", str(tmp_path / "model")])
    assert result.returncode == ExitCode.DIVERGED, (tmp_path / "metrics.log").read_text()[-3000:]
    assert message.startswith("error: training diverged") and "--learning-rate" in message, message
    assert "\n" not in message


def test_a_bad_flag_says_why_in_its_termination_message(tmp_path):
    result, message = run_in_pod(tmp_path, ["--epochs", "0", "--model-dir", str(tmp_path / "model")])
    assert result.returncode == ExitCode.BAD_CONFIG
    assert message.startswith("error: --epochs") and message in (tmp_path / "metrics.log").read_text(), message


def test_a_bug_leaves_its_exception_as_the_message_and_keeps_its_traceback(tmp_path, monkeypatch):
    message_file = tmp_path / "termination-log"
    monkeypatch.setenv(termination_message.PATH_VARIABLE, str(message_file))
    monkeypatch.delenv("TF_CONFIG", raising=False)

    def buggy_run(*_):
        raise ValueError("a bug")

    monkeypatch.setattr(entry, "run", buggy_run)
    with pytest.raises(ValueError, match="a bug"):
        entry.main(["--model-dir", str(tmp_path / "model")])
    assert message_file.read_text() == "error: ValueError: a bug"


def test_a_message_longer_than_the_kubelet_keeps_is_cut_on_a_character(tmp_path):
    message_file = tmp_path / "termination-log"
    environ = {termination_message.PATH_VARIABLE: str(message_file)}
    termination_message.write("é" * termination_message.LIMIT_BYTES, environ)
    assert message_file.read_text() == "é" * (termination_message.LIMIT_BYTES // 2)


def test_outside_a_pod_nothing_is_written(tmp_path, monkeypatch):
    monkeypatch.setattr(termination_message, "DEFAULT_PATH", str(tmp_path / "termination-log"))
    termination_message.write("error: anything", {})
    assert not (tmp_path / "termination-log").exists()
