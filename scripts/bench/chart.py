"""Draws bench/results.json as one PNG: throughput, start-up, memory, input vs step (and the worker sweep and
the async phase, if run)."""

from __future__ import annotations

import pathlib
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on CI machines or in containers
import matplotlib.pyplot as plt

COLOURS = {"trainer_one_process": "#9ecae1", "trainer_two_workers": "#2171b5", "peer_two_workers": "#fd8d3c"}
MET, MISSED = "#238b45", "#cb181d"
# The bench's targets: bench.py checks the figures against them, the chart draws them as lines. The trainer against
# the tutorial peer has no target on shared cores (two workers on the two cores one process has cannot beat it by
# much); on separate cores it is efficiency against linear, the peer measured beside it (links.py).
TARGETS = {
    "links_unlimited_defaults": 0.95,
    "links_1gbit_defaults": 0.9,
    "links_100mbit_bf16": 0.7,
    "two_workers_over_one_process": 0.9,
    "time_to_first_step_seconds": 15.0,
    "first_step_after_group_formed_seconds": 2.0,
    "exit_seconds": 1.0,
    "peak_rss_bytes": 1.5e9,
    "input_over_step": 3.0,
}
INPUT_COLOURS = ("#74c476", "#2171b5")
ASYNC_COLOURS = {
    "sync_two_workers": "#2171b5",
    "async_two_workers": "#6a51a3",
    "sync_two_workers_straggler": "#9ecae1",
    "async_two_workers_straggler": "#bcbddc",
}


def _bars(axis, results: dict[str, Any], key: str, scale: float, use_max: bool, fmt: str) -> None:
    names = list(results["variants"])
    for position, name in enumerate(names):
        _bar(axis, position, results["variants"][name]["summary"][key], COLOURS.get(name, "grey"), fmt, scale, use_max)
    axis.set_xticks(range(len(names)), [results["variants"][name]["label"].replace(", ", "\n") for name in names])
    axis.grid(axis="y", alpha=0.3)


def _bar(
    axis, position: int, summary: dict[str, Any], colour: str, fmt: str = "{:,.0f}", scale: float = 1, use_max=False
) -> None:
    """One variant: a bar at its median (or max), whiskers from min to max, a dot per run, the figure inside."""
    height = (summary["max"] if use_max else summary["median"]) / scale
    low, high = summary["min"] / scale, summary["max"] / scale
    axis.bar(position, height, color=colour, width=0.6)
    if not use_max:
        axis.errorbar(position, height, yerr=[[height - low], [high - height]], color="black", capsize=5)
    points = summary["values"]
    axis.scatter([position] * len(points), [p / scale for p in points], color="black", s=10, zorder=3)
    # The median, written inside its bar so it cannot collide with whiskers or target lines.
    axis.text(
        position,
        height / 2,
        fmt.format(height),
        ha="center",
        va="center",
        fontsize=11,
        fontweight="bold",
        color="black",
        bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "none"},
    )


def _target_line(axis, value: float, text: str, met: bool) -> None:
    """A dashed line at the target, green when met, red when missed, named in the panel's legend."""
    colour = MET if met else MISSED
    axis.axhline(value, color=colour, linestyle="--", linewidth=1.2, label=f"{text} ({'met' if met else 'missed'})")
    # Head room for the legend above the tallest bar or line.
    axis.set_ylim(0, max(axis.get_ylim()[1], value) * 1.3)
    axis.legend(loc="upper right", fontsize=8, framealpha=0.9)


def _sweep(axis, sweep: list[dict[str, Any]], cpus: int) -> None:
    workers = [row["workers"] for row in sweep]
    measured = [row["examples_per_second"]["median"] for row in sweep]
    ideal = [measured[0] * n for n in workers]
    axis.plot(workers, ideal, linestyle="--", color="grey", label="linear scaling")
    axis.plot(workers, measured, marker="o", color=COLOURS["trainer_two_workers"], label="trainer (median)")
    for row, value in zip(sweep, measured, strict=True):
        axis.annotate(
            f"{100 * row['scaling_efficiency']:.0f}%",
            (row["workers"], value),
            textcoords="offset points",
            xytext=(0, 8),
            ha="center",
            fontsize=9,
        )
    axis.set_xticks(workers)
    axis.set_xlabel("workers (same per-worker batch); % = scaling efficiency")
    # Workers beyond the core count share cores, so the linear line is out of reach by construction there.
    axis.set_title(f"Scaling sweep (examples/s), all workers on these {cpus} CPUs")
    axis.set_xlim(min(workers) - 0.3, max(workers) + 0.3)
    axis.set_ylim(0, max(ideal + measured) * 1.15)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="upper left")


