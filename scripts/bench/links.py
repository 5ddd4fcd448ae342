"""The "separate machines" phase of `make bench`: two workers, each alone on its core and in its own network
namespace, over a veth link rate-limited per run (scripts/bench/netns.py), against one pinned worker alone.

Per round, interleaved: the trainer and the tutorial peer each alone (pinned to core 0, one thread) and side by
side (two copies that never talk, copy i on core i: what this machine gives any two programs at once), then at
every link rate (`--link-rates`, default unlimited, 10 Gbit/s, 1 Gbit/s, 100 Mbit/s) every variant of VARIANTS
with two workers (worker i on core i). Efficiency = two workers' examples/s / (2 x the same program alone):
how close two machines come to twice one. Two cores of one machine are not two machines (they share caches,
memory bandwidth and, on a VM, the host's cores), so the side-by-side pair is this machine's ceiling, and each
row is also given against it: what the link and the all-reduce cost, apart from the cores' contention.
The trainer variants differ only in how the gradients cross the link (trainer/distribution/allreduce.py): one
all-reduce after the backward pass, buckets overlapping it, and 16-bit gradients. Then the scaling model is refit
from the one-batch runs (see `fit_model`) and checked at every rate.
Where namespaces cannot be made (not root, no iproute2), the phase prints one line and is skipped.

This phase alone, with the bench's own options (writes OUTPUT_DIR/links.json):
    python -m scripts.bench.bench --links-only --repeats 3
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
from collections.abc import Callable
from functools import partial
from typing import Any

from trainer.base.atomic_file import write_json
from trainer.settings.config import Config

from . import netns
from .chart import TARGETS
from .runs import BenchError, Placement, run_once, run_side_by_side, scratch_dir, spread

RATES = {"unlimited": None, "10gbit": 10e9, "1gbit": 1e9, "100mbit": 100e6}
# The cnn's gradients on 28x28x1 images, 10 classes: 93,322 float32 parameters (step_costs.py measures the same).
GRADIENT_BYTES = 373_288
# The bucket size the trainer variants use; the default of --gradient-bucket-bytes is what docs/bench.md measured.
BUCKET_BYTES = 65_536
# One core's work per worker; inter-op threads as the trainer sets them for one thread (docs/bench.md).
PINNED = ["--threads", "1"]
VARIANTS: dict[str, dict[str, Any]] = {
    "one_batch": {
        "label": "trainer, one all-reduce after the backward",
        "program": "trainer",
        "flags": ["--gradient-bucket-bytes", "0", "--gradient-compression", "none"],
    },
    "bf16": {
        "label": "trainer, one all-reduce, bf16",
        "program": "trainer",
        "flags": ["--gradient-bucket-bytes", "0", "--gradient-compression", "bf16"],
    },
    "buckets": {
        "label": f"trainer, buckets of {BUCKET_BYTES // 1024} KiB",
        "program": "trainer",
        "flags": ["--gradient-bucket-bytes", str(BUCKET_BYTES), "--gradient-compression", "none"],
    },
    "buckets_bf16": {
        "label": "trainer, buckets, bf16",
        "program": "trainer",
        "flags": ["--gradient-bucket-bytes", str(BUCKET_BYTES), "--gradient-compression", "bf16"],
    },
    "buckets_fp16": {
        "label": "trainer, buckets, fp16",
        "program": "trainer",
        "flags": ["--gradient-bucket-bytes", str(BUCKET_BYTES), "--gradient-compression", "fp16"],
    },
    "peer": {"label": "tutorial fit", "program": "peer", "flags": []},
}
# The variants the scaling model predicts (one all-reduce after the backward pass) and their bytes on the wire.
NO_OVERLAP_WIRE_BYTES = {"one_batch": GRADIENT_BYTES, "bf16": GRADIENT_BYTES / 2}
ALONE = {"trainer": "trainer_alone", "peer": "peer_alone"}
SIDE_BY_SIDE = {"trainer": "trainer_side_by_side", "peer": "peer_side_by_side"}
# The targets (chart.TARGETS) by key: (rate, variant); "defaults" is the variant the trainer's defaults run.
LINK_TARGETS = {
    "links_unlimited_defaults": ("unlimited", "defaults"),
    "links_1gbit_defaults": ("1gbit", "defaults"),
    "links_100mbit_bf16": ("100mbit", "buckets_bf16"),
}
# Above this share of the CPUs taken by other processes, --link-quiet-retries runs a run again.
QUIET_SHARE = 0.05
# The scaling model's fit is checked against the measurement within this share.
MODEL_TOLERANCE = 0.10
MORE_WORKERS = (2, 4, 8, 16, 64)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("separate machines (network namespaces joined by a rate-limited veth pair)")
    group.add_argument("--no-links", action="store_true", help="skip the separate-machines phase")
    group.add_argument(
        "--links-only", action="store_true", help="run only the separate-machines phase; write links.json"
    )
    group.add_argument(
        "--link-rates",
        default=",".join(RATES),
        help=f"comma-separated link rates, from {', '.join(RATES)}",
    )
    group.add_argument(
        "--link-quiet-retries",
        type=int,
        default=0,
        help="run a two-worker or alone run again, up to this many times, while other processes took more than "
        f"{100 * QUIET_SHARE:g}%% of the CPUs during it; the quietest is kept (for shared machines)",
    )
    group.add_argument(
        "--link-variants",
        default=",".join(VARIANTS),
        help=f"comma-separated variants at every rate, from {', '.join(VARIANTS)}",
    )


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.link_quiet_retries < 0:
        parser.error(f"--link-quiet-retries must be 0 or more, got {args.link_quiet_retries}")
    for option, given, known in (
        ("--link-rates", args.link_rates, RATES),
        ("--link-variants", args.link_variants, VARIANTS),
    ):
        unknown = [name for name in given.split(",") if name not in known]
        if unknown or not given:
            parser.error(f"{option}: unknown {', '.join(unknown) or 'empty list'}; choose from {', '.join(known)}")


def run_link_rounds(args: argparse.Namespace, scratch: pathlib.Path) -> dict[str, Any] | None:
    """Every round: both programs alone and side by side, then every rate x variant; None (after one line) where
    namespaces cannot be made."""
    reason = netns.unavailable()
    if reason:
        print(f"[links] separate-machines phase skipped: {reason}", flush=True)
        return None
    rates = args.link_rates.split(",")
    variants = args.link_variants.split(",")
    per_worker = args.global_batch_size // 2
    runs: list[dict[str, Any]] = []
    qdiscs: dict[str, list[str]] = {}
    pinned = Placement(wrap=on_core)
    programs = sorted({VARIANTS[name]["program"] for name in variants})
    with netns.linked_namespaces() as link:
        for round_index in range(args.repeats):
            for program in programs:
                by_itself = partial(run_once, program, 1, per_worker, args, extra_flags=PINNED, placement=ALONE_ON_CORE)
                two_apart = partial(run_side_by_side, program, per_worker, args, extra_flags=PINNED, placement=pinned)
                for name, run in ((ALONE[program], by_itself), (SIDE_BY_SIDE[program], two_apart)):
                    tag = f"[links round {round_index + 1}/{args.repeats}] {name}"
                    runs.append(measure(tag, run, args, scratch / f"links-{name}-{round_index}", None, name, program))
                    runs[-1]["round"] = round_index
            for rate in rates:
                link.set_rate(RATES[rate])
                qdiscs[rate] = link.qdiscs()
                for name in variants:
                    variant = VARIANTS[name]
                    tag = f"[links round {round_index + 1}/{args.repeats}] {rate} {name}"
                    run_dir = scratch / f"links-{rate}-{name}-{round_index}"
                    flags = [*PINNED, *variant["flags"]]
                    pair = partial(
                        run_once, variant["program"], 2, per_worker, args, extra_flags=flags, placement=apart(link)
                    )
                    runs.append(measure(tag, pair, args, run_dir, rate, name, variant["program"]))
                    runs[-1]["round"] = round_index
    return {"runs": runs, "qdiscs": qdiscs, "rates": rates, "variants": variants, "programs": programs}


def on_core(index: int, argv: list[str]) -> list[str]:
    """argv pinned to core `index` (worker i on core i, of the two this phase uses)."""
    return ["taskset", "-c", str(index % 2), *argv]


# One worker alone, as the pairs' worker 0 runs: on core 0, in the host's namespace.
ALONE_ON_CORE = Placement(wrap=lambda _index, argv: on_core(0, argv))


def apart(link: netns.Link) -> Placement:
    """Worker i in namespace i and on core i, the others reaching it at its namespace's address."""
    return Placement(
        host=lambda index: link.addresses[index], wrap=lambda index, argv: link.run_in(index, on_core(index, argv))
    )


