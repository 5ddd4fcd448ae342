"""`make bench`: the trainer against the tutorial-style peer, on this machine, in one session.

Runs, interleaved round by round so machine drift hits every variant alike:
  trainer_one_process  python -m trainer, no TF_CONFIG, global batch G
  trainer_two_workers  python -m trainer, two local workers, per-worker batch G/2
  peer_two_workers     scripts/bench/tutorial_fit.py (tf-keras model.fit), two local workers, G/2 each
Each run reports steady-state examples/s (warm-up excluded), seconds from process
start to the first finished step, and the peak RSS of every worker (from the
kernel's accounting of the exited process). Then, on TFRecord files written by trainer.data.records (PNG),
interleaved the same way:
  input_pipeline       worker 0 of 2's input pipeline alone (scripts/bench/input_pipeline.py, decode included)
  trainer_on_files     python -m trainer, two local workers on the same files, --cache none
and the ratio of the first to the second's examples/s per worker (the step's demand on one worker's input),
which must be at least 3: input never starves the step. Then the async phase (scripts/bench/async_modes.py;
`--no-async` skips it): sync 2 workers against async 2 workers + 1 ps, with and without a straggler on one
worker. Then the separate-machines phase (scripts/bench/links.py; `--no-links` skips it): two workers in their
own network namespaces and cores over a rate-limited link. Then the serving phase (scripts/bench/serving_load.py;
`--no-serving` skips it): the model server under a bounded load against the in-process SavedModel call.
Writes bench/results.json and bench/bench.png.
`--workers N` adds a sweep of the trainer over 1..N
workers. Trainer flags for every trainer run (the async phase's too) go after `--`:
  python -m scripts.bench.bench --repeats 3 -- --steps-per-loop 32
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import signal
import statistics
import subprocess
import sys
from typing import Any

from scripts.common.cli import split_trainer_flags
from scripts.common.settings import ROOT
from trainer.base.atomic_file import replaced_on_success, write_json
from trainer.context import parse_config  # pure Python: no TensorFlow import here

from . import async_modes, links, serving_load
from .chart import TARGETS, draw
from .runs import (
    BenchError,
    add_run_arguments,
    check_runs,
    clean_environment,
    command,
    run_once,
    scratch_dir,
    spread,
    start_workers,
    wait_for,
    worker_log,
)

INPUT_MODULE = "scripts.bench.input_pipeline"
STEP_COSTS_MODULE = "scripts.bench.step_costs"
INPUT_WORKERS = 2
INPUT_SHARDS = 8  # at least INPUT_WORKERS: each worker reads only its own files
VARIANTS = {
    "trainer_one_process": {"label": "trainer, 1 process", "program": "trainer", "workers": 1},
    "trainer_two_workers": {"label": "trainer, 2 workers", "program": "trainer", "workers": 2},
    "peer_two_workers": {"label": "tutorial fit, 2 workers", "program": "peer", "workers": 2},
}

# Above this share of the CPUs taken by other processes during a run, the figures are flagged as noisy.
BUSY_SHARE = 0.05


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench.bench",
        description=__doc__.split("\n\n")[0],
        epilog="Everything after -- is appended to every trainer run's flags, the "
        "one-process baseline included (the peer gets none).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_run_arguments(
        parser,
        steps=400,
        repeats=5,
        batch_help="G: one process's batch; each of two workers gets G/2",
        repeats_help="runs of every variant, interleaved",
    )
    parser.add_argument(
        "--workers", type=int, default=0, help="also sweep the trainer over 1..N workers (0 = no sweep)"
    )
    parser.add_argument(
        "--timeout", type=float, default=600.0, help="seconds before a run counts as hung and is killed"
    )
    parser.add_argument(
        "--output-dir", type=pathlib.Path, default=ROOT / "bench", help="where results.json and bench.png go"
    )
    async_modes.add_arguments(parser)
    links.add_arguments(parser)
    serving_load.add_arguments(parser)
    ours, trainer_flags = split_trainer_flags(argv)
    args = parser.parse_args(ours)
    args.trainer_flags = trainer_flags
    check_runs(parser, args)
    if args.workers and not 1 <= args.workers <= 8:
        parser.error(f"--workers must be between 1 and 8 (each worker is a full process), got {args.workers}")
    if args.links_only and args.no_links:
        parser.error("--links-only and --no-links ask for opposite things: give one")
    if not args.no_links:
        links.check_arguments(parser, args)
    if not args.no_async and not args.links_only:
        async_log_every = parse_config([*async_modes.LOOP_FLAGS, *trainer_flags], environ={}).effective_log_every
        async_modes.check_arguments(parser, args, async_log_every)
    return args


# ---- the session: interleaved rounds -----------------------------------------------------------


def run_rounds(
    plan: dict[str, tuple[str, int, int]], args: argparse.Namespace, scratch: pathlib.Path, tag: str
) -> dict[str, list[dict[str, Any]]]:
    """Every entry of the plan once per round, `--repeats` rounds: A B C A B C ..."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in plan}
    for round_index in range(args.repeats):
        for name, (program, workers, per_worker_batch) in plan.items():
            print(f"[{tag} round {round_index + 1}/{args.repeats}] {name} ...", end=" ", flush=True)
            result = run_once(program, workers, per_worker_batch, args, scratch / f"{tag}-{name}-{round_index}")
            result["round"] = round_index
            runs[name].append(result)
            print(
                f"{result['examples_per_second']:,.0f} ex/s, "
                f"first step {result['time_to_first_step_seconds']:.1f} s, "
                f"peak RSS {max(result['peak_rss_bytes']) / 1e9:.2f} GB, "
                f"other processes {100 * result['background_cpu_share']:.0f}% of the CPUs",
                flush=True,
            )
    return runs


