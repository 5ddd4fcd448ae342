"""What every bench phase shares: the runs' length (the warm-up), launching a run and reading its figures, the error
that stops a bench, the runs' environment, the CPU meter, spreads."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from scripts.common.ports import free_ports
from scripts.common.processes import inherited_environment, peak_rss_bytes, signal_group
from scripts.common.settings import ROOT
from scripts.common.tfconfig import tf_config
from trainer.artifacts.layout import ModelDir
from trainer.base.errors import ConfigError
from trainer.context import parse_config  # pure Python: no TensorFlow import here

PEER_MODULE = "scripts.bench.tutorial_fit"


class BenchError(RuntimeError):
    """A run failed or the settings cannot work; the message says which and where its logs are."""


@contextlib.contextmanager
def scratch_dir(prefix: str) -> Iterator[pathlib.Path]:
    """A folder for the runs' files, deleted afterwards; a BenchError raised inside ends the program with exit 1 and
    its message in one line, not a traceback."""
    with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
        try:
            yield pathlib.Path(scratch)
        except BenchError as error:
            print(f"\nerror: {error}", file=sys.stderr)
            raise SystemExit(1) from None


def clean_environment() -> dict[str, str]:
    """This shell's environment minus anything that would change what a run does."""
    env = inherited_environment()
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def busy_cpu_seconds() -> float:
    """CPU time the whole machine has spent busy since boot (every process, every core)."""
    import psutil

    times = psutil.cpu_times()
    return sum(times) - times.idle - getattr(times, "iowait", 0.0)


def log_tail(path: pathlib.Path, lines: int = 15) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def spread(values: list[float]) -> dict[str, Any]:
    median = statistics.median(values)
    return {
        "median": median,
        "min": min(values),
        "max": max(values),
        "spread_percent": 100 * (max(values) - min(values)) / median if median else None,
        "values": values,
    }


def add_run_arguments(
    parser: argparse.ArgumentParser, steps: int, repeats: int, batch_help: str, repeats_help: str
) -> None:
    """The options check_runs reads: the global batch, every run's steps and warm-up, the rounds."""
    parser.add_argument("--global-batch-size", type=int, default=128, help=batch_help)
    parser.add_argument("--steps", type=int, default=steps, help="training steps per run, warm-up included")
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=48,
        help="steps left out of examples/s (rounded up to the trainer's steps per loop)",
    )
    parser.add_argument("--repeats", type=int, default=repeats, help=repeats_help)


