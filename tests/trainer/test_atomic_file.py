"""Artifacts are replaced whole: a reader sees the old or the new one, never a half-written one."""

import json
import os

import pytest

from trainer.base.atomic_file import replaced_on_success, write_json


def test_write_json_replaces_the_file_and_leaves_nothing_beside_it(tmp_path):
    path = tmp_path / "status.json"
    write_json(str(path), {"step": 1})
    write_json(str(path), {"step": 2})
    assert json.loads(path.read_text()) == {"step": 2}
    assert os.listdir(tmp_path) == ["status.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_partial_one(tmp_path):
    path = tmp_path / "metrics.json"
    write_json(str(path), {"accuracy": 0.9})
    with pytest.raises(TypeError):
        write_json(str(path), {"accuracy": object()})  # not JSON: fails halfway through the dump
    assert json.loads(path.read_text()) == {"accuracy": 0.9}
    assert os.listdir(tmp_path) == ["metrics.json"]


def test_the_partial_path_keeps_the_extension_writers_check(tmp_path):
    with replaced_on_success(str(tmp_path / "model.keras")) as partial:
        assert partial.endswith(".keras") and os.path.dirname(partial) == str(tmp_path)
        open(partial, "w").close()
    assert os.listdir(tmp_path) == ["model.keras"]


def test_a_directory_is_replaced_whole_or_not_at_all(tmp_path):
    path = tmp_path / "saved_model"
    for version in ("old", "new"):
        with replaced_on_success(str(path)) as partial:
            os.makedirs(partial)
            (tmp_path / partial / f"{version}.pb").write_text(version)
    assert os.listdir(path) == ["new.pb"]
    with pytest.raises(RuntimeError):
        with replaced_on_success(str(path)) as partial:
            os.makedirs(partial)
            (tmp_path / partial / "half.pb").write_text("half")
            raise RuntimeError("the writer died")
    assert os.listdir(path) == ["new.pb"]
    assert os.listdir(tmp_path) == ["saved_model"]