def measure(
    tag: str,
    run: Callable[[pathlib.Path], dict[str, Any]],
    args: argparse.Namespace,
    run_dir: pathlib.Path,
    rate: str | None,
    name: str,
    program: str,
) -> dict[str, Any]:
    """run(a fresh directory), again while other processes took the CPUs (--link-quiet-retries); the quietest, with
    its rate and variant. A BenchError names the run."""
    tries: list[dict[str, Any]] = []
    while not tries or (len(tries) <= args.link_quiet_retries and tries[-1]["background_cpu_share"] > QUIET_SHARE):
        print(f"{tag}{f' (again, {len(tries)})' if tries else ''} ...", end=" ", flush=True)
        try:
            result = run(run_dir / f"try-{len(tries)}")
        except BenchError as error:
            raise BenchError(f"separate machines, {name if rate is None else f'{rate} {name}'}: {error}") from None
        print(
            f"{result['examples_per_second']:,.0f} ex/s, other processes {100 * result['background_cpu_share']:.0f}% "
            f"of the CPUs",
            flush=True,
        )
        tries.append(result)
    quietest = min(tries, key=lambda attempt: attempt["background_cpu_share"])
    return {"rate": rate, "variant": name, "program": program, "tries": len(tries), **quietest}


def summarize(phase: dict[str, Any], per_worker_batch: int) -> dict[str, Any]:
    runs = phase["runs"]
    alone, side_by_side = (
        {program: spread([run["examples_per_second"] for run in runs if run["variant"] == names[program]])
         for program in phase["programs"]}
        for names in (ALONE, SIDE_BY_SIDE)
    )  # fmt: skip
    table = []
    for rate in phase["rates"]:
        for name in phase["variants"]:
            mine = [run for run in runs if run["rate"] == rate and run["variant"] == name]
            program = VARIANTS[name]["program"]
            singles = [run for run in runs if run["variant"] == ALONE[program]]
            eps = spread([run["examples_per_second"] for run in mine])
            table.append(
                {
                    "rate": rate,
                    "variant": name,
                    "label": VARIANTS[name]["label"],
                    "examples_per_second": eps,
                    "efficiency": eps["median"] / (2 * alone[program]["median"]),
                    # Against two copies that never talk: what the link and the all-reduce cost on their own.
                    "of_side_by_side": eps["median"] / side_by_side[program]["median"],
                    # Each round's pair against the same round's single worker: the drift-free figure.
                    "efficiency_per_round": [
                        pair["examples_per_second"] / (2 * single["examples_per_second"])
                        for pair, single in zip(mine, singles, strict=True)
                    ],
                }
            )
    model = fit_model(table, alone, side_by_side, per_worker_batch) if "one_batch" in phase["variants"] else None
    shares = [run["background_cpu_share"] for run in runs]
    return {
        "alone_examples_per_second": alone,
        "side_by_side_examples_per_second": side_by_side,
        # This machine's ceiling for two workers: two copies that never talk against 2 x one alone.
        "side_by_side_efficiency": {
            program: side_by_side[program]["median"] / (2 * alone[program]["median"]) for program in alone
        },
        "table": table,
        "scaling_model": model,
        "qdiscs": phase["qdiscs"],
        "background_cpu_share": spread(shares),
        "config": {
            "workers": "2, worker i pinned to core i (taskset), each in its own network namespace",
            "alone": "1 worker pinned to core 0, same per-worker batch",
            "side_by_side": "2 single workers that never talk, started together, worker i pinned to core i",
            "trainer_flags": PINNED,
            "per_worker_batch_size": per_worker_batch,
            "burst": f"rate x {netns.BURST_SECONDS * 1000:g} ms, at least {netns.MIN_BURST_BYTES // 1024} KiB",
            "gradient_bytes": GRADIENT_BYTES,
        },
    }


