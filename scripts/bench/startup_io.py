"""Bytes a trainer reads before its first step, as the kernel counts them (`/proc/<pid>/io` rchar).

    python -m scripts.bench.startup_io --out /tmp/startup-io [--trainer-root /path/to/other/checkout]

Writes two datasets of 64x64x3 raw-image TFRecords (about 200 MB in 8 files and 2 GB in 64 files, with the record
count index beside them, as `python -m trainer.data.records` leaves it), runs one trainer process on each (no
TF_CONFIG) until its first progress line (after step 1), reads rchar there and stops it; then starts each again on
the same files and model dir (a restart); --without-index deletes the index first (files written by another
tool: the first start counts, the restart does not). Prints one JSON line per run and a summary. --trainer-root
runs another checkout's trainer (e.g. the code before a change) on the same files. --keep leaves the files
(2.2 GB) behind.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import signal
import subprocess
import sys

import numpy as np

SHAPE = (64, 64, 3)
DATASETS = {"200MB": (16_000, 8), "2GB": (160_000, 64)}
TEST_EXAMPLES = 512
FIRST_STEP_LINE = "epoch 1/1 step 1/"


def write_dataset(directory: str, examples: int, files: int, seed: int) -> None:
    """`files` train files holding `examples` random images (and one small test file), with the count index."""
    import tensorflow as tf

    from trainer.data import datasets, record_counts

    os.makedirs(directory, exist_ok=True)
    rng = np.random.default_rng(seed)
    image_bytes = int(np.prod(SHAPE))
    written: dict[str, int] = {}
    for split, total, parts in (("train", examples, files), ("test", TEST_EXAMPLES, 1)):
        for part in range(parts):
            path = os.path.join(directory, f"{split}-{part:05d}-of-{parts:05d}.tfrecord")
            size = datasets.share(total, part, parts)
            with tf.io.TFRecordWriter(path) as writer:
                for _ in range(size):
                    feature = {
                        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[rng.bytes(image_bytes)])),
                        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[int(rng.integers(10))])),
                    }
                    writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
            written[path] = size
    record_counts.RecordCounts(None).store(written)


def bytes_read_before_first_step(directory: str, model_dir: str, trainer_root: str | None) -> dict:
    """Starts `python -m trainer` on the files, reads its rchar at the first progress line, then kills it."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    env.pop("TF_CONFIG", None)
    if trainer_root:
        env["PYTHONPATH"] = os.pathsep.join([trainer_root, env.get("PYTHONPATH", "")])
    flags = [
        *("--dataset", "tfrecord", "--image-shape", "x".join(map(str, SHAPE)), "--num-classes", "10"),
        *("--train-files", os.path.join(directory, "train-*"), "--test-files", os.path.join(directory, "test-*")),
        *("--epochs", "1", "--log-every", "1", "--steps-per-loop", "1", "--threads", "2"),
        *("--model-dir", model_dir),
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "trainer", *flags],
        cwd=trainer_root or os.getcwd(),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert process.stdout is not None
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            if FIRST_STEP_LINE in line:
                with open(f"/proc/{process.pid}/io") as handle:
                    io = dict(row.split(": ") for row in handle.read().splitlines())
                return {"rchar_mb": int(io["rchar"]) / 1e6, "read_bytes_mb": int(io["read_bytes"]) / 1e6}
        raise RuntimeError(f"the trainer ended before its first step: {''.join(lines)[-3000:]}")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.startup_io", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="scratch directory for the datasets and model dirs")
    parser.add_argument("--trainer-root", help="another checkout whose trainer to measure on the same files")
    parser.add_argument("--keep", action="store_true", help="keep the datasets (2.2 GB) for another run")
    parser.add_argument(
        "--without-index",
        action="store_true",
        help="delete the record index first, as for files written by another tool: the first start counts them",
    )
    args = parser.parse_args(argv)
    results = {}
    try:
        for name, (examples, files) in DATASETS.items():
            directory = os.path.join(args.out, name)
            if not os.path.isdir(directory):
                write_dataset(directory, examples, files, seed=len(name))
            if args.without_index:
                for leftover in glob.glob(os.path.join(directory, "*record-counts.json*")):
                    os.remove(leftover)
            model_dir = os.path.join(args.out, f"model-{name}")
            shutil.rmtree(model_dir, ignore_errors=True)
            for start in ("first start", "restart"):
                result = bytes_read_before_first_step(directory, model_dir, args.trainer_root)
                results[f"{name} {start}"] = result
                print(json.dumps({"dataset": name, "start": start, **result}), flush=True)
    finally:
        if not args.keep:
            for name in DATASETS:
                shutil.rmtree(os.path.join(args.out, name), ignore_errors=True)
    small, large = results["200MB first start"]["rchar_mb"], results["2GB first start"]["rchar_mb"]
    print(
        f"first start: 2 GB run read {large:,.0f} MB, 200 MB run {small:,.0f} MB; target <= 1.2 x small + 50 = "
        f"{1.2 * small + 50:,.0f} MB: {'met' if large <= 1.2 * small + 50 else 'NOT met'}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
