"""The async phase of `make bench`: sync 2 workers against async 2 workers + 1 ps, with and without a straggler.

Four variants, interleaved round by round, each training the same number of synthetic examples with the same
per-worker batch and --threads 1 per process (one core's work per worker), a test pass after every epoch:
  sync_two_workers             MultiWorkerMirroredStrategy, TF_CONFIG with 2 workers
  async_two_workers            ParameterServerStrategy, TF_CONFIG with chief, 1 ps, 2 workers (--strategy async)
  sync_two_workers_straggler   the same as sync, worker-1 held stopped part of every period (SIGSTOP/SIGCONT)
  async_two_workers_straggler  the same as async, the same straggler on worker-1
Each run reports the chief's steady examples/s and final test accuracy (its metrics.json) and the time, on the
bench's clock from the launch of the processes, at which each epoch's test accuracy was printed: the accuracy
after the same number of examples is the final one, the accuracy after the same wall time is each variant's
latest evaluation by the time the faster of a pair printed its last one.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from typing import IO, Any

from scripts.common.ports import free_ports
from scripts.common.processes import signal_group, spawn
from scripts.common.settings import ROOT
from scripts.common.tfconfig import tf_config
from trainer.artifacts.layout import ModelDir

from .runs import BenchError, busy_cpu_seconds, clean_environment, log_tail, spread

WORKERS = 2
STRAGGLER = ("Worker", 1)  # the replica slowed down, in both modes
VARIANTS: dict[str, dict[str, Any]] = {
    "sync_two_workers": {"label": "sync, 2 workers", "mode": "sync", "straggler": False},
    "async_two_workers": {"label": "async, 2 workers + 1 ps", "mode": "async", "straggler": False},
    "sync_two_workers_straggler": {"label": "sync, 2 workers, straggler", "mode": "sync", "straggler": True},
    "async_two_workers_straggler": {"label": "async, 2 workers + 1 ps, straggler", "mode": "async", "straggler": True},
}
PAIRS = {"without straggler": ("sync_two_workers", "async_two_workers")}
PAIRS["with straggler"] = ("sync_two_workers_straggler", "async_two_workers_straggler")
# The trainer's default closures of 16 steps; a progress interval per closure, for the steady examples/s.
LOOP_FLAGS = ["--log-every", "16"]
# The synthetic task's best test accuracy is 0.90 (docs/data.md); within 0.01 of it counts as reached.
REACHED_ACCURACY = 0.89
EPOCH_LINE = re.compile(r"^epoch (\d+)/\d+ done: .*\| test loss \S+ accuracy ([0-9.]+)")


# The phase's flags beside --no-async: (flag, type, default, help); each whole number is a size, at least 1.
FLAGS: tuple[tuple[str, type, float, str], ...] = (
    ("--async-train-examples", int, 2048, "synthetic training examples per epoch, both modes"),
    ("--async-epochs", int, 4, "epochs, each followed by a test pass"),
    ("--async-test-examples", int, 1000, "synthetic test examples"),
    ("--async-batch", int, 32, "per-worker batch, both modes"),
    ("--straggler-stopped", float, 0.5, "share of every period the straggler (worker-1) is held stopped with SIGSTOP"),
    ("--straggler-period", float, 0.2, "the straggler's period, seconds"),
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("async phase (sync 2 workers against async 2 workers + 1 ps)")
    group.add_argument("--no-async", action="store_true", help="skip the async phase")
    for flag, kind, default, help_text in FLAGS:
        group.add_argument(flag, type=kind, default=default, help=help_text)


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace, log_every: int) -> None:
    """Refuses settings the phase cannot measure, naming the fix. log_every: the trainer's effective interval."""
    for flag, kind, _, _ in FLAGS:
        value = getattr(args, flag[2:].replace("-", "_"))
        if kind is int and value < 1:
            parser.error(f"{flag} must be at least 1, got {value}")
    if not 0 < args.straggler_stopped < 1:
        parser.error(
            f"--straggler-stopped must be between 0 and 1 (a share of the period; 1 would never let it run), "
            f"got {args.straggler_stopped}"
        )
    if args.straggler_period <= 0:
        parser.error(f"--straggler-period must be a positive number of seconds, got {args.straggler_period}")
    sync_steps = args.async_train_examples // (WORKERS * args.async_batch) * args.async_epochs
    if sync_steps < 2 * log_every:
        parser.error(
            f"the async phase's sync runs would take {sync_steps} steps, fewer than the {2 * log_every} needed for "
            f"a steady examples/s after the warm-up interval of {log_every}; raise --async-train-examples or "
            "--async-epochs, or lower --async-batch"
        )