def fit_model(
    table: list[dict[str, Any]], alone: dict[str, Any], side_by_side: dict[str, Any], per_worker_batch: int
) -> dict[str, Any]:
    """The all-reduce's cost from the one-batch runs: step(rate) - compute = overhead + slowdown x wire(rate),
    wire(rate) = the gradient bytes at the nominal rate (0 unlimited), least squares over the rates. compute: a
    step of the side-by-side copies (the cores as slow as the pair finds them); overhead: the per-step fixed cost
    of the all-reduce (hops, hand-offs, waiting); slowdown: nominal rate / the rate achieved. Then every rate
    predicted back, and the efficiency for N workers on separate machines (no shared cores: compute = one worker
    alone) on a ring: compute / (compute + (N-1) x overhead + 2 (N-1)/N x wire(rate) x slowdown), for float32 and
    bf16 gradients."""
    compute = per_worker_batch / alone["trainer"]["median"]
    shared_compute = 2 * per_worker_batch / side_by_side["trainer"]["median"]
    rows = [row for row in table if row["variant"] == "one_batch"]
    points = []
    for row in rows:
        step = 2 * per_worker_batch / row["examples_per_second"]["median"]
        points.append((_wire(row["rate"], GRADIENT_BYTES), step - shared_compute, row["rate"]))
    overhead, slowdown = _least_squares([(x, y) for x, y, _ in points])
    checks = []
    for row in table:
        # The model has no overlap: it predicts the one-batch variants; buckets beat it by what they hide.
        if row["variant"] not in NO_OVERLAP_WIRE_BYTES or row["rate"] not in RATES:
            continue
        wire_bytes = NO_OVERLAP_WIRE_BYTES[row["variant"]]
        predicted = 2 * per_worker_batch / (shared_compute + overhead + slowdown * _wire(row["rate"], wire_bytes))
        measured = row["examples_per_second"]["median"]
        checks.append(
            {
                "rate": row["rate"],
                "variant": row["variant"],
                "predicted_examples_per_second": predicted,
                "measured_examples_per_second": measured,
                "error": predicted / measured - 1,
                "within_tolerance": abs(predicted / measured - 1) <= MODEL_TOLERANCE,
            }
        )
    more = {}
    for rate, bits in RATES.items():
        if bits is None:
            continue
        for wire_name, wire_bytes in (("float32", GRADIENT_BYTES), ("bf16", GRADIENT_BYTES / 2)):
            more[f"{rate} {wire_name}"] = {
                str(n): compute / (compute + (n - 1) * overhead + 2 * (n - 1) / n * slowdown * wire_bytes * 8 / bits)
                for n in MORE_WORKERS
            }
    return {
        "compute_ms": 1000 * compute,
        "side_by_side_compute_ms": 1000 * shared_compute,
        "overhead_ms": 1000 * overhead,
        "slowdown": slowdown,
        "points": [{"rate": rate, "wire_ms": 1000 * x, "extra_ms": 1000 * y} for x, y, rate in points],
        "checks": checks,
        "efficiency_by_workers": more,
    }


