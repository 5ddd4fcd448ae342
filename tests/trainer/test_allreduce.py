"""The gradient all-reduce of trainer/distribution/allreduce.py, in real two-process groups on 127.0.0.1: buckets
change no number, 16-bit gradients keep every worker identical and learn as well as float32."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from multiworker import ROOT, run_group, trainer_flags
from record_files import write_records
from trainer.artifacts import layout
from trainer.distribution import allreduce

STEPS = 24


def probe(tmp_path, compression: str, bucket_bytes: int) -> list[dict[str, np.ndarray]]:
    out = tmp_path / f"{compression}-{bucket_bytes}"
    out.mkdir()
    results = run_group(2, [str(out), compression, str(bucket_bytes), str(STEPS)], module="allreduce_probe")
    for result in results.values():
        assert result.returncode == 0, result.output[-3000:]
    return [dict(np.load(out / f"worker-{rank}.npz")) for rank in (0, 1)]


def weights(worker: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [worker[f"arr_{i}"] for i in range(sum(key.startswith("arr_") for key in worker))]


def flatten(worker: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([w.ravel() for w in weights(worker)])


def test_bad_settings_are_refused_with_the_choices():
    import keras

    with pytest.raises(ValueError, match="choose one of none, bf16, fp16"):
        allreduce.install(keras.optimizers.Adam(), "int8", 0)
    with pytest.raises(ValueError, match="0 \\(one batch\\) or positive"):
        allreduce.install(keras.optimizers.Adam(), "none", -1)


@pytest.mark.slow
def test_buckets_cut_the_all_reduce_and_change_no_weight_and_16_bit_keeps_workers_identical(tmp_path):
    one_batch = probe(tmp_path, "none", 0)
    bucketed = probe(tmp_path, "none", 4096)
    # The model's 10 gradients in one all-reduce, against one per bucket (plus the stop flag's, in both).
    assert int(bucketed[0]["collectives"]) > int(one_batch[0]["collectives"]) + 2, (
        bucketed[0]["collectives"],
        one_batch[0]["collectives"],
    )
    for run in (one_batch, bucketed):
        for mine, theirs in zip(weights(run[0]), weights(run[1]), strict=True):
            np.testing.assert_array_equal(mine, theirs)
    # Two workers: each element is the same two numbers added, in whichever bucket it travels.
    for mine, theirs in zip(weights(one_batch[0]), weights(bucketed[0]), strict=True):
        np.testing.assert_allclose(mine, theirs, rtol=1e-6, atol=1e-7)

    for compression in ("bf16", "fp16"):
        run = probe(tmp_path, compression, 4096)
        for mine, theirs in zip(weights(run[0]), weights(run[1]), strict=True):
            np.testing.assert_array_equal(mine, theirs)
            assert np.all(np.isfinite(mine))
        # Float32 training moved the weights by `update`; 16-bit gradients end up a part of that away from it.
        flat, reference = flatten(run[0]), flatten(one_batch[0])
        update = np.linalg.norm(reference - one_batch[0]["initial"])
        print(f"{compression}: off float32's weights by {np.linalg.norm(flat - reference) / update:.3f} of its update")
        # Measured: bf16 0.19, fp16 0.06 (Adam turns rounding of near-zero gradients into whole steps); broken
        # compression (lost or garbled gradients) is 1 or more.
        assert np.linalg.norm(flat - reference) < 0.4 * update, compression
        if compression == "fp16":
            exponents = run[0]["exponents"]
            assert len(exponents) == 10 and np.all(np.isfinite(exponents))
            # Chosen from the summed gradients, not left at the first guess, and the same on both workers.
            assert np.any(exponents != 10.0)
            np.testing.assert_array_equal(exponents, run[1]["exponents"])


# 192 steps: past the steep part of the curve, where one rounding more or less moves accuracy by a few points.
ACCURACY_RUN = trainer_flags(epochs=3, train_examples=4096, test_examples=2000, seed=5, log_every=64)


def accuracy(tmp_path, name: str, data: list[str], compression: str) -> float:
    model_dir = tmp_path / name
    results = run_group(
        2,
        [*data, *ACCURACY_RUN, "--per-worker-batch-size", "32", "--gradient-compression", compression,
         "--model-dir", str(model_dir)],
        timeout=300,
    )  # fmt: skip
    for result in results.values():
        assert result.returncode == 0, result.output[-3000:]
    digests = {line.split("weights sha256 ")[1] for r in results.values() for line in r.output.splitlines() if
               " finished: " in line}  # fmt: skip
    assert len(digests) == 1
    return json.loads((model_dir / layout.METRICS).read_text())["test_accuracy"]


@pytest.mark.slow
def test_16_bit_gradients_reach_the_accuracy_of_float32_after_the_same_steps(tmp_path):
    # One dataset is enough for a property of the gradients: TFRecord files, the input path real data takes.
    files = write_records(tmp_path / "records", 4096, 4, 2000, 2, seed=5)
    flags = ["--dataset", "tfrecord", *files, "--image-shape", "28x28x1", "--num-classes", "10"]
    reached = {
        compression: accuracy(tmp_path, compression, flags, compression) for compression in allreduce.COMPRESSIONS
    }
    print(f"test accuracy after the same steps {reached}")
    for compression in ("bf16", "fp16"):
        assert abs(reached[compression] - reached["none"]) <= 0.02, reached


@pytest.mark.slow  # several processes for long: make test-slow
def test_buckets_get_a_second_inter_op_thread_even_with_one_thread():
    script = (
        "import tensorflow as tf\n"
        "from trainer.distribution.cluster import from_environment\n"
        "from trainer.distribution.strategy import share_cores\n"
        "import sys\n"
        "share_cores(int(sys.argv[1]), from_environment({}), overlap=sys.argv[2] == '1')\n"
        "print(tf.config.threading.get_intra_op_parallelism_threads(), "
        "tf.config.threading.get_inter_op_parallelism_threads())\n"
    )
    found = {}
    for threads, overlap in (("1", "0"), ("1", "1"), ("3", "1")):
        result = subprocess.run(
            [sys.executable, "-c", script, threads, overlap], cwd=ROOT, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stderr[-2000:]
        found[(threads, overlap)] = result.stdout.split()[-2:]
    assert found == {("1", "0"): ["1", "1"], ("1", "1"): ["1", "2"], ("3", "1"): ["3", "3"]}
