"""run-local's closing lines: a finished job's model is shown as this run's whatever the engine calls success
(a TFJob's Succeeded, a JobSet's Completed); a failed job's leftovers are not."""

import io
import os
import time

import pytest

from scripts.localrun.console import Console
from scripts.localrun.operator_rules import Condition
from scripts.localrun.report import summarize
from scripts.localrun.supervisor import JobResult


def closing_model_line(tmp_path, condition_type: str, written_before_the_run: bool = True) -> str:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "model.keras").write_bytes(b"keras")
    (model_dir / "checkpoints").mkdir()
    (model_dir / "checkpoints" / "ckpt-8.index").write_bytes(b"index")
    if written_before_the_run:  # an hour before this one-second run
        for path in (model_dir / "model.keras", model_dir / "checkpoints" / "ckpt-8.index", model_dir / "checkpoints"):
            os.utime(path, (time.time() - 3600,) * 2)
    stream = io.StringIO()
    result = JobResult(Condition(condition_type, "Done", "ended"), None, 1.0, None, {}, set())
    summarize("Job", "default", "job", result, {}, Console([], tmp_path / "logs", stream), model_dir, tmp_path / "s")
    return [line for line in stream.getvalue().splitlines() if "model:" in line][-1]


@pytest.mark.parametrize("success", ["Succeeded", "Completed"])
def test_a_successful_jobs_model_is_shown_as_this_runs(tmp_path, success):
    line = closing_model_line(tmp_path, success)
    assert "model.keras" in line and "earlier run" not in line, line


def test_a_failed_jobs_leftovers_are_not_shown_as_this_runs(tmp_path):
    line = closing_model_line(tmp_path, "Failed")
    assert "this run made none" in line and "holds an earlier run's (model.keras, checkpoints/)" in line, line


def test_a_failed_first_runs_own_checkpoints_are_not_called_an_earlier_runs(tmp_path):
    # Before: "holds an earlier run's (checkpoints/, ...)" after a first run, when no earlier run existed.
    line = closing_model_line(tmp_path, "Failed", written_before_the_run=False)
    assert "holds this run's unfinished work (model.keras, checkpoints/)" in line and "earlier" not in line, line
