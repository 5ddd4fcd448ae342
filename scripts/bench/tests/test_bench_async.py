"""The bench's async phase: sync 2 workers against async 2 workers + 1 ps, with and without a straggler.

Real trainer processes at toy size for the phase; no timing assertions (a shared machine proves nothing about
speed): the records' shape, the refusal of bad flags, the straggler's signals, and the same-wall-time rule.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
import time

import pytest

from scripts.bench import async_modes, bench
from scripts.bench.tests.bench_runs import run_bench


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--straggler-stopped", "1"], "--straggler-stopped must be between 0 and 1"),
        (["--straggler-stopped", "0"], "--straggler-stopped must be between 0 and 1"),
        (["--straggler-period", "-0.2"], "--straggler-period must be a positive number of seconds"),
        (["--async-epochs", "0"], "--async-epochs must be at least 1"),
        (["--async-train-examples", "64"], "raise --async-train-examples or --async-epochs, or lower --async-batch"),
    ],
)
def test_bad_async_flags_are_refused_with_the_fix(flags, message):
    result = run_bench(*flags, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr


def test_no_async_skips_the_phase_and_its_checks():
    args = bench.parse_args(["--no-async", "--async-train-examples", "64"])
    assert args.no_async


def process_state(pid: int) -> str:
    """The kernel's one-letter state of a process: T when stopped by a signal, S or R when running."""
    stat = pathlib.Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_straggler_duty_cycle_stops_its_group_and_leaves_it_running():
    sleeper = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        cycle = async_modes.DutyCycle(sleeper.pid, stopped=0.5, period=0.2).start()
        seen = set()
        deadline = time.monotonic() + 30
        while not {"T", "S"} <= seen and time.monotonic() < deadline:
            seen.add(process_state(sleeper.pid))
            time.sleep(0.01)
        cycle.stop()
        assert {"T", "S"} <= seen  # held stopped, then let run, over and over
        assert process_state(sleeper.pid) == "S"  # stop() always leaves it running
    finally:
        sleeper.kill()
        sleeper.wait()
    # A group that has exited (the run ended first) is ignored.
    async_modes.DutyCycle(sleeper.pid, stopped=0.5, period=0.02).start().stop()


def run_record(examples_per_second: float, evaluations: list[tuple[float, float]], round_index: int = 0) -> dict:
    return {
        "examples_per_second": examples_per_second,
        "test_accuracy": evaluations[-1][1],
        "wall_seconds": evaluations[-1][0] + 5,
        "background_cpu_share": 0.0,
        "round": round_index,
        "evaluations": [
            {"epoch": epoch, "seconds": seconds, "test_accuracy": accuracy}
            for epoch, (seconds, accuracy) in enumerate(evaluations, start=1)
        ],
    }


def test_accuracy_after_the_same_wall_time_is_each_runs_latest_evaluation_when_the_sooner_one_ended():
    args = bench.parse_args(["--repeats", "1"])
    runs = {
        "sync_two_workers": [run_record(2000, [(10, 0.5), (12, 0.8), (14, 0.9)])],
        "async_two_workers": [run_record(2500, [(13, 0.7), (15, 0.85), (17, 0.9)])],
        "sync_two_workers_straggler": [run_record(1000, [(20, 0.5), (25, 0.8), (30, 0.9)])],
        "async_two_workers_straggler": [run_record(2000, [(16, 0.6), (18, 0.85), (22, 0.9)])],
    }
    phase = async_modes.summarize(runs, args)

    plain = phase["accuracy_after_same_wall_time"]["without straggler"]
    assert plain["per_round"][0]["seconds"] == 14  # sync printed its last evaluation first
    assert plain["test_accuracy"]["sync_two_workers"]["median"] == 0.9
    assert plain["test_accuracy"]["async_two_workers"]["median"] == 0.7  # its first, at 13 s
    slowed = phase["accuracy_after_same_wall_time"]["with straggler"]
    assert slowed["per_round"][0]["seconds"] == 22
    assert slowed["test_accuracy"]["sync_two_workers_straggler"]["median"] == 0.5
    assert slowed["test_accuracy"]["async_two_workers_straggler"]["median"] == 0.9
    assert phase["variants"]["sync_two_workers"]["summary"]["seconds_to_accuracy"]["median"] == 14
    assert phase["variants"]["async_two_workers"]["summary"]["runs_reaching_accuracy"] == 1
    assert phase["ratios"]["sync_straggler_over_sync"]["of_medians"] == 0.5
    assert phase["ratios"]["async_straggler_over_async"]["of_medians"] == 0.8
    assert phase["ratios"]["async_straggler_over_sync_straggler"]["per_round"] == [2.0]


def test_a_run_with_no_evaluation_by_then_says_so():
    early = run_record(2000, [(5, 0.9)])
    late = run_record(2000, [(9, 0.9)])
    assert async_modes.same_wall_time(early, late)["evaluations"] == [early["evaluations"][0], None]