# ---- the straggler -----------------------------------------------------------------------------


class DutyCycle:
    """Holds a process group stopped (SIGSTOP) for `stopped` of every `period` seconds, in a thread, until
    stop(), which always leaves it running (SIGCONT). A group that has exited is ignored."""

    def __init__(self, pgid: int, stopped: float, period: float) -> None:
        self.pgid = pgid
        self.stopped_seconds = stopped * period
        self.running_seconds = (1 - stopped) * period
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._cycle, daemon=True)

    def start(self) -> DutyCycle:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        self._thread.join()
        signal_group(self.pgid, signal.SIGCONT)

    def _cycle(self) -> None:
        while not self._done.is_set():
            signal_group(self.pgid, signal.SIGSTOP)
            stopped_early = self._done.wait(self.stopped_seconds)
            signal_group(self.pgid, signal.SIGCONT)
            if stopped_early:
                return
            self._done.wait(self.running_seconds)


# ---- one run -----------------------------------------------------------------------------------


def trainer_command(mode: str, args: argparse.Namespace, model_dir: pathlib.Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trainer",
        "--strategy",
        mode,
        "--dataset",
        "synthetic",
        "--train-examples",
        str(args.async_train_examples),
        "--test-examples",
        str(args.async_test_examples),
        "--epochs",
        str(args.async_epochs),
        "--per-worker-batch-size",
        str(args.async_batch),
        # One core's work per worker in both modes; async's chief and ps are mostly idle.
        "--threads",
        "1",
        *LOOP_FLAGS,
        "--checkpoint-every",
        "0",
        "--model-dir",
        str(model_dir),
        *args.trainer_flags,
    ]


def replica_counts(mode: str) -> dict[str, int]:
    return {"Worker": WORKERS} if mode == "sync" else {"Chief": 1, "PS": 1, "Worker": WORKERS}


class TimedLog:
    """Copies a process's output to a file, each line prefixed with the seconds since `started` at which it
    arrived, and keeps the chief's epoch evaluations as (epoch, seconds, test accuracy)."""

    def __init__(self, stream: IO[bytes], path: pathlib.Path, started: float) -> None:
        self.evaluations: list[dict[str, Any]] = []
        self.path = path
        self._thread = threading.Thread(target=self._copy, args=(stream, path, started), daemon=True)
        self._thread.start()

    def _copy(self, stream: IO[bytes], path: pathlib.Path, started: float) -> None:
        with open(path, "w") as log:
            for raw in stream:
                seconds = time.monotonic() - started
                line = raw.decode(errors="replace").rstrip("\n")
                log.write(f"{seconds:9.3f} {line}\n")
                log.flush()
                match = EPOCH_LINE.match(line)
                if match:
                    self.evaluations.append(
                        {"epoch": int(match[1]), "seconds": seconds, "test_accuracy": float(match[2])}
                    )

    def join(self) -> None:
        self._thread.join()


