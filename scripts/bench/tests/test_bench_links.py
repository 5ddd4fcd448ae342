"""The separate-machines phase of `make bench` (scripts/bench/links.py, scripts/bench/netns.py): real namespaces, a
real rate-limited veth pair and real trainer and peer processes, at toy size; and that nothing is left behind.

No timing assertions: the figures' structure and the cleanup are what is checked.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys

import pytest
from matplotlib import pyplot

from scripts.bench import bench, chart, links, netns

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
needs_namespaces = pytest.mark.skipif(bool(netns.unavailable()), reason=str(netns.unavailable()))


def namespaces_of(pid: int) -> list[str]:
    return [name for name in netns.ours() if name.startswith(f"{netns.PREFIX}-{pid}-")]


def test_without_root_or_iproute2_the_phase_says_why_in_one_line_and_is_skipped(tmp_path):
    script = (
        "import argparse, pathlib; from scripts.bench import links; "
        "print(links.run_link_rounds(argparse.Namespace(), pathlib.Path('.')))"
    )
    # No ip, tc or taskset on the PATH (the interpreter is named by its full path).
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env={**os.environ, "PATH": str(tmp_path)}, capture_output=True,
        text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    if os.geteuid() == 0:
        assert lines == ["[links] separate-machines phase skipped: ip, tc, taskset not found: install iproute2 (ip, "
                         "tc) and util-linux (taskset)", "None"]  # fmt: skip
    else:
        assert lines[0].startswith("[links] separate-machines phase skipped: making network namespaces needs root")


@needs_namespaces
def test_namespaces_are_removed_on_sigterm_and_orphans_of_a_killed_bench_by_the_next(tmp_path):
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; from scripts.bench import netns\n"
         "with netns.linked_namespaces() as link:\n    link.set_rate(1e8)\n    print('ready', flush=True)\n"
         "    time.sleep(120)"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
    assert len(namespaces_of(holder.pid)) == 2
    holder.send_signal(signal.SIGTERM)
    assert holder.wait(timeout=30) == 128 + signal.SIGTERM
    assert namespaces_of(holder.pid) == []

    killed = subprocess.Popen(
        [sys.executable, "-c", "import time; from scripts.bench import netns\n"
         "with netns.linked_namespaces():\n    print('ready', flush=True)\n    time.sleep(120)"],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert killed.stdout is not None and killed.stdout.readline().strip() == "ready"
    killed.kill()
    killed.wait(timeout=30)
    assert len(namespaces_of(killed.pid)) == 2  # SIGKILL: nothing ran
    removed = netns.remove_orphans()
    assert sorted(removed) == sorted(f"{netns.PREFIX}-{killed.pid}-{i}" for i in (0, 1))
    assert namespaces_of(killed.pid) == []


ALONE_AND_SIDE_BY_SIDE = ("alone_examples_per_second", "side_by_side_examples_per_second")


@needs_namespaces
@pytest.mark.slow
def test_a_tiny_separate_machines_phase_measures_every_rate_and_variant_and_leaves_nothing(tmp_path):
    host_links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    host_qdiscs = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    args = argparse.Namespace(
        steps=48, warmup_steps=16, repeats=1, global_batch_size=16, timeout=300,
        trainer_flags=["--steps-per-loop", "8"], link_rates="unlimited,100mbit",
        link_variants="one_batch,bf16,buckets_bf16,peer", link_quiet_retries=0,
    )  # fmt: skip
    phase = links.run_link_rounds(args, tmp_path)
    assert phase is not None
    assert netns.ours() == [] or namespaces_of(os.getpid()) == []
    assert subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout == host_links
    assert subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout == host_qdiscs
    assert "rate 100Mbit" in phase["qdiscs"]["100mbit"][0] and "rate 100Mbit" in phase["qdiscs"]["100mbit"][1]
    assert "tbf" not in " ".join(phase["qdiscs"]["unlimited"])

    summary = links.summarize(phase, per_worker_batch=8)
    assert set(summary["alone_examples_per_second"]) == {"trainer", "peer"}
    # Two copies that never talk ran together, each on its own core: the machine's ceiling for a pair.
    for program in ("trainer", "peer"):
        assert summary["side_by_side_examples_per_second"][program]["median"] > 0
        # A ratio of two timings: how high it comes depends on what else shares the 2 cores, so only its definition
        # is checked here, never a bound.
        alone_rate, paired_rate = (summary[key][program]["median"] for key in ALONE_AND_SIDE_BY_SIDE)
        assert summary["side_by_side_efficiency"][program] == pytest.approx(paired_rate / (2 * alone_rate))
        copies = tmp_path / f"links-{program}_side_by_side-0" / "try-0"
        assert sorted(path.name for path in copies.iterdir()) == ["copy-0", "copy-1"]
        for copy in ("copy-0", "copy-1"):
            log = (copies / copy / "worker-0.log").read_text()
            assert "joining the group" not in log, log[-2000:]
    side_by_side = next(run for run in phase["runs"] if run["variant"] == "trainer_side_by_side")
    assert len(side_by_side["copies_examples_per_second"]) == 2 and len(side_by_side["cpu_seconds"]) == 2
    assert [(row["rate"], row["variant"]) for row in summary["table"]] == [
        (rate, variant)
        for rate in ("unlimited", "100mbit")
        for variant in ("one_batch", "bf16", "buckets_bf16", "peer")
    ]
    for row in summary["table"]:
        assert row["examples_per_second"]["median"] > 0 and row["efficiency"] > 0 and row["of_side_by_side"] > 0
        assert len(row["efficiency_per_round"]) == 1
    model = summary["scaling_model"]
    assert model["compute_ms"] > 0 and len(model["points"]) == 2
    assert {(check["rate"], check["variant"]) for check in model["checks"]} == {
        (rate, variant) for rate in ("unlimited", "100mbit") for variant in ("one_batch", "bf16")
    }
    assert list(model["efficiency_by_workers"]["1gbit bf16"]) == ["2", "4", "8", "16", "64"]
    targets = links.check_targets(summary)
    assert {target["key"] for target in targets} == {"links_100mbit_bf16"} | (
        {"links_unlimited_defaults"} if links.defaults_variant() == "one_batch" else set()
    )
    # The workers met at the namespaces' own addresses, not on loopback.
    for index in (0, 1):
        log = (tmp_path / "links-100mbit-one_batch-0" / "try-0" / f"worker-{index}.log").read_text()
        assert f"joining the group led by {netns.SUBNET}.1:" in log, log[-2000:]
    # The chart's panel for the phase, as make bench draws it from results.json's "links".
    figure, axis = pyplot.subplots()
    chart._links(axis, summary, {target["key"]: target["met"] for target in targets})
    figure.savefig(tmp_path / "links.png")
    assert (tmp_path / "links.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    # One bar per rate and variant (drawn variant by variant), each as tall as its efficiency.
    assert sorted(bar.get_height() for bar in axis.patches) == sorted(row["efficiency"] for row in summary["table"])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--link-rates", "1gbit,2gbit"], "--link-rates: unknown 2gbit; choose from unlimited, 10gbit, 1gbit, 100mbit"),
        (["--link-variants", "zip"], "--link-variants: unknown zip; choose from one_batch, bf16, buckets"),
        (["--link-quiet-retries", "-1"], "--link-quiet-retries must be 0 or more"),
    ],
)
def test_bad_link_flags_are_refused_with_the_choices(flags, message, capsys):
    with pytest.raises(SystemExit) as stopped:
        bench.parse_args(flags)
    assert stopped.value.code == 2
    assert message in capsys.readouterr().err
