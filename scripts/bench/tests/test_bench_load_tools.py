"""The serving bench's load generators (scripts/bench/load_tools.py): one missing or built from anything but its pin is
refused before the bench starts, naming what to run."""

from __future__ import annotations

import shutil

import pytest

from scripts.bench import load_tools
from scripts.bench.runs import BenchError
from scripts.common import settings as project_settings

SETTINGS = project_settings.load_file()


def test_missing_load_generators_are_each_named_with_the_command_that_installs_them(tmp_path, monkeypatch):
    monkeypatch.setattr(load_tools, "BIN", tmp_path)
    with pytest.raises(BenchError) as refused:
        load_tools.require(SETTINGS)
    message = str(refused.value)
    for tool, package, version in (
        ("ghz", "github.com/bojand/ghz/cmd/ghz", SETTINGS["BENCH_GHZ_VERSION"]),
        ("hey", "github.com/rakyll/hey", SETTINGS["BENCH_HEY_VERSION"]),
    ):
        assert f"{tool} {version} is not installed at {tmp_path / tool}: run `make bench-tools`" in message
        assert f"GOBIN={tmp_path} go install {package}@{version}" in message


def test_a_load_generator_that_is_not_the_pinned_build_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(load_tools, "BIN", tmp_path)
    go = shutil.which("go")
    for tool in ("ghz", "hey"):  # another program under each name: go itself where it is installed
        if go:
            shutil.copy(go, tmp_path / tool)
        else:
            (tmp_path / tool).write_text("#!/bin/sh\n")
    with pytest.raises(BenchError) as refused:
        load_tools.require(SETTINGS)
    message = str(refused.value)
    if go:
        ghz_pin = (
            f"github.com/bojand/ghz {SETTINGS['BENCH_GHZ_VERSION']} h1:CmXNDxDChmTI8eq6cs6ob3N+OUQIXeLQPCaKsw4oXXg="
        )
        assert f"{tmp_path / 'ghz'} was built from no module record" in message and f"not {ghz_pin}" in message
    else:
        assert "go is not on PATH" in message
    assert message.count("\n") == 2  # one line for each tool


def test_each_call_is_an_answer_a_shed_request_or_a_failure():
    calls = [(0.1, "200", "HTTP 200"), (0.2, "503", "HTTP 503"), (0.3, "500", "HTTP 500"), (0.4, "200", "HTTP 200")]
    assert load_tools.by_outcome(calls, answered="200", refused="503") == ([0.1, 0.4], [0.2], ["HTTP 500"])
