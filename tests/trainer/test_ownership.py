"""One job per model directory: the chief records its job in the model dir, a restart or resubmit of the same job
resumes there, and another job (another name, or the same name in another namespace) is refused with exit 2 and the
fix, before anything is written."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import time

import pytest

from trainer.artifacts import layout, ownership
from trainer.artifacts.layout import ModelDir
from trainer.base.errors import ModelDirError

ROOT = pathlib.Path(__file__).resolve().parents[2]
JOB = {"JOB_NAME": "mnist-a", "JOB_NAMESPACE": "team", "POD_NAME": "mnist-a-worker-0", "POD_UID": "uid-1"}


def owner_of(model_dir: pathlib.Path) -> dict:
    return json.loads((model_dir / layout.OWNER).read_text())


def test_the_first_chief_records_its_job_and_pod(tmp_path):
    ownership.claim(ModelDir(str(tmp_path)), JOB)
    owner = owner_of(tmp_path)
    assert {key: owner[key] for key in ("job", "namespace", "pod", "pod_uid")} == {
        "job": "mnist-a",
        "namespace": "team",
        "pod": "mnist-a-worker-0",
        "pod_uid": "uid-1",
    }


def test_a_resubmit_of_the_same_job_claims_it_again_and_keeps_when_it_first_did(tmp_path, monkeypatch):
    # The clock the claims read: the first claim in January, the resubmit two months later (real claims run
    # milliseconds apart, within the record's one-second resolution, so a rewritten first_claimed would not show).
    instants = iter([time.gmtime(1_767_225_600), time.gmtime(1_772_323_200)])  # 2026-01-01 and 2026-03-01
    monkeypatch.setattr(ownership.time, "gmtime", lambda: next(instants))
    first = ownership.claim(ModelDir(str(tmp_path)), JOB)
    # make delete, make submit: the engine's object and its pods are new, the job's name and namespace are the same.
    again = ownership.claim(ModelDir(str(tmp_path)), {**JOB, "POD_UID": "uid-2"})
    assert first["first_claimed"] == first["claimed"] == "2026-01-01T00:00:00Z"
    assert again["pod_uid"] == "uid-2" and again["claimed"] == "2026-03-01T00:00:00Z"
    assert again["first_claimed"] == "2026-01-01T00:00:00Z"
    assert owner_of(tmp_path) == again


@pytest.mark.parametrize(
    "other, named",
    [({"JOB_NAME": "mnist-b"}, "team/mnist-b"), ({"JOB_NAMESPACE": "other-team"}, "other-team/mnist-a")],
)
def test_another_job_is_refused_naming_the_owner_and_the_fix(tmp_path, other, named):
    ownership.claim(ModelDir(str(tmp_path)), JOB)
    with pytest.raises(ModelDirError) as refused:
        ownership.claim(ModelDir(str(tmp_path)), {**JOB, **other, "POD_UID": "uid-9"})
    message = str(refused.value)
    assert "belongs to job team/mnist-a" in message and f"not to {named}" in message
    assert "JOB_NAME" in message and f"delete {tmp_path / layout.OWNER}" in message
    assert owner_of(tmp_path)["pod_uid"] == "uid-1"  # untouched


def test_a_run_without_a_job_name_records_and_checks_nothing(tmp_path):
    ownership.claim(ModelDir(str(tmp_path)), JOB)
    assert ownership.claim(ModelDir(str(tmp_path)), {}) is None
    assert owner_of(tmp_path)["job"] == "mnist-a"


@pytest.mark.parametrize("text", ["[1, 2]", '{"job": 3, "namespace": "team"}', "{not json", '"mnist-a"'])
def test_an_owner_file_of_the_wrong_shape_is_refused_with_the_fix(tmp_path, text):
    (tmp_path / layout.OWNER).write_text(text)
    with pytest.raises(ModelDirError, match="delete .*owner.json and start the job again"):
        ownership.claim(ModelDir(str(tmp_path)), JOB)


def test_the_trainer_exits_2_on_another_jobs_model_dir_before_writing_anything(tmp_path):
    ownership.claim(ModelDir(str(tmp_path)), JOB)
    before = sorted(p.name for p in tmp_path.iterdir())
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "--dataset", "synthetic", "--model-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", **JOB, "JOB_NAME": "mnist-b"},
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert "belongs to job team/mnist-a" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
