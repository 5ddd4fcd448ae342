"""run-local's closing lines: a finished job's model is shown as this run's whatever the engine calls success
(a TFJob's Succeeded, a JobSet's Completed); a failed job's leftovers are not."""

import io

import pytest

from scripts.localrun.console import Console
from scripts.localrun.operator_rules import Condition
from scripts.localrun.report import summarize
from scripts.localrun.supervisor import JobResult


def closing_model_line(tmp_path, condition_type: str) -> str:
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "model.keras").write_bytes(b"keras")
    stream = io.StringIO()
    result = JobResult(Condition(condition_type, "Done", "ended"), None, 1.0, None, {}, set())
    summarize("Job", "default", "job", result, {}, Console([], tmp_path / "logs", stream), model_dir, tmp_path / "s")
    return [line for line in stream.getvalue().splitlines() if "model:" in line][-1]


@pytest.mark.parametrize("success", ["Succeeded", "Completed"])
def test_a_successful_jobs_model_is_shown_as_this_runs(tmp_path, success):
    line = closing_model_line(tmp_path, success)
    assert "model.keras" in line and "earlier run" not in line, line


def test_a_failed_jobs_leftovers_are_not_shown_as_this_runs(tmp_path):
    assert "holds an earlier run's" in closing_model_line(tmp_path, "Failed")