def _input(axis, inputs: dict[str, Any], met: bool) -> None:
    """One worker's input pipeline alone beside the step's demand on it, with the 3x line."""
    bars = [
        ("input pipeline alone\n(worker 0 of 2, decode)", inputs["input_pipeline_examples_per_second"]),
        ("training step\n(per worker, same files)", inputs["step_examples_per_second_per_worker"]),
    ]
    for position, ((_, summary), colour) in enumerate(zip(bars, INPUT_COLOURS, strict=True)):
        _bar(axis, position, summary, colour)
    axis.set_xticks(range(len(bars)), [label for label, _ in bars])
    axis.grid(axis="y", alpha=0.3)
    axis.set_title(f"Input vs step on TFRecord files (examples/s): {inputs['input_over_step']['of_medians']:.1f}x")
    need = TARGETS["input_over_step"] * inputs["step_examples_per_second_per_worker"]["median"]
    _target_line(axis, need, f"target {TARGETS['input_over_step']:g}x the step = {need:,.0f}", met)


def _async_throughput(axis, phase: dict[str, Any]) -> None:
    """Examples/s of sync and async, without and with the straggler, with the slow-down ratios."""
    variants = phase["variants"]
    for position, (name, variant) in enumerate(variants.items()):
        _bar(axis, position, variant["summary"]["examples_per_second"], ASYNC_COLOURS.get(name, "grey"))
    axis.set_xticks(range(len(variants)), [variant["label"].replace(", ", "\n") for variant in variants.values()])
    axis.grid(axis="y", alpha=0.3)
    ratios = phase["ratios"]
    straggler = phase["config"]["straggler"]
    axis.set_title(
        f"Sync vs async (examples/s); straggler {straggler['replica']} stopped "
        f"{100 * straggler['stopped_share']:.0f}% of the time\nwith it: sync "
        f"{ratios['sync_straggler_over_sync']['of_medians']:.2f}x, async "
        f"{ratios['async_straggler_over_async']['of_medians']:.2f}x of their own rate without it",
        fontsize=10,
    )


def _async_accuracy(axis, phase: dict[str, Any]) -> None:
    """Test accuracy after each epoch against seconds from launch, every run (start-up included)."""
    for name, variant in phase["variants"].items():
        for run in variant["runs"]:
            seconds = [evaluation["seconds"] for evaluation in run["evaluations"]]
            accuracy = [evaluation["test_accuracy"] for evaluation in run["evaluations"]]
            axis.plot(
                seconds,
                accuracy,
                marker="o",
                color=ASYNC_COLOURS.get(name, "grey"),
                label=variant["label"] if run["round"] == 0 else None,
            )
    axis.set_xlabel("seconds from the launch of the processes (start-up included)")
    axis.set_ylabel("test accuracy after the epoch")
    reached = phase["config"]["reached_accuracy"]
    axis.axhline(reached, color="grey", linestyle=":", linewidth=1, label=f"{reached:g}: within 0.01 of the best")
    axis.set_title(f"Test accuracy after each epoch over wall time\n{phase['config']['data']}", fontsize=10)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8, loc="lower right")


LINK_COLOURS = {
    "one_batch": "#9ecae1",
    "bf16": "#6baed6",
    "buckets": "#2171b5",
    "buckets_bf16": "#238b45",
    "buckets_fp16": "#74c476",
    "peer": "#fd8d3c",
}


def _links(axis, links: dict[str, Any], met: dict[str, bool]) -> None:
    """Efficiency against linear (2 x one pinned worker) per link rate, one bar per variant, targets as marks."""
    table = links["table"]
    rates = list(dict.fromkeys(row["rate"] for row in table))
    variants = list(dict.fromkeys(row["variant"] for row in table))
    width = 0.8 / len(variants)
    for v_index, name in enumerate(variants):
        rows = [next(row for row in table if row["rate"] == rate and row["variant"] == name) for rate in rates]
        positions = [r_index + (v_index - (len(variants) - 1) / 2) * width for r_index in range(len(rates))]
        axis.bar(positions, [row["efficiency"] for row in rows], width=width, color=LINK_COLOURS.get(name, "grey"),
                 label=rows[0]["label"])  # fmt: skip
        for position, row in zip(positions, rows, strict=True):
            axis.text(position, row["efficiency"] + 0.01, f"{row['efficiency']:.2f}", ha="center", fontsize=7,
                      clip_on=True)  # fmt: skip
    for target in links.get("targets", []):
        if target["rate"] in rates:
            x = rates.index(target["rate"])
            axis.hlines(TARGETS[target["key"]], x - 0.45, x + 0.45, colors=MET if met.get(target["key"]) else MISSED,
                        linestyles="--", linewidth=1.2)  # fmt: skip
    axis.axhline(1.0, color="grey", linewidth=0.8, linestyle=":")
    if "trainer" in links.get("side_by_side_efficiency", {}):  # results.json files written before it lack it
        axis.axhline(links["side_by_side_efficiency"]["trainer"], color="black", linewidth=0.8, linestyle="-.",
                     label="trainer x 2 side by side, never talking: this machine's ceiling")  # fmt: skip
    axis.set_xticks(range(len(rates)), rates)
    axis.set_ylim(0, max(1.25, 1.15 * max(row["efficiency"] for row in table)))
    axis.set_ylabel("2 workers / (2 x 1 worker alone)")
    axis.set_title("Separate machines: each worker in its own namespace and core, link rate-limited (tbf)\n"
                   "dashes: targets (green met, red missed); the peer against the peer alone", fontsize=10)  # fmt: skip
    axis.grid(axis="y", alpha=0.3)
    axis.legend(fontsize=7, loc="upper right", ncol=2)