def write_records(args: argparse.Namespace, directory: pathlib.Path) -> pathlib.Path:
    """The TFRecord dataset of the input figures: enough train examples for every step of one epoch."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer.data.records",
            "--out",
            str(directory),
            "--train-examples",
            str(args.steps * args.global_batch_size),
            "--train-shards",
            str(INPUT_SHARDS),
            "--test-examples",
            str(args.global_batch_size),
            "--test-shards",
            str(INPUT_WORKERS),
        ],
        cwd=ROOT,
        env=clean_environment(),
        capture_output=True,
        text=True,
    )
    if result.returncode != 0:
        raise BenchError(f"python -m trainer.data.records failed:\n{result.stderr[-3000:]}")
    return directory


def input_pipeline_once(args: argparse.Namespace, files: pathlib.Path, run_dir: pathlib.Path) -> dict[str, Any]:
    """Worker 0's pipeline alone, in its own process (TensorFlow stays out of this one)."""
    run_dir.mkdir(parents=True)
    argv = [
        sys.executable,
        "-m",
        INPUT_MODULE,
        "--files",
        str(files / "train-*"),
        "--workers",
        str(INPUT_WORKERS),
        "--batch",
        str(args.global_batch_size // INPUT_WORKERS),
        "--steps",
        str(args.steps),
        "--warmup-steps",
        str(args.warmup_steps),
    ]
    try:
        result = subprocess.run(
            argv, cwd=ROOT, env=clean_environment(), capture_output=True, text=True, timeout=args.timeout
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"{INPUT_MODULE} did not finish within --timeout {args.timeout:.0f} s") from None
    (run_dir / "input_pipeline.log").write_text(result.stdout + result.stderr)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode != 0 or not lines:
        raise BenchError(f"{INPUT_MODULE} exited with code {result.returncode}:\n{result.stderr[-3000:]}")
    return json.loads(lines[-1])


def step_costs_once(args: argparse.Namespace, run_dir: pathlib.Path) -> dict[str, Any]:
    """The two-worker step's breakdown and the scaling model (scripts/bench/step_costs.py), worker 0's report."""
    run_dir.mkdir(parents=True)
    argv = [sys.executable, "-m", STEP_COSTS_MODULE, "--batch", str(args.global_batch_size // 2)]
    argv += ["--steps", str(max(10, args.steps // 4)), "--repeats", str(max(3, args.repeats))]
    processes = start_workers(argv, 2, run_dir)
    wait_for(processes, args.timeout, [worker_log(run_dir, index) for index in range(2)], {})
    lines = [line for line in worker_log(run_dir, 0).read_text().splitlines() if line.startswith("{")]
    if not lines:
        raise BenchError(f"{STEP_COSTS_MODULE} printed no result; see {worker_log(run_dir, 0)}")
    return json.loads(lines[-1])


def run_input_rounds(args: argparse.Namespace, scratch: pathlib.Path) -> dict[str, list[dict[str, Any]]]:
    """Pipeline alone, then the trainer's two workers on the same files, `--repeats` rounds."""
    files = write_records(args, scratch / "records")
    runs: dict[str, list[dict[str, Any]]] = {"input_pipeline": [], "trainer_on_files": []}
    for round_index in range(args.repeats):
        print(f"[input round {round_index + 1}/{args.repeats}] input_pipeline ...", end=" ", flush=True)
        alone = input_pipeline_once(args, files, scratch / f"input-pipeline-{round_index}")
        alone["round"] = round_index
        runs["input_pipeline"].append(alone)
        print(f"{alone['examples_per_second']:,.0f} ex/s; trainer_on_files ...", end=" ", flush=True)
        trained = run_once(
            "trainer",
            INPUT_WORKERS,
            args.global_batch_size // INPUT_WORKERS,
            args,
            scratch / f"input-trainer-{round_index}",
            files,
        )
        trained["round"] = round_index
        trained["examples_per_second_per_worker"] = trained["examples_per_second"] / INPUT_WORKERS
        runs["trainer_on_files"].append(trained)
        print(
            f"{trained['examples_per_second_per_worker']:,.0f} ex/s per worker: input "
            f"{alone['examples_per_second'] / trained['examples_per_second_per_worker']:.1f}x the step's demand",
            flush=True,
        )
    return runs


def input_summary(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    alone = [run["examples_per_second"] for run in runs["input_pipeline"]]
    demand = [run["examples_per_second_per_worker"] for run in runs["trainer_on_files"]]
    return {
        "input_pipeline_examples_per_second": spread(alone),
        "step_examples_per_second_per_worker": spread(demand),
        "input_over_step": {
            "of_medians": statistics.median(alone) / statistics.median(demand),
            "per_round": [a / d for a, d in zip(alone, demand, strict=True)],
        },
    }


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "examples_per_second": spread([run["examples_per_second"] for run in runs]),
        "time_to_first_step_seconds": spread([run["time_to_first_step_seconds"] for run in runs]),
        # The largest worker in each run: the figure a pod's memory limit has to cover.
        "peak_rss_bytes_per_worker": spread([max(run["peak_rss_bytes"]) for run in runs]),
        "background_cpu_share": spread([run["background_cpu_share"] for run in runs]),
        **(
            {
                "first_step_after_group_formed_seconds": spread(
                    [run["startup_seconds"]["first_step"] - run["startup_seconds"]["group_formed"] for run in runs]
                ),
                "startup_seconds": {
                    milestone: statistics.median(run["startup_seconds"][milestone] for run in runs)
                    for milestone in runs[0]["startup_seconds"]
                },
                "exit_seconds": spread([run["exit_seconds"] for run in runs]),
            }
            if runs[0]["startup_seconds"]
            else {}
        ),
    }


def ratio(numerator: list[dict[str, Any]], denominator: list[dict[str, Any]]) -> dict[str, Any]:
    """Ratio of medians, plus the ratio within each round (both variants ran back to back)."""
    top = [run["examples_per_second"] for run in numerator]
    bottom = [run["examples_per_second"] for run in denominator]
    per_round = [a / b for a, b in zip(top, bottom, strict=True)]
    return {"of_medians": statistics.median(top) / statistics.median(bottom), "per_round": per_round}


def check_targets(summaries: dict[str, Any], ratios: dict[str, Any], inputs: dict[str, Any]) -> list[dict[str, Any]]:
    trainer = [name for name in summaries if name.startswith("trainer")]
    first_step = max(summaries[name]["time_to_first_step_seconds"]["median"] for name in trainer)
    rss = max(summaries[name]["peak_rss_bytes_per_worker"]["max"] for name in trainer)
    rows = [
        (
            "two_workers_over_one_process",
            "trainer 2 workers / trainer 1 process (examples/s)",
            ratios["two_workers_over_one_process"]["of_medians"],
            ">=",
        ),
        ("time_to_first_step_seconds", "trainer time to first step, s (slowest variant's median)", first_step, "<="),
        (
            "first_step_after_group_formed_seconds",
            "trainer first step after the group formed, s (slowest variant's median)",
            max(summaries[name]["first_step_after_group_formed_seconds"]["median"] for name in trainer),
            "<=",
        ),
        (
            "exit_seconds",
            "trainer exit after its final line, s (slowest variant's median)",
            max(summaries[name]["exit_seconds"]["median"] for name in trainer),
            "<=",
        ),
        ("peak_rss_bytes", "trainer peak RSS per worker, bytes (largest seen)", rss, "<="),
        (
            "input_over_step",
            "one worker's input pipeline alone / the step's examples/s per worker (TFRecord files)",
            inputs["input_over_step"]["of_medians"],
            ">=",
        ),
    ]
    return [
        {
            "key": key,
            "name": name,
            "measured": measured,
            "target": f"{sign} {TARGETS[key]:g}",
            "met": measured >= TARGETS[key] if sign == ">=" else measured <= TARGETS[key],
        }
        for key, name, measured, sign in rows
    ]


def sweep_summary(plan: dict[str, tuple[str, int, int]], runs: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    throughput = {
        workers: spread([run["examples_per_second"] for run in runs[name]]) for name, (_, workers, _) in plan.items()
    }
    one = throughput[1]["median"]
    return [
        {
            "workers": n,
            "examples_per_second": eps,
            "speedup": eps["median"] / one,
            "scaling_efficiency": eps["median"] / (n * one),
        }
        for n, eps in throughput.items()
    ]


# ---- machine, versions ------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    import psutil

    model = platform.processor() or platform.machine()
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if cpuinfo.exists():
        names = [
            line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if line.startswith("model name")
        ]
        model = names[0] if names else model
    return {
        "cpu_model": model,
        "logical_cpus": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_bytes": psutil.virtual_memory().total,
        "platform": platform.platform(),
        "python": platform.python_version(),
    }


def versions() -> dict[str, Any]:
    found = {}
    for package in ("tensorflow", "tensorflow-cpu", "keras", "tf-keras", "numpy"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    git = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True)
    found["project_revision"] = git.stdout.strip() or "unknown"
    return found


def provenance(module: str, started: datetime.datetime, argv: list[str] | None) -> dict[str, Any]:
    """A results file's first keys: its schema, when it ran, the command, the machine and the versions."""
    return {
        "schema_version": 1,
        "started_utc": started.isoformat(timespec="seconds"),
        "finished_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": f"python -m {module} " + " ".join(argv if argv is not None else sys.argv[1:]),
        "machine": machine(),
        "versions": versions(),
    }


# ---- output ------------------------------------------------------------------------------------


def print_table(results: dict[str, Any]) -> None:
    print(f"\n{'variant':<22}{'examples/s (median, min-max)':>34}{'first step s':>14}{'peak RSS GB':>13}")
    for name, variant in results["variants"].items():
        eps, first, rss = (
            variant["summary"][key]
            for key in ("examples_per_second", "time_to_first_step_seconds", "peak_rss_bytes_per_worker")
        )
        print(
            f"{name:<22}{eps['median']:>14,.0f} ({eps['min']:,.0f}-{eps['max']:,.0f}){'':>4}"
            f"{first['median']:>12.1f}{rss['max'] / 1e9:>13.2f}"
        )
    for sweep_row in results.get("sweep", []):
        print(
            f"sweep {sweep_row['workers']} worker(s): {sweep_row['examples_per_second']['median']:,.0f} ex/s, "
            f"speedup {sweep_row['speedup']:.2f}x, scaling efficiency {100 * sweep_row['scaling_efficiency']:.0f}%"
        )
    inputs = results["input"]
    print(
        f"input pipeline alone (worker 0 of {inputs['workers']}, decode included): "
        f"{inputs['input_pipeline_examples_per_second']['median']:,.0f} ex/s; the step on the same files: "
        f"{inputs['step_examples_per_second_per_worker']['median']:,.0f} ex/s per worker; input/step "
        f"{inputs['input_over_step']['of_medians']:.1f}x (per round: "
        f"{', '.join(f'{r:.1f}x' for r in inputs['input_over_step']['per_round'])})"
    )
    for name, variant in results["variants"].items():
        milestones = variant["summary"].get("startup_seconds")
        if milestones:
            print(
                f"{name} start-up, s from process start: "
                + ", ".join(f"{milestone} {seconds:.2f}" for milestone, seconds in milestones.items())
                + f"; exit {variant['summary']['exit_seconds']['median']:.2f} s after the final line"
            )
    costs = results["step_costs"]
    print(
        "two workers' step, ms (worker 0): "
        + ", ".join(f"{part} {ms:.1f}" for part, ms in costs["breakdown_ms"].items())
        + f"; the distributed iterator instead of the trainer's: {costs['ms_per_step']['distributed_iterator']:.1f}"
        f" against {costs['ms_per_step']['trainer']:.1f}"
    )
    model = costs["scaling_model"]
    print(
        f"predicted efficiency, workers on separate machines ({model['bandwidth_gbit']:.2f} Gbit/s, "
        f"{model['hop_latency_us']:.0f} us per hop): "
        + ", ".join(f"{n} workers {100 * e:.0f}%" for n, e in model["efficiency_by_workers"].items())
    )
    for target in results["targets"]:
        print(
            f"{'MET   ' if target['met'] else 'MISSED'} {target['name']}: {target['measured']:,.3g} "
            f"(target {target['target']})"
        )
    if "async" in results:
        async_modes.print_summary(results["async"])
    if "links" in results:
        links.print_summary(results["links"])
    if "serving" in results:
        serving_load.print_summary(results["serving"])
    if results["warnings"]:
        print("\n".join(f"warning: {text}" for text in results["warnings"]))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.links_only:
        return links.run_alone(args)
    # SIGTERM unwinds like Ctrl-C, so the workers (in their own sessions) are killed, not orphaned.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    half = args.global_batch_size // 2
    plan = {
        name: (variant["program"], variant["workers"], args.global_batch_size // variant["workers"])
        for name, variant in VARIANTS.items()
    }
    sweep_plan = {f"{n}_workers": ("trainer", n, half) for n in range(1, args.workers + 1)}
    started = datetime.datetime.now(datetime.UTC)
    with scratch_dir("bench-") as scratch:
        runs = run_rounds(plan, args, scratch, "main")
        sweep_runs = run_rounds(sweep_plan, args, scratch, "sweep") if sweep_plan else None
        input_runs = run_input_rounds(args, scratch)
        print("[step costs] two workers' step, part by part ...", flush=True)
        step_costs = step_costs_once(args, scratch / "step-costs")
        async_runs = None if args.no_async else async_modes.run_async_rounds(args, scratch)
        link_runs = None if args.no_links else links.run_link_rounds(args, scratch)
        serving = (
            serving_load.run_serving(args, scratch / "serving")
            if not args.no_serving and serving_load.available()
            else None
        )
    summaries = {name: summarize(variant_runs) for name, variant_runs in runs.items()}
    inputs = {
        **input_summary(input_runs),
        "runs": input_runs,
        "workers": INPUT_WORKERS,
        "data": f"trainer.data.records PNG 28x28x1, {INPUT_SHARDS} train files, --cache none",
    }
    ratios = {
        "two_workers_over_one_process": ratio(runs["trainer_two_workers"], runs["trainer_one_process"]),
        "trainer_over_peer": ratio(runs["trainer_two_workers"], runs["peer_two_workers"]),
    }
    shares = [
        run["background_cpu_share"]
        for variant_runs in [*runs.values(), input_runs["trainer_on_files"]]
        for run in variant_runs
    ]
    if async_runs:
        shares += [run["background_cpu_share"] for variant_runs in async_runs.values() for run in variant_runs]
    warnings = []
    if max(shares) > BUSY_SHARE:
        warnings.append(
            f"other processes used up to {100 * max(shares):.0f}% of the CPUs during a run (median "
            f"{100 * statistics.median(shares):.0f}%): the figures are noisy; rerun on an idle machine"
        )
    results = {
        **provenance("scripts.bench.bench", started, argv),
        "config": {
            "model": "cnn (Conv32-Pool-Conv64-Pool-Conv64-Flatten-Dense64-Dense10)",
            "data": "synthetic 28x28x1, 10 classes",
            "global_batch_size": args.global_batch_size,
            "per_worker_batch_size_two_workers": half,
            "steps": args.steps,
            "warmup_steps": args.warmup_steps,
            "repeats": args.repeats,
            "order": "interleaved by round",
            "trainer_flags": args.trainer_flags,
            "commands": {
                name: [
                    part.replace(f"{ROOT}{os.sep}", "")
                    for part in command(program, batch, workers, args, pathlib.Path("MODEL_DIR"))[1:]
                ]
                for name, (program, workers, batch) in plan.items()
            },
        },
        "variants": {
            name: {
                "label": VARIANTS[name]["label"],
                "workers": VARIANTS[name]["workers"],
                "runs": runs[name],
                "summary": summaries[name],
            }
            for name in plan
        },
        "ratios": ratios,
        "input": inputs,
        "step_costs": step_costs,
        "targets": check_targets(summaries, ratios, inputs),
        "warnings": warnings,
    }
    if async_runs:
        results["async"] = async_modes.summarize(async_runs, args)
    if link_runs:
        results["links"] = links.summarize(link_runs, half)
        results["links_runs"] = link_runs["runs"]
        results["targets"] += links.check_targets(results["links"])
    if serving:
        results["serving"] = serving
        results["targets"] += serving_load.check_targets(serving)
    if sweep_runs:
        results["sweep"] = sweep_summary(sweep_plan, sweep_runs)
        results["sweep_runs"] = sweep_runs
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_json(str(args.output_dir / "results.json"), results, sort_keys=False)
    with replaced_on_success(str(args.output_dir / "bench.png")) as partial:
        draw(results, pathlib.Path(partial))
    print_table(results)
    print(f"\nwrote {args.output_dir / 'results.json'} and {args.output_dir / 'bench.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