def check_runs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The parser's error for a global batch two workers cannot halve, no repeats, trainer flags (args.trainer_flags,
    after --) the trainer's own parser refuses, or --steps that leave no timed steps after the warm-up; then
    args.warmup_steps rounded up to the trainer's steps per loop, as the trainer rounds --log-every. The runs see no
    TRAINER_* variables, so a typo stops here."""
    if args.global_batch_size < 2 or args.global_batch_size % 2:
        parser.error(
            f"--global-batch-size must be an even number of at least 2 (two workers get half each), "
            f"got {args.global_batch_size}"
        )
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    try:
        config = parse_config([*args.trainer_flags, "--log-every", str(max(1, args.warmup_steps))], environ={})
    except ConfigError as error:
        parser.error(f"trainer flags after --: {error}")
    warmup = config.effective_log_every
    if args.steps < warmup + config.steps_per_loop:
        parser.error(
            f"--steps ({args.steps}) must leave at least {config.steps_per_loop} steps after the "
            f"warm-up of {warmup} steps; raise --steps or lower --warmup-steps"
        )
    args.warmup_steps = warmup


# ---- launching one run -------------------------------------------------------------------------


def command(
    program: str,
    per_worker_batch: int,
    workers: int,
    args: argparse.Namespace,
    model_dir: pathlib.Path,
    files: pathlib.Path | None = None,
    extra_flags: list[str] | None = None,
) -> list[str]:
    """files: a trainer.data.records directory to train on (--cache none) instead of the synthetic task.
    extra_flags: appended to the trainer's (not the peer's) command line after the bench's own trainer flags."""
    if program == "peer":
        return [
            sys.executable,
            "-m",
            PEER_MODULE,
            "--per-worker-batch-size",
            str(per_worker_batch),
            "--steps",
            str(args.steps),
            "--warmup-steps",
            str(args.warmup_steps),
        ]
    global_batch = per_worker_batch * workers
    data = (
        ["--dataset", "synthetic"]
        if files is None
        else [
            "--dataset",
            "tfrecord",
            "--train-files",
            str(files / "train-*"),
            "--test-files",
            str(files / "test-*"),
            "--image-shape",
            "28x28x1",
            "--num-classes",
            "10",
            "--cache",
            "none",
        ]
    )
    return [
        sys.executable,
        "-m",
        "trainer",
        *data,
        "--epochs",
        "1",
        "--train-examples",
        str(args.steps * global_batch),
        "--test-examples",
        str(global_batch),
        "--per-worker-batch-size",
        str(per_worker_batch),
        "--log-every",
        str(args.warmup_steps),
        # No periodic checkpoints: the peer writes none either.
        "--checkpoint-every",
        "0",
        "--model-dir",
        str(model_dir),
        *args.trainer_flags,
        *(extra_flags or []),
    ]


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where each worker runs: its host address in TF_CONFIG and what its command line is wrapped in (a
    network namespace, a pinned core). The default: every worker on 127.0.0.1, unwrapped."""

    host: Callable[[int], str] = lambda _index: "127.0.0.1"
    wrap: Callable[[int, list[str]], list[str]] = lambda _index, argv: argv


def run_once(
    program: str,
    workers: int,
    per_worker_batch: int,
    args: argparse.Namespace,
    run_dir: pathlib.Path,
    files: pathlib.Path | None = None,
    extra_flags: list[str] | None = None,
    placement: Placement | None = None,
) -> dict[str, Any]:
    """Starts the workers together, waits for all, and returns the run's measurements (extra_flags: see
    `command`)."""
    run_dir.mkdir(parents=True)
    model_dir = run_dir / "model"
    argv = command(program, per_worker_batch, workers, args, model_dir, files, extra_flags)
    busy_before = busy_cpu_seconds()
    started = time.monotonic()
    processes = start_workers(argv, workers, run_dir, placement or Placement())
    exited_at: dict[int, float] = {}
    usages = wait_for(processes, args.timeout, [worker_log(run_dir, i) for i in range(workers)], exited_at)
    wall_seconds = time.monotonic() - started
    report = read_report(program, run_dir, model_dir)
    metrics_file = pathlib.Path(ModelDir(str(model_dir)).metrics)
    return {
        "examples_per_second": report["examples_per_second"],
        "time_to_first_step_seconds": report["time_to_first_step_seconds"],
        "peak_rss_bytes": [peak_rss_bytes(usage) for usage in usages],
        **_cpu_use(usages, wall_seconds, busy_before),
        "workers": report["workers"],
        "global_batch_size": report["global_batch_size"],
        # The trainer's own start-up milestones, seconds from process start (the peer reports none).
        "startup_seconds": report.get("startup_seconds", {}),
        # From the chief's metrics.json (written just before its final line) to the last process's exit.
        "exit_seconds": max(exited_at.values()) - metrics_file.stat().st_mtime if metrics_file.exists() else None,
    }


def run_side_by_side(
    program: str,
    per_worker_batch: int,
    args: argparse.Namespace,
    run_dir: pathlib.Path,
    extra_flags: list[str] | None = None,
    placement: Placement | None = None,
) -> dict[str, Any]:
    """Two single-worker runs that never talk to each other, started together, copy i placed as worker i of a
    pair would be: what this machine gives two programs at once, the ceiling of any two-worker run on it.
    examples_per_second: the two copies' sum."""
    placement = placement or Placement()
    run_dir.mkdir(parents=True)
    copies = [run_dir / f"copy-{index}" for index in range(2)]
    busy_before = busy_cpu_seconds()
    started = time.monotonic()
    processes = []
    for index, copy_dir in enumerate(copies):
        copy_dir.mkdir()
        argv = command(program, per_worker_batch, 1, args, copy_dir / "model", extra_flags=extra_flags)
        as_worker = Placement(wrap=lambda _index, argv, index=index: placement.wrap(index, argv))
        processes += start_workers(argv, 1, copy_dir, as_worker)
    usages = wait_for(processes, args.timeout, [worker_log(copy_dir, 0) for copy_dir in copies], {})
    wall_seconds = time.monotonic() - started
    reports = [read_report(program, copy_dir, copy_dir / "model") for copy_dir in copies]
    return {
        "examples_per_second": sum(report["examples_per_second"] for report in reports),
        "copies_examples_per_second": [report["examples_per_second"] for report in reports],
        **_cpu_use(usages, wall_seconds, busy_before),
    }