def run_once(name: str, args: argparse.Namespace, run_dir: pathlib.Path) -> dict[str, Any]:
    """Launches one variant's processes, each with its own TF_CONFIG; returns the chief's figures."""
    variant = VARIANTS[name]
    mode = variant["mode"]
    run_dir.mkdir(parents=True)
    model_dir = run_dir / "model"
    argv = trainer_command(mode, args, model_dir)
    counts = replica_counts(mode)
    replicas = [(rtype, index) for rtype, count in counts.items() for index in range(count)]
    ports = dict(zip(replicas, free_ports(len(replicas)), strict=True))
    chief = ("Chief", 0) if mode == "async" else ("Worker", 0)
    env = clean_environment()
    busy_before = busy_cpu_seconds()
    started = time.monotonic()
    group = Group(started)
    straggler: DutyCycle | None = None
    try:
        for replica in replicas:
            config = tf_config(counts, *replica, lambda rtype, i: f"127.0.0.1:{ports[(rtype, i)]}")
            group.start(replica, argv, {**env, "TF_CONFIG": str(config)}, run_dir)
        if variant["straggler"]:
            pgid = group.processes[STRAGGLER].pid
            straggler = DutyCycle(pgid, args.straggler_stopped, args.straggler_period).start()
        # Async workers and ps tasks serve until stopped: only the chief's exit code counts there.
        group.wait([chief] if mode == "async" else replicas, started + args.timeout)
    finally:
        if straggler is not None:
            straggler.stop()
        group.stop()
    wall_seconds = time.monotonic() - started
    own_cpu = sum(usage.ru_utime + usage.ru_stime for usage in group.usages.values())
    background = max(0.0, busy_cpu_seconds() - busy_before - own_cpu)
    report = read_metrics(model_dir, run_dir)
    return {
        "examples_per_second": report["examples_per_second"],
        "test_accuracy": report["test_accuracy"],
        "examples_trained": report["steps"] * report["global_batch_size"],
        "time_to_first_step_seconds": report["time_to_first_step_seconds"],
        "wall_seconds": wall_seconds,
        "evaluations": group.logs[chief].evaluations,
        "processes": len(replicas),
        "cpu_seconds": own_cpu,
        "background_cpu_share": background / (wall_seconds * (os.cpu_count() or 1)),
    }


class Group:
    """One run's processes (each in its own process group), their timed logs, and their rusage once reaped."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.processes: dict[tuple[str, int], subprocess.Popen] = {}
        self.logs: dict[tuple[str, int], TimedLog] = {}
        self.usages: dict[tuple[str, int], Any] = {}

    def start(self, replica: tuple[str, int], argv: list[str], env: dict[str, str], run_dir: pathlib.Path) -> None:
        process = spawn(argv, env, str(ROOT))
        self.processes[replica] = process
        log_path = run_dir / f"{replica[0].lower()}-{replica[1]}.log"
        self.logs[replica] = TimedLog(process.stdout, log_path, self.started)  # type: ignore[arg-type]

    def reap(self, replica: tuple[str, int], block: bool = False) -> int | None:
        """The replica's exit code once it has exited (reaped with wait4 for its rusage), else None."""
        process = self.processes[replica]
        if replica not in self.usages:
            pid, status, usage = os.wait4(process.pid, 0 if block else os.WNOHANG)
            if pid == 0:
                return None
            process.returncode = os.waitstatus_to_exitcode(status)
            self.usages[replica] = usage
        return process.returncode

    def wait(self, must_finish: list[tuple[str, int]], deadline: float) -> None:
        """Until every replica in must_finish exits 0; any other exit, or the deadline, raises BenchError."""
        while True:
            for replica in self.processes:
                code = self.reap(replica)
                if code is None or (code == 0 and replica in must_finish):
                    continue
                what = "failed" if replica in must_finish else "exited by itself (servers serve until stopped)"
                self.logs[replica].join()
                path = self.logs[replica].path
                raise BenchError(
                    f"{replica[0].lower()}-{replica[1]} {what} with code {code}; its log is {path}:\n{log_tail(path)}"
                )
            if all(replica in self.usages for replica in must_finish):
                return
            if time.monotonic() > deadline:
                folder = self.logs[replica].path.parent
                raise BenchError(f"a run did not finish within --timeout; its logs are in {folder}")
            time.sleep(0.1)

    def stop(self) -> None:
        """Kills whatever still runs (async's servers, or everything after a failure) and reaps it."""
        for replica, process in self.processes.items():
            if replica not in self.usages:
                signal_group(process.pid, signal.SIGKILL)
                self.reap(replica, block=True)
        for log in self.logs.values():
            log.join()


