"""make tune's throughput: trials an hour with 2 workers per trial, one trial at a time, against 1 worker per trial,
two at a time (the same cores), on the same budget; and the best trial's objective against the default
configuration's, trained by `make run-local` with the same flags.

    python -m scripts.bench.tune_trials [--trials 6] [--rounds 2] [--epochs 2] [-- trainer flags]

Each round runs both variants, interleaved, as `make tune` (its own STUDY each, removed after) on the example search
space; one JSON line per study, then a summary line. Run it on a quiet machine: the figures are ratios between the
variants of one run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time

from scripts.common.cli import split_trainer_flags
from scripts.common.settings import LOCAL_RUNS, ROOT

# name: (the study's suffix, make's variables)
VARIANTS = {
    "2 workers x 1 at once": ("2w", ("WORKERS=2", "PARALLEL=1")),
    "1 worker x 2 at once": ("1w", ("WORKERS=1", "PARALLEL=2")),
}
DEFAULT_FLAGS = ["--train-examples", "1024", "--test-examples", "1024"]  # the default does not reach the ceiling


def make(*arguments: str) -> subprocess.CompletedProcess:
    done = subprocess.run(["make", *arguments], cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"make {' '.join(arguments)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done


def best_of(study: str) -> float:
    selection = json.loads((LOCAL_RUNS / "bench-tune-selected" / "selection.json").read_text())
    return max(c["value"] for c in selection["candidates"] if c["value"] is not None and study in c["model_dir"])


def main(argv: list[str] | None = None) -> int:
    ours, trainer_flags = split_trainer_flags(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.tune_trials", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args(ours)
    flags = " ".join(trainer_flags or DEFAULT_FLAGS)
    common = ("DATASET=synthetic", f"EPOCHS={args.epochs}", f"ARGS={flags}", "JOB_NAME=bench-tune")
    make("run-local", *common, "CLEAN=1")
    default = json.loads((LOCAL_RUNS / "bench-tune" / "models" / "bench-tune" / "metrics.json").read_text())
    results: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    try:
        for round_number in range(args.rounds):
            for name, (suffix, variables) in VARIANTS.items():
                study = f"bench-tune-{round_number}-{suffix}"
                started = time.monotonic()
                make("tune", *common, *variables, f"STUDY={study}", f"TRIALS={args.trials}")
                seconds = time.monotonic() - started
                row = {"variant": name, "round": round_number, "trials": args.trials, "seconds": round(seconds, 1)}
                row |= {"trials_per_hour": round(args.trials / seconds * 3600), "best": best_of(study)}
                results[name].append(row)
                print(json.dumps(row), flush=True)
    finally:
        for path in LOCAL_RUNS.glob("bench-tune*"):
            shutil.rmtree(path)
    rates = {name: sorted(row["trials_per_hour"] for row in rows) for name, rows in results.items()}
    two, one = (rates[name] for name in VARIANTS)
    summary = {
        "trials_per_hour": rates,
        "ratio_1_worker_x2_over_2_workers": round(one[len(one) // 2] / two[len(two) // 2], 2),
        "default_test_accuracy": default["test_accuracy"],
        "best_test_accuracy": max(row["best"] for rows in results.values() for row in rows),
    }
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
