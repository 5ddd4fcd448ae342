"""make bench's serving phase with tiny counts: every cell (protocol, batch, clients) is measured with no failed
request, the version published halfway through the last gRPC cell is served, and the targets are reported. The
figures themselves mean nothing here (a busy machine, a handful of requests)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from model_server import ROOT


@pytest.mark.slow
def test_the_serving_phase_measures_every_cell_and_the_swap_with_tiny_counts():
    done = subprocess.run(
        [sys.executable, "-m", "scripts.bench.serving_load", "--serving-requests", "8"]
        + ["--serving-clients", "1,2", "--serving-batches", "1,4"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith(("in_process", "v1_json", "grpc_v2"))]
    assert {(row[0], row[1], row[2]) for row in rows} == {
        ("in_process", "1", "1"),
        ("in_process", "4", "1"),
        *((protocol, batch, clients) for protocol in ("v1_json", "grpc_v2") for batch in "14" for clients in "12"),
    }
    assert all(row[-1] == "0" for row in rows), done.stdout
    assert "'2'" in done.stdout.split("swap:")[1]  # the version published halfway was served
    targets = json.loads(done.stdout.splitlines()[-1])["targets"]
    assert [target["met"] for target in targets][1] is True
    assert targets[0]["measured"] > 0
