"""Start-up after a restart against model size: seconds from the group forming to the first step of a resumed run.

    python scripts/bench/startup_by_model.py --out /tmp/startup [--runs 3] [--trainer-root /path/to/checkout]

For the CNN and for `wide` (the CNN with a wide classifier: about 100x its parameters), interleaved, --runs times
each: train 10 steps in one process (a checkpoint at step 10), start again with one more epoch (a resume from
that checkpoint), and read the resumed run's metrics.json `startup_seconds`. Prints one JSON line per run and the
medians. --trainer-root measures another checkout (e.g. the code before a change); the file is run by path, so
it works against any checkout that has a model registry (the image task's MODELS, or the older trainer/model.py).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys

MODELS = ("cnn", "wide")
RUN = ["--dataset", "synthetic", "--train-examples", "640", "--test-examples", "64", "--threads", "2"]


def register_wide() -> None:
    """`wide`: the CNN's convolutions, then Dense 4096 and Dense 1600 (about 9.0 M parameters; the CNN: 93 k).
    Registered where the checkout keeps its models: the image task's MODELS, or (before tasks) trainer/model.py."""
    import keras
    from keras import layers

    def wide(input_shape: tuple[int, ...], num_classes: int, *options: object) -> keras.Model:
        images = keras.Input(shape=input_shape, dtype="uint8", name="images")
        x = layers.Rescaling(1.0 / 255)(images)
        for filters, pool in ((32, True), (64, True), (64, False)):
            x = layers.Conv2D(filters, 3, activation="relu")(x)
            if pool:
                x = layers.MaxPooling2D()(x)
        x = layers.Flatten()(x)
        x = layers.Dense(4096, activation="relu")(x)
        x = layers.Dense(1600, activation="relu")(x)
        return keras.Model(images, layers.Dense(num_classes, name="logits")(x), name="wide")

    try:
        from trainer.tasks.image_classification import MODELS
    except ImportError:
        from trainer.model import MODELS  # type: ignore[no-redef]
    MODELS.register("wide")(wide)


def train(model: str, model_dir: str, epochs: int, trainer_root: str | None) -> dict:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    if trainer_root:
        env["PYTHONPATH"] = os.pathsep.join([trainer_root, env.get("PYTHONPATH", "")])
    flags = [*RUN, "--model", model, "--epochs", str(epochs), "--model-dir", model_dir]
    result = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--as-trainer", *flags],
        cwd=trainer_root or os.getcwd(),
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if result.returncode != 0:
        raise RuntimeError(f"{model} run failed ({result.returncode}): {result.stdout[-2000:]}{result.stderr[-2000:]}")
    with open(os.path.join(model_dir, "metrics.json")) as handle:
        return json.load(handle)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--trainer-root")
    args = parser.parse_args(argv)
    figures: dict[str, list[float]] = {model: [] for model in MODELS}
    for run in range(args.runs):
        for model in MODELS:
            model_dir = os.path.join(args.out, f"{model}-{run}")
            shutil.rmtree(model_dir, ignore_errors=True)
            train(model, model_dir, 1, args.trainer_root)
            metrics = train(model, model_dir, 2, args.trainer_root)
            seconds = metrics["startup_seconds"]
            row = {
                "model": model,
                "run": run,
                "resumed_from_step": metrics["resumed_from_step"],
                "group_formed_to_first_step_s": round(seconds["first_step"] - seconds["group_formed"], 3),
                "group_formed_to_model_restored_s": round(seconds["model_restored"] - seconds["group_formed"], 3),
                "startup_seconds": seconds,
            }
            figures[model].append(row["group_formed_to_first_step_s"])
            print(json.dumps(row), flush=True)
            shutil.rmtree(model_dir, ignore_errors=True)
    medians = {model: statistics.median(values) for model, values in figures.items()}
    print(json.dumps({"median_group_formed_to_first_step_s": medians}), flush=True)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--as-trainer"]:
        os.environ["KERAS_BACKEND"] = "tensorflow"
        register_wide()
        import runpy

        sys.argv = ["trainer", *sys.argv[2:]]
        runpy.run_module("trainer", run_name="__main__", alter_sys=True)
    else:
        sys.exit(main())