def _cpu_use(usages: list[Any], wall_seconds: float, busy_before: float) -> dict[str, Any]:
    own_cpu = [usage.ru_utime + usage.ru_stime for usage in usages]
    # Whatever else ran meanwhile competed for the same cores; this is how much of them it took.
    background = max(0.0, busy_cpu_seconds() - busy_before - sum(own_cpu))
    return {
        "cpu_seconds": own_cpu,
        "wall_seconds": wall_seconds,
        "background_cpu_share": background / (wall_seconds * (os.cpu_count() or 1)),
    }


def worker_log(run_dir: pathlib.Path, index: int) -> pathlib.Path:
    """Where `start_workers` writes worker `index`'s output."""
    return run_dir / f"worker-{index}.log"


def start_workers(
    argv: list[str], workers: int, run_dir: pathlib.Path, placement: Placement | None = None
) -> list[subprocess.Popen]:
    """`workers` processes of argv placed by `placement` (default: on 127.0.0.1), each in its own session with its
    log in run_dir/worker-<i>.log and TF_CONFIG as the operator writes it for that many Worker replicas (none for
    a single one)."""
    placement = placement or Placement()
    # Ports free on this host; inside a fresh namespace every port is free.
    ports = free_ports(workers)
    env = clean_environment()
    processes = []
    for index in range(workers):
        worker_tf_config = tf_config(
            {"Worker": workers}, "Worker", index, lambda _type, i: f"{placement.host(i)}:{ports[i]}"
        )
        worker_env = env if worker_tf_config is None else {**env, "TF_CONFIG": worker_tf_config}
        with open(worker_log(run_dir, index), "w") as log:
            processes.append(
                subprocess.Popen(
                    placement.wrap(index, argv),
                    cwd=ROOT,
                    env=worker_env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    return processes


def wait_for(
    processes: list[subprocess.Popen], timeout: float, logs: list[pathlib.Path], exited_at: dict[int, float]
) -> list[Any]:
    """Reaps every worker with wait4 (for its rusage) and notes when each exited (within 0.1 s); any failure or
    the timeout kills the rest. logs: each process's log, named in the error."""
    deadline = time.monotonic() + timeout
    usages: dict[int, Any] = {}
    try:
        while len(usages) < len(processes):
            for index, process in enumerate(processes):
                if index in usages:
                    continue
                pid, status, usage = os.wait4(process.pid, os.WNOHANG)
                if pid == 0:
                    continue
                process.returncode = os.waitstatus_to_exitcode(status)
                usages[index] = usage
                exited_at[index] = time.time()
                if process.returncode != 0:
                    raise BenchError(
                        f"worker {index} exited with code {process.returncode}; its log is "
                        f"{logs[index]}:\n{log_tail(logs[index])}"
                    )
            if time.monotonic() > deadline:
                raise BenchError(f"the run did not finish within --timeout {timeout:.0f} s; logs in {logs[0].parent}")
            time.sleep(0.1)
    finally:
        for index, process in enumerate(processes):
            if index not in usages:
                signal_group(process.pid, signal.SIGKILL)
                process.wait()
    return [usages[index] for index in range(len(processes))]


def read_report(program: str, run_dir: pathlib.Path, model_dir: pathlib.Path) -> dict[str, Any]:
    """The chief's own figures: the trainer's metrics.json, or the peer's last stdout line."""
    if program == "trainer":
        source = pathlib.Path(ModelDir(str(model_dir)).metrics)
        text = source.read_text() if source.exists() else ""
    else:
        source = worker_log(run_dir, 0)
        lines = [line for line in source.read_text().splitlines() if line.startswith("{")]
        text = lines[-1] if lines else ""
    try:
        report = json.loads(text)
    except json.JSONDecodeError:
        raise BenchError(f"no machine-readable result in {source}; see the logs in {run_dir}") from None
    missing = [
        key
        for key in ("examples_per_second", "time_to_first_step_seconds", "workers", "global_batch_size")
        if report.get(key) is None
    ]
    if missing:
        raise BenchError(
            f"{source} lacks {', '.join(missing)}; the run may have been too short to measure (raise --steps)"
        )
    return report
