"""make bench's serving phase with tiny counts: every cell (protocol, batch, clients) is measured with no failed
request, the version published halfway through the last gRPC cell is served, batching off and on are measured cell
by cell with the batch each formed, the shedding cells (gRPC, REST) shed with no admitted request failing, and the
targets are reported. The figures themselves mean nothing here (a busy machine, a handful of requests). The batching
and shedding cells' load comes from ghz and hey, which make test-slow installs (make bench-tools)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from model_server import ROOT


def run_bench(module: str, *flags: str) -> subprocess.CompletedProcess[str]:
    """`python -m scripts.bench.MODULE FLAGS`, which must exit 0."""
    done = subprocess.run(
        [sys.executable, "-m", f"scripts.bench.{module}", *flags], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_the_serving_phase_measures_every_cell_and_the_swap_with_tiny_counts():
    done = run_bench(
        "serving_load",
        *["--serving-requests", "8", "--serving-clients", "1,2", "--serving-batches", "1,4", "--batching", "4:2"],
        *["--batching-clients", "1,4", "--batching-requests", "16", "--shed-clients", "16", "--shed-queue-limit", "4"],
        *["--shed-requests", "200"],
    )
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith(("in_process", "v1_json", "grpc_v2"))]
    assert {(row[0], row[1], row[2]) for row in rows} == {
        ("in_process", "1", "1"),
        ("in_process", "4", "1"),
        *((protocol, batch, clients) for protocol in ("v1_json", "grpc_v2") for batch in "14" for clients in "12"),
    }
    assert all(row[-1] == "0" for row in rows), done.stdout
    assert "'2'" in done.stdout.split("swap:")[1]  # the version published halfway was served
    batching = [line.split() for line in done.stdout.splitlines() if line.startswith(("off ", "on 4:2 "))]
    cells = {(row[0] if row[0] == "off" else " ".join(row[:2]), row[-7], row[-6]) for row in batching}
    modes = ("off", "on 4:2")
    assert cells == {
        (mode, protocol, clients) for mode in modes for protocol in ("v1_json", "grpc_v2") for clients in "14"
    }
    assert all(row[-1] == "0" for row in batching), done.stdout
    assert any(float(row[-2]) > 1 for row in batching if row[0] == "on"), "no batch joined two requests"
    shedding = [line for line in done.stdout.splitlines() if line.startswith("shedding")]
    assert [line.split(" clients)")[0].split()[-1] for line in shedding] == ["grpc_v2", "v1_json"], shedding
    for line in shedding:
        assert " 0 failed" in line and not line.split("): ")[1].startswith("0 of"), line
    targets = json.loads(done.stdout.splitlines()[-1])["targets"]
    assert [target["met"] for target in targets][1] is True
    assert targets[0]["measured"] > 0


@pytest.mark.slow
def test_the_floor_bench_measures_the_bare_grpc_server_beside_the_model_server_and_a_baseline_revision():
    done = run_bench(
        "grpc_floor",
        *["--clients", "1,4", "--requests", "16", "--batch-size", "4", "--shed-queue-limit", "4"],
        *["--shed-clients", "16", "--shed-requests", "200", "--baseline-rev", "HEAD"],
    )
    servers = ("floor ", "off ", "on 4:2 ", "HEAD off ")
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith(servers)]
    assert {(row[0], row[-5]) for row in rows} == {
        (mode, clients) for mode in ("floor", "off", "on", "HEAD") for clients in "14"
    }
    worktrees = subprocess.run(["git", "-C", str(ROOT), "worktree", "list"], capture_output=True, text=True).stdout
    assert "baseline" not in worktrees  # the baseline revision's checkout is removed after the run
    assert all(row[-1] == "0" for row in rows), done.stdout
    shedding = [line for line in done.stdout.splitlines() if line.startswith("shedding")]
    assert [line.split("(")[1].split(",")[0] for line in shedding] == ["model server", "floor"], shedding
    for line in shedding:  # each refused some of the 16 clients past its limit of 8, and failed none it admitted
        assert " 0 failed" in line and not line.split("): ")[1].startswith("0 of"), line