def draw(results: dict[str, Any], path: pathlib.Path) -> None:
    """Writes the chart as PNG to `path` (whatever its suffix)."""
    sweep = results.get("sweep")
    phase = results.get("async")
    links = results.get("links")
    rows = 2 + bool(phase) + bool(links)
    figure, grid = plt.subplots(rows, 3 if sweep else 2, figsize=(13 if sweep else 11, 5.6 * rows), squeeze=False)
    axes = grid.flatten()
    met = {row["key"]: row["met"] for row in results["targets"]}
    one = results["variants"]["trainer_one_process"]["summary"]["examples_per_second"]["median"]

    _bars(axes[0], results, "examples_per_second", 1, False, "{:,.0f}")
    axes[0].set_title("Throughput (examples/s, higher is better)")
    over_one = TARGETS["two_workers_over_one_process"] * one
    _target_line(
        axes[0],
        over_one,
        f"target {TARGETS['two_workers_over_one_process']:g}x 1 process = {over_one:,.0f}",
        met["two_workers_over_one_process"],
    )

    _bars(axes[1], results, "time_to_first_step_seconds", 1, False, "{:.1f} s")
    axes[1].set_title("Process start to first step (s, lower is better)")
    first_step = TARGETS["time_to_first_step_seconds"]
    _target_line(axes[1], first_step, f"target {first_step:g} s", met["time_to_first_step_seconds"])

    _bars(axes[2], results, "peak_rss_bytes_per_worker", 1e9, True, "{:.2f} GB")
    axes[2].set_title("Peak RSS per worker (GB, lower is better)")
    rss_gb = TARGETS["peak_rss_bytes"] / 1e9
    _target_line(axes[2], rss_gb, f"target {rss_gb:g} GB", met["peak_rss_bytes"])

    _input(axes[3], results["input"], met["input_over_step"])
    columns = 3 if sweep else 2
    if sweep:
        _sweep(axes[4], sweep, results["machine"]["logical_cpus"])
        axes[5].set_visible(False)
    row = 2
    if phase:
        _async_throughput(axes[row * columns], phase)
        _async_accuracy(axes[row * columns + 1], phase)
        for axis in axes[row * columns + 2 : (row + 1) * columns]:
            axis.set_visible(False)
        row += 1
    if links:
        # One wide panel: the row's axes merged.
        spec = axes[row * columns].get_subplotspec().get_gridspec()
        for axis in axes[row * columns : (row + 1) * columns]:
            axis.remove()
        _links(figure.add_subplot(spec[row, :]), links, met)

    ratios = results["ratios"]
    config, machine = results["config"], results["machine"]
    tensorflow = results["versions"].get("tensorflow") or results["versions"].get("tensorflow-cpu")
    figure.suptitle(
        f"trainer 2 workers / tutorial fit (same shared cores): {ratios['trainer_over_peer']['of_medians']:.2f}x   |   "
        f"trainer 2 workers / 1 process: {ratios['two_workers_over_one_process']['of_medians']:.2f}x\n"
        f"book CNN, synthetic 28x28x1, global batch {config['global_batch_size']}, {config['steps']} steps, "
        f"{config['repeats']} interleaved runs each (bar: median, whiskers: min-max, dots: runs)"
        f"{', trainer flags: ' + config['trainer_flags'] if config.get('trainer_flags') else ''}\n"
        f"{machine['cpu_model']}, {machine['logical_cpus']} CPUs, TensorFlow {tensorflow}, "
        f"{results['started_utc'][:10]}, revision {results['versions']['project_revision']}",
        fontsize=10,
    )
    if results["warnings"]:
        figure.text(
            0.5, 0.005, "\n".join(results["warnings"]), ha="center", va="bottom", fontsize=8, color=MISSED, wrap=True
        )
    figure.tight_layout(rect=(0, 0.04 if results["warnings"] else 0, 1, 1))
    figure.savefig(path, format="png", dpi=110)
    plt.close(figure)
