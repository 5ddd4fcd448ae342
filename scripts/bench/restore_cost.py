"""What restoring the newest checkpoint costs at start-up, against model size: the check before the restore as it was
(a throwaway checkpoint written and read back to learn the model's shapes, then every tensor of the candidate read
once to check it, then the restore) against now (Checkpointer.restore_latest: shapes from the object graph, the
candidate's index, one restore).

    python -m scripts.bench.restore_cost [--runs 5]

For the CNN and `wide` (about 100x its parameters, scripts/bench/startup_by_model.py), in one process, the two ways
interleaved --runs times on the same checkpoint; prints the median seconds of each and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.restore_cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)

    import tensorflow as tf

    from scripts.bench.startup_by_model import register_wide
    from trainer.artifacts import checkpoint
    from trainer.artifacts.layout import ModelDir
    from trainer.context import parse_config
    from trainer.data.datasets import Source, image_spec
    from trainer.optimizer import build_optimizer
    from trainer.task import task_of

    register_wide()

    def checkpointer(model_name: str, model_dir: str) -> checkpoint.Checkpointer:
        config = parse_config(["--model", model_name], {})
        task = task_of(config)
        model = task.build_model(Source(None, None, image_spec((28, 28, 1)), 10))
        optimizer = build_optimizer(task, config, 1e-3, 0)
        optimizer.build(model.trainable_variables)
        return checkpoint.Checkpointer(ModelDir(model_dir), True, "worker-0", 3, model=model, optimizer=optimizer)

    def as_it_was(restorer: checkpoint.Checkpointer) -> None:
        scratch = tempfile.mkdtemp(prefix="probe-")
        try:
            probe = tf.train.load_checkpoint(restorer.checkpoint.write(os.path.join(scratch, "probe")))
            probe.get_variable_to_shape_map()
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        path = checkpoint.checkpoint_prefixes(restorer.directory)[0]
        reader = tf.train.load_checkpoint(path)
        for name in reader.get_variable_to_shape_map():
            reader.get_tensor(name)
        restorer.checkpoint.restore(path).assert_existing_objects_matched()

    results = {}
    for model_name in ("cnn", "wide"):
        model_dir = tempfile.mkdtemp(prefix=f"restore-{model_name}-")
        try:
            checkpointer(model_name, model_dir).save(10)
            restorer = checkpointer(model_name, model_dir)
            parameters = sum(int(tf.size(v)) for v in restorer.checkpoint.model.trainable_variables)
            times: dict[str, list[float]] = {"before": [], "after": []}
            for _ in range(args.runs):
                for way, restore in (("before", as_it_was), ("after", lambda r: r.restore_latest())):
                    started = time.perf_counter()
                    restore(restorer)
                    times[way].append(time.perf_counter() - started)
            medians = {way: statistics.median(values) for way, values in times.items()}
            results[model_name] = {
                "parameters": parameters,
                "median_seconds": {way: round(value, 3) for way, value in medians.items()},
                "before_over_after": round(medians["before"] / medians["after"], 2),
            }
            print(json.dumps({"model": model_name, **results[model_name]}), flush=True)
        finally:
            shutil.rmtree(model_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
