"""--dataset image_folder's input pipeline against Keras's image_dataset_from_directory, on a folder of real images.

    python -m scripts.bench.image_folder --out /tmp/digits [--copies 10] [--rounds 3]

The folder: scikit-learn's 1,797 scanned digits (its digits.csv.gz, read from an installed scikit-learn without
importing it: `pip install scikit-learn`), each written as a 32x32 RGB PNG and a JPEG in class folders named
"zero" ... "nine" (3,594 files), and a copy with every file `--copies` times. Each measurement runs in a process of
its own (its peak RSS is the process's), rounds interleaved: worker 0 of 2 reading its shard through the trainer's
pipeline (trainer.data.image_folder, --cache none, so every image is read and decoded), and Keras's loader reading
the same folder (it has no per-worker shard; images/s is per image either way), each at 1x and at `--copies`x.
Prints one JSON line per measurement and a summary line.
"""

from __future__ import annotations

import argparse
import gzip
import importlib.util
import io
import json
import os
import pathlib
import resource
import subprocess
import sys
import time

NAMES = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
BATCH, SHAPE = 64, (32, 32, 3)


def digits() -> tuple[list, list]:
    """scikit-learn's digits (8x8, values 0..16) and their labels, from its CSV."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("error: this bench reads scikit-learn's digits: pip install scikit-learn")
    path = pathlib.Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    rows = [[int(float(value)) for value in line.split(",")] for line in gzip.open(path, "rt") if line.strip()]
    return [row[:64] for row in rows], [row[64] for row in rows]


def write_folder(out: pathlib.Path, copies: int) -> int:
    """out/train/<name>/ and out/test/<name>/ (one in five to test), each digit as PNG and JPEG, `copies` times."""
    import numpy as np
    from PIL import Image

    pixels, labels = digits()
    written = 0
    for number, (row, label) in enumerate(zip(pixels, labels, strict=True)):
        gray = (np.array(row, np.float32).reshape(8, 8) * 255 / 16).astype(np.uint8)
        image = Image.fromarray(gray).resize((32, 32), Image.BILINEAR).convert("RGB")
        split = "test" if number % 5 == 0 else "train"
        for fmt, extension in (("PNG", "png"), ("JPEG", "jpg")):
            buffer = io.BytesIO()
            image.save(buffer, fmt)
            for copy in range(copies):
                path = out / split / NAMES[label] / f"{number:04d}-{copy}.{extension}"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(buffer.getvalue())
                written += 1
    return written


def ours(folder: str, images: int) -> float:
    """Worker 0 of 2's training pipeline: images/s."""
    import tensorflow as tf

    from trainer.data import image_folder, pipeline

    listing = image_folder.list_folder(folder, 0.1, 1)
    shard = image_folder.ImageFiles(listing.train, SHAPE).shard(0, 2)
    steps = shard.size // BATCH
    batches = pipeline.train_batches(shard, 0, BATCH, steps * BATCH, 1, 10**6, 0, steps, 10_000, "none")
    return _rate(iter(batches), images, lambda batch: int(tf.shape(batch[0])[0]))


def keras_loader(folder: str, images: int) -> float:
    """keras.utils.image_dataset_from_directory on the same train/ folder: images/s."""
    import keras
    import tensorflow as tf

    dataset = keras.utils.image_dataset_from_directory(
        os.path.join(folder, "train"), image_size=SHAPE[:2], batch_size=BATCH, shuffle=True, seed=1, verbose=False
    )
    return _rate(iter(dataset.repeat()), images, lambda batch: int(tf.shape(batch[0])[0]))


def _rate(iterator, images: int, size) -> float:
    for _ in range(5):  # warm-up: the first batches build the pipeline
        next(iterator)
    started, seen = time.perf_counter(), 0
    while seen < images:
        seen += size(next(iterator))
    return seen / (time.perf_counter() - started)


def measure_in_this_process(variant: str, folder: str, images: int) -> dict:
    rate = (ours if variant == "image_folder" else keras_loader)(folder, images)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"variant": variant, "folder": folder, "images_per_second": round(rate, 1), "peak_rss_mib": round(peak_mib)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.bench.image_folder", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, required=True, help="where the folders are written (reused)")
    parser.add_argument("--copies", type=int, default=10, help="the large folder holds each file this many times")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--images", type=int, default=6_000, help="images read per measurement")
    parser.add_argument("--measure", nargs=2, metavar=("VARIANT", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.measure:
        print(json.dumps(measure_in_this_process(*args.measure, args.images)), flush=True)
        return 0
    folders = {"1x": args.out / "1x", f"{args.copies}x": args.out / f"{args.copies}x"}
    for name, folder in folders.items():
        if not (folder / "train").is_dir():
            print(f"writing {folder}: {write_folder(folder, 1 if name == '1x' else args.copies)} files", flush=True)
    results: dict[str, list[dict]] = {}
    for _ in range(args.rounds):
        for variant in ("image_folder", "keras"):
            for name, folder in folders.items():
                command = [
                    sys.executable,
                    "-m",
                    "scripts.bench.image_folder",
                    "--out",
                    str(args.out),
                    "--images",
                    str(args.images),
                    "--measure",
                    variant,
                    str(folder),
                ]
                line = (
                    subprocess.run(command, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
                )
                print(line, flush=True)
                results.setdefault(f"{variant} {name}", []).append(json.loads(line))
    summary = {
        key: {
            "images_per_second_median": sorted(r["images_per_second"] for r in runs)[len(runs) // 2],
            "peak_rss_mib_max": max(r["peak_rss_mib"] for r in runs),
        }
        for key, runs in results.items()
    }
    print(json.dumps({"summary": summary}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