def _wire(rate: str, wire_bytes: float) -> float:
    """Seconds the bytes take at the link's nominal rate; unlimited: 0 (veth moves them at memory speed)."""
    bits = RATES[rate]
    return 0.0 if bits is None else wire_bytes * 8 / bits


def _least_squares(points: list[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of y = a + b x; with one distinct x, the mean and a slope of 1."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    spread_x = sum((x - mean_x) ** 2 for x in xs)
    if spread_x == 0:
        return mean_y, 1.0
    slope = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread_x
    return mean_y - slope * mean_x, slope


def defaults_variant() -> str | None:
    """The trainer variant whose flags are the trainer's defaults."""
    defaults = Config()
    for name, variant in VARIANTS.items():
        flags = dict(zip(variant["flags"][::2], variant["flags"][1::2], strict=True))
        if variant["program"] == "trainer" and flags == {
            "--gradient-bucket-bytes": str(defaults.gradient_bucket_bytes),
            "--gradient-compression": defaults.gradient_compression,
        }:
            return name
    return None


def check_targets(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The targets whose rate and variant ran, in bench.check_targets' form; also noted in the summary for the chart."""
    rows = []
    for key, (rate, variant) in LINK_TARGETS.items():
        name = defaults_variant() if variant == "defaults" else variant
        row = next((r for r in summary["table"] if r["rate"] == rate and r["variant"] == name), None)
        if row is None:
            continue
        peer = next((r for r in summary["table"] if r["rate"] == rate and r["variant"] == "peer"), None)
        rows.append(
            {
                "key": key,
                "name": f"separate machines, {rate}, {row['label']}: efficiency against 2 x one worker alone"
                + (f" (tutorial fit: {peer['efficiency']:.2f})" if peer else "")
                + f"; {row['of_side_by_side']:.2f} of two side by side, this machine's ceiling "
                f"({summary['side_by_side_efficiency']['trainer']:.2f})",
                "measured": row["efficiency"],
                "target": f">= {TARGETS[key]:g}",
                "met": row["efficiency"] >= TARGETS[key],
                "rate": rate,
            }
        )
    summary["targets"] = rows
    return [{k: v for k, v in row.items() if k != "rate"} for row in rows]


def print_summary(summary: dict[str, Any]) -> None:
    alone, side_by_side = summary["alone_examples_per_second"], summary["side_by_side_examples_per_second"]
    print("\nseparate machines (each worker in its own namespace and on its own core, one thread)")
    for program, figures in alone.items():
        print(
            f"  {program}: alone {figures['median']:,.0f} ex/s; two side by side, never talking, "
            f"{side_by_side[program]['median']:,.0f} ex/s = {summary['side_by_side_efficiency'][program]:.2f} of "
            f"linear (this machine's ceiling for two workers)"
        )
    print(
        f"{'link':<11}{'variant':<16}{'examples/s (median, min-max)':>32}{'efficiency':>12}{'of ceiling':>12}"
        f"  efficiency per round"
    )
    for row in summary["table"]:
        eps = row["examples_per_second"]
        print(
            f"{row['rate']:<11}{row['variant']:<16}{eps['median']:>14,.0f} ({eps['min']:,.0f}-{eps['max']:,.0f})"
            f"{'':>4}{row['efficiency']:>12.2f}{row['of_side_by_side']:>12.2f}"
            f"  {', '.join(f'{e:.2f}' for e in row['efficiency_per_round'])}"
        )
    model = summary["scaling_model"]
    if model:
        print(
            f"scaling model (one-batch runs): compute {model['compute_ms']:.1f} ms/step alone, "
            f"{model['side_by_side_compute_ms']:.1f} side by side; all-reduce overhead {model['overhead_ms']:.1f} "
            f"ms/step, the link at 1/{model['slowdown']:.2f} of its nominal rate"
        )
        for check in model["checks"]:
            print(
                f"  {check['rate']:<10} {check['variant']:<13} predicted {check['predicted_examples_per_second']:,.0f}"
                f" measured {check['measured_examples_per_second']:,.0f} ex/s ({100 * check['error']:+.0f}%"
                f"{'' if check['within_tolerance'] else ', outside 10%'})"
            )
        for link_and_type, by_workers in model["efficiency_by_workers"].items():
            print(
                f"  predicted efficiency, {link_and_type}: "
                + ", ".join(f"{n} workers {100 * e:.0f}%" for n, e in by_workers.items())
            )
    share = summary["background_cpu_share"]
    if share["max"] > 0.05:
        print(f"warning: other processes took up to {100 * share['max']:.0f}% of the CPUs during these runs")


def run_alone(args: argparse.Namespace) -> int:
    """The phase alone (`make bench` with --links-only): links.json in --output-dir."""
    with scratch_dir("bench-links-") as scratch:
        phase = run_link_rounds(args, scratch)
    if phase is None:
        return 0
    summary = summarize(phase, args.global_batch_size // 2)
    targets = check_targets(summary)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_json(str(args.output_dir / "links.json"), {"links": summary, "runs": phase["runs"]}, sort_keys=False)
    print_summary(summary)
    for target in targets:
        print(
            f"{'MET   ' if target['met'] else 'MISSED'} {target['name']}: {target['measured']:.2f} ({target['target']})"
        )
    print(f"\nwrote {args.output_dir / 'links.json'}")
    return 0
