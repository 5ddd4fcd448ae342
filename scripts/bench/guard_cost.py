"""What the non-finite guard (--on-nonfinite, docs/trainer.md) costs: the trainer at its defaults with the guard
(stop, the default) and without it (ignore), and skip, each for the same steps, interleaved per round.

    python -m scripts.bench.guard_cost --rounds 5 --workers 1

Prints each run's steady examples/s and, per variant, the median and its ratio to `ignore`; a quiet machine only.
"""

from __future__ import annotations

import argparse
import statistics
import sys

from .runs import run_once, scratch_dir

VARIANTS = ("ignore", "stop", "skip")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.guard_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds; each runs every variant once, in turn")
    parser.add_argument("--workers", type=int, default=1, help="trainer processes per run")
    parser.add_argument("--per-worker-batch-size", type=int, default=64, help="the trainer's default")
    parser.add_argument("--steps", type=int, default=400, help="training steps per run, warm-up included")
    parser.add_argument("--warmup-steps", type=int, default=48, help="steps left out of examples/s")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before a run counts as hung")
    args = parser.parse_args(argv)
    args.trainer_flags = []
    speeds: dict[str, list[float]] = {variant: [] for variant in VARIANTS}
    with scratch_dir("bench-guard-") as scratch:
        for round_index in range(args.rounds):
            # Rotate the order, so no variant always runs first in a round.
            order = VARIANTS[round_index % len(VARIANTS) :] + VARIANTS[: round_index % len(VARIANTS)]
            for variant in order:
                run_dir = scratch / f"{round_index}-{variant}"
                result = run_once(
                    "trainer",
                    args.workers,
                    args.per_worker_batch_size,
                    args,
                    run_dir,
                    extra_flags=["--on-nonfinite", variant],
                )
                speeds[variant].append(result["examples_per_second"])
                print(f"round {round_index + 1} {variant}: {result['examples_per_second']:.0f} examples/s", flush=True)
    baseline = statistics.median(speeds["ignore"])
    for variant in VARIANTS:
        median = statistics.median(speeds[variant])
        print(f"{variant}: median {median:.0f} examples/s, {median / baseline:.3f} of ignore")
    return 0


if __name__ == "__main__":
    sys.exit(main())