def read_metrics(model_dir: pathlib.Path, run_dir: pathlib.Path) -> dict[str, Any]:
    source = pathlib.Path(ModelDir(str(model_dir)).metrics)
    try:
        report = json.loads(source.read_text())
    except (OSError, json.JSONDecodeError):
        raise BenchError(f"no metrics.json from the chief at {source}; see the logs in {run_dir}") from None
    keys = ("examples_per_second", "test_accuracy", "steps", "global_batch_size", "time_to_first_step_seconds")
    missing = [key for key in keys if report.get(key) is None]
    if missing:
        raise BenchError(f"{source} lacks {', '.join(missing)}; the run may have been too short to measure")
    return report


# ---- the phase ---------------------------------------------------------------------------------


def run_async_rounds(args: argparse.Namespace, scratch: pathlib.Path) -> dict[str, list[dict[str, Any]]]:
    """Every variant once per round, `--repeats` rounds, interleaved."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    for round_index in range(args.repeats):
        for name in VARIANTS:
            print(f"[async round {round_index + 1}/{args.repeats}] {name} ...", end=" ", flush=True)
            result = run_once(name, args, scratch / f"async-{name}-{round_index}")
            result["round"] = round_index
            runs[name].append(result)
            print(
                f"{result['examples_per_second']:,.0f} ex/s, test accuracy {result['test_accuracy']:.4f} after "
                f"{result['examples_trained']:,} examples, {result['wall_seconds']:.1f} s, other processes "
                f"{100 * result['background_cpu_share']:.0f}% of the CPUs",
                flush=True,
            )
    return runs


def accuracy_at(evaluations: list[dict[str, Any]], seconds: float) -> dict[str, Any] | None:
    """The latest evaluation printed by `seconds`, or None if none was."""
    done = [evaluation for evaluation in evaluations if evaluation["seconds"] <= seconds]
    return done[-1] if done else None


def same_wall_time(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Both runs' test accuracy when the sooner of the two printed its last evaluation."""
    seconds = min(first["evaluations"][-1]["seconds"], second["evaluations"][-1]["seconds"])
    return {"seconds": seconds, "evaluations": [accuracy_at(run["evaluations"], seconds) for run in (first, second)]}


def seconds_to_accuracy(run: dict[str, Any]) -> float | None:
    """Seconds from launch to the first evaluation within 0.01 of the task's best, or None if never."""
    reached = [e["seconds"] for e in run["evaluations"] if e["test_accuracy"] >= REACHED_ACCURACY]
    return reached[0] if reached else None


def reaching(runs: list[dict[str, Any]]) -> list[float]:
    return [seconds for seconds in map(seconds_to_accuracy, runs) if seconds is not None]


def ratio_of(top: list[dict[str, Any]], bottom: list[dict[str, Any]]) -> dict[str, Any]:
    numerators = [run["examples_per_second"] for run in top]
    denominators = [run["examples_per_second"] for run in bottom]
    return {
        "of_medians": statistics.median(numerators) / statistics.median(denominators),
        "per_round": [a / b for a, b in zip(numerators, denominators, strict=True)],
    }


def summarize(runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace) -> dict[str, Any]:
    """What results.json keeps under "async": every run, per-variant spreads, the ratios and both accuracies."""
    wall_time = {}
    for pair, (sync_name, async_name) in PAIRS.items():
        rounds = [same_wall_time(s, a) for s, a in zip(runs[sync_name], runs[async_name], strict=True)]
        wall_time[pair] = {
            "variants": [sync_name, async_name],
            "per_round": rounds,
            "seconds": spread([r["seconds"] for r in rounds]),
            "test_accuracy": {
                name: spread([r["evaluations"][i]["test_accuracy"] for r in rounds if r["evaluations"][i]])
                if any(r["evaluations"][i] for r in rounds)
                else None
                for i, name in enumerate((sync_name, async_name))
            },
        }
    return {
        "config": {
            "data": f"synthetic 28x28x1, {args.async_train_examples} train x {args.async_epochs} epochs, "
            f"{args.async_test_examples} test",
            "per_worker_batch_size": args.async_batch,
            "workers": WORKERS,
            "ps_tasks": 1,
            "threads_per_process": 1,
            "straggler": {
                "replica": f"{STRAGGLER[0].lower()}-{STRAGGLER[1]}",
                "stopped_share": args.straggler_stopped,
                "period_seconds": args.straggler_period,
                "how": "SIGSTOP/SIGCONT of its process group by the bench",
            },
            "wall_time": "seconds from the launch of the processes to the chief's epoch line (test pass included)",
            "reached_accuracy": REACHED_ACCURACY,
            "commands": {
                mode: [part.replace(f"{ROOT}{os.sep}", "") for part in trainer_command(mode, args, pathlib.Path("M"))]
                for mode in ("sync", "async")
            },
        },
        "variants": {
            name: {
                "label": VARIANTS[name]["label"],
                "runs": runs[name],
                "summary": {
                    **{
                        key: spread([run[key] for run in runs[name]])
                        for key in ("examples_per_second", "test_accuracy", "wall_seconds", "background_cpu_share")
                    },
                    # Runs that never got within 0.01 of the best are left out; runs_reaching_accuracy says how many.
                    "seconds_to_accuracy": spread(reached) if (reached := reaching(runs[name])) else None,
                    "runs_reaching_accuracy": len(reaching(runs[name])),
                },
            }
            for name in VARIANTS
        },
        "ratios": {
            "async_over_sync": ratio_of(runs["async_two_workers"], runs["sync_two_workers"]),
            "sync_straggler_over_sync": ratio_of(runs["sync_two_workers_straggler"], runs["sync_two_workers"]),
            "async_straggler_over_async": ratio_of(runs["async_two_workers_straggler"], runs["async_two_workers"]),
            "async_straggler_over_sync_straggler": ratio_of(
                runs["async_two_workers_straggler"], runs["sync_two_workers_straggler"]
            ),
        },
        "accuracy_after_same_wall_time": wall_time,
    }


def print_summary(phase: dict[str, Any]) -> None:
    config = phase["config"]
    straggler = config["straggler"]
    print(
        f"\nasync phase: {config['data']}, per-worker batch {config['per_worker_batch_size']}; straggler "
        f"{straggler['replica']} stopped {100 * straggler['stopped_share']:.0f}% of every "
        f"{1000 * straggler['period_seconds']:.0f} ms"
    )
    reached_header = f"s to {config['reached_accuracy']:g} (runs)"
    print(f"{'variant':<38}{'examples/s (median, min-max)':>30}{'final test accuracy':>21}{reached_header:>22}")
    for variant in phase["variants"].values():
        summary = variant["summary"]
        eps, accuracy, reached = (
            summary["examples_per_second"],
            summary["test_accuracy"],
            summary["seconds_to_accuracy"],
        )
        seconds = "never" if reached is None else f"{reached['median']:.1f}"
        print(
            f"{variant['label']:<38}{eps['median']:>12,.0f} ({eps['min']:,.0f}-{eps['max']:,.0f}){'':>4}"
            f"{accuracy['median']:>17.4f}{seconds:>15} ({summary['runs_reaching_accuracy']}/{len(variant['runs'])})"
        )
    for name, ratio in phase["ratios"].items():
        rounds = ", ".join(f"{value:.2f}x" for value in ratio["per_round"])
        print(f"{name.replace('_', ' ')}: {ratio['of_medians']:.2f}x (per round: {rounds})")
    for pair, figures in phase["accuracy_after_same_wall_time"].items():
        described = []
        for index, name in enumerate(figures["variants"]):
            done = [r["evaluations"][index] for r in figures["per_round"] if r["evaluations"][index]]
            accuracy = figures["test_accuracy"][name]
            described.append(
                "no evaluation yet"
                if accuracy is None
                else f"{accuracy['median']:.4f} after epoch {statistics.median(e['epoch'] for e in done):g}"
            )
        print(
            f"test accuracy after the same wall time ({pair}, {figures['seconds']['median']:.1f} s from launch, "
            f"medians): sync {described[0]}, async {described[1]}"
        )
