"""Datasets and each worker's input pipeline, in one process."""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

import imports_of
from multiworker import ROOT
from refusing_proxy import PREPARE_DEFAULT_DATASET, refused_downloads
from trainer.base.errors import DataError
from trainer.data import __main__ as data
from trainer.data import catalog, datasets, pipeline, synthetic, tfrecord
from trainer.data.tfds import TfdsOptions
from trainer.settings.config import Config


def config(data_dir="unused", download=False, **overrides):
    values = {"dataset": "synthetic", "seed": 1, **overrides}
    return Config(**values, groups=(tfrecord.RecordOptions(), TfdsOptions(data_dir, download)))


def as_arrays(dataset):
    images, labels = zip(*[(x.numpy(), y.numpy()) for x, y in dataset], strict=True)
    return np.stack(images), np.array(labels)


def examples(split, size):
    shard = split.shard(0, 1)
    return as_arrays(shard.records(tf.constant(0, tf.int64)).take(size).map(shard.decode))


def test_synthetic_is_deterministic_any_size_and_shaped_like_fashion_mnist():
    first, again, other = (synthetic.source(config(seed=seed, train_examples=256)) for seed in (7, 7, 8))
    images, labels = examples(first.train, 256)
    assert images.shape == (256, 28, 28, 1) and images.dtype == np.uint8
    assert set(labels) == set(range(10))
    np.testing.assert_array_equal(images, examples(again.train, 256)[0])
    assert not np.array_equal(images, examples(other.train, 256)[0])
    assert (first.element_spec[0].shape, first.num_classes) == ((28, 28, 1), 10)
    assert synthetic.source(config(train_examples=600_000)).train.shard(0, 1).size == 600_000


def test_synthetic_best_accuracy_is_the_documented_one():
    """The image shows its class; the label agrees with it in 90% of examples: no model can beat 0.9."""
    splits = synthetic.source(config(seed=3, train_examples=4000, test_examples=4000))
    train_images, train_labels = examples(splits.train, 4000)
    test_images, test_labels = examples(splits.test, 4000)
    # Class means from the noisy labels still sit on the true patterns: nearest mean recovers the true class.
    means = np.stack([train_images[train_labels == c].mean(axis=0) for c in range(10)]).reshape(10, -1)

    def nearest_mean(images):
        # |x - m|^2 = |x|^2 - 2 x.m + |m|^2, and |x|^2 is the same for every mean.
        return ((means**2).sum(1) - 2 * images.reshape(len(images), -1).astype(np.float64) @ means.T).argmin(1)

    assert abs((nearest_mean(test_images) == test_labels).mean() - synthetic.BEST_ACCURACY) < 0.02
    assert abs((nearest_mean(train_images) == train_labels).mean() - synthetic.BEST_ACCURACY) < 0.02
    assert not (set(map(bytes, test_images[:50])) & set(map(bytes, train_images)))


@pytest.mark.parametrize("size, workers", [(10, 3), (96, 2), (7, 7)])
def test_generated_shards_are_disjoint_and_cover_the_split(size, workers):
    split = datasets.Generated(lambda i: (i, i), size)
    seen = [sorted(int(i) for i in split.shard(k, workers).records(tf.constant(5, tf.int64))) for k in range(workers)]
    assert sorted(sum(seen, [])) == list(range(size))
    assert [len(s) for s in seen] == [datasets.share(size, k, workers) for k in range(workers)]


def ids_split(size):
    return datasets.Generated(lambda i: (tf.zeros((1, 1, 1), tf.uint8), i), size)


def ids_arrays(size):
    return datasets.Arrays(np.zeros((size, 1, 1, 1), np.uint8), np.arange(size, dtype=np.int64))


def labels_of(shard):
    return sorted(int(y) for _, y in shard.records(tf.constant(5, tf.int64)).map(shard.decode))


@pytest.mark.parametrize("size, workers", [(10, 3), (96, 2), (7, 7)])
def test_array_shards_are_disjoint_cover_the_rows_and_hold_only_their_own(size, workers):
    split = ids_arrays(size)
    seen = [labels_of(split.shard(k, workers)) for k in range(workers)]
    assert sorted(sum(seen, [])) == list(range(size))
    assert [len(s) for s in seen] == [datasets.share(size, k, workers) for k in range(workers)]
    assert all(s == list(range(s[0], s[0] + len(s))) for s in seen if s)  # a contiguous range of rows each


def test_arrays_take_nests_and_refuse_columns_of_different_lengths():
    features = {"a": np.arange(6, dtype=np.float32), "b": np.ones((6, 2), np.float32)}
    split = datasets.Arrays(features, np.arange(6))
    assert datasets.arrays_spec(features, np.arange(6))[0]["b"] == tf.TensorSpec((2,), tf.float32)
    first, _ = next(iter(split.shard(1, 2).records(tf.constant(0, tf.int64)).map(split.shard(1, 2).decode)))
    assert set(first) == {"a", "b"} and first["b"].shape == (2,)
    assert split.fingerprint() != datasets.Arrays(features, np.arange(1, 7)).fingerprint()
    with pytest.raises(DataError, match="different lengths"):
        datasets.Arrays(np.zeros(5), np.zeros(6)).shard(0, 1)


@pytest.fixture(scope="module")
def record_split(tmp_path_factory):
    out = tmp_path_factory.mktemp("records")
    from trainer.data import records

    files = tuple(records.write_split(str(out), "train", 80, 3, seed=1, encoding="raw"))
    return tfrecord.RecordFiles(files, (28, 28, 1), label_feature="index")


def batches(shard, batch=16, epochs=2, start_step=0, seed=2, cache="none", buffer=10):
    steps = shard.size // batch
    dataset = pipeline.train_batches(shard, 0, batch, steps * batch, seed, epochs, start_step, steps, buffer, cache)
    return [labels.numpy().tolist() for _, labels in dataset]


def shard_of(kind, record_split):
    if kind.startswith("arrays"):
        return ids_arrays(80).shard(0, 1)
    return ids_split(80).shard(0, 1) if kind.startswith("generated") else record_split.shard(0, 1)


KINDS = ["generated", "generated cached", "arrays", "files", "files cached"]


@pytest.mark.parametrize("kind", KINDS)
def test_each_epoch_is_a_new_order_of_full_batches_fixed_by_the_seed(kind, record_split):
    shard = shard_of(kind, record_split)
    cache = "memory" if kind.endswith("cached") else "none"
    got = batches(shard, cache=cache)
    assert len(got) == 10 and all(len(b) == 16 for b in got)
    first, second = sum(got[:5], []), sum(got[5:], [])
    assert sorted(first) == sorted(second) == list(range(80)) and first != second
    assert got == batches(shard, cache=cache) and got != batches(shard, cache=cache, seed=3)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("start_step", [1, 4, 5, 7])
def test_resuming_at_any_step_sees_what_an_uninterrupted_run_sees(kind, start_step, record_split):
    shard = shard_of(kind, record_split)
    cache = "memory" if kind.endswith("cached") else "none"
    assert batches(shard, start_step=start_step, cache=cache) == batches(shard, cache=cache)[start_step:]


def read_all(files, shape=(28, 28, 1)):
    shard = tfrecord.RecordFiles(tuple(files), shape).shard(0, 1)
    return as_arrays(shard.records(tf.constant(0, tf.int64)).map(shard.decode))


def test_record_files_decode_raw_and_png_images_alike_and_resize_them(tmp_path):
    from trainer.data import records

    (tmp_path / "raw").mkdir()
    (tmp_path / "png").mkdir()
    raw = records.write_split(str(tmp_path / "raw"), "train", 5, 1, seed=1, encoding="raw")
    png = records.write_split(str(tmp_path / "png"), "train", 5, 1, seed=1, encoding="png")
    (raw_images, raw_labels), (png_images, png_labels) = read_all(raw), read_all(png)
    np.testing.assert_array_equal(raw_images, png_images)
    np.testing.assert_array_equal(raw_labels, png_labels)
    assert read_all(png, (14, 14, 1))[0].shape == (5, 14, 14, 1)


def test_a_shard_smaller_than_one_batch_is_refused_naming_the_fixes():
    with pytest.raises(DataError, match="fewer than one per-worker batch of 64; lower --per-worker-batch-size"):
        pipeline.steps_per_epoch([100, 10], 64)
    assert pipeline.steps_per_epoch([100, 70], 32) == 2  # the smallest shard decides, for every worker


def test_test_batches_keep_every_example_once_with_a_partial_last_batch():
    got = [labels.numpy().tolist() for _, labels in pipeline.test_batches(ids_split(70).shard(0, 1), 32, 70)]
    assert [len(b) for b in got] == [32, 32, 6] and sorted(sum(got, [])) == list(range(70))


@pytest.mark.parametrize("cache", ["memory", "disk"])
def test_cached_test_batches_are_the_same_batches_at_every_evaluation(cache):
    plain = pipeline.test_batches(ids_split(70).shard(0, 1), 32, 70)
    cached = pipeline.test_batches(ids_split(70).shard(0, 1), 32, 70, cache)
    expected = [labels.numpy().tolist() for _, labels in plain]
    for _ in range(2):  # the first evaluation fills the cache, the second reads it
        assert [labels.numpy().tolist() for _, labels in cached] == expected


def test_auto_cache_keeps_small_file_shards_in_memory_only(record_split):
    small, large = record_split.shard(0, 1), dataclasses.replace(record_split.shard(0, 1), size=600_000)
    example_bytes = datasets.Source(None, None, datasets.image_spec((28, 28, 1)), 10).example_bytes
    assert example_bytes == 28 * 28 + 8  # the uint8 image and the int64 label
    assert pipeline.cache_kind("auto", small, example_bytes) == "memory"
    assert pipeline.cache_kind("auto", large, example_bytes) == "none"
    assert pipeline.cache_kind("disk", large, example_bytes) == "disk"


@pytest.mark.parametrize(
    "name, shape",
    [("fashion_mnist", (28, 28, 1)), ("mnist", (28, 28, 1)), ("cifar10", (32, 32, 3)), ("kmnist", (28, 28, 1))],
)
def test_any_tfds_image_dataset_loads_by_name_with_shape_and_classes_from_its_builder(tmp_path, name, shape):
    with tfds.testing.mock_data(num_examples=48):
        source = catalog.load(config(dataset=name, data_dir=str(tmp_path), download=True))
        shard = source.train.shard(1, 2)
        images, labels = as_arrays(shard.records(tf.constant(0, tf.int64)).map(shard.decode))
    assert source.element_spec[0].shape == shape and source.num_classes == 10
    assert images.shape[1:] == shape and images.dtype == np.uint8
    assert "part 2 of 2" in shard.reads


def test_missing_tfds_dataset_says_how_to_prepare_it(tmp_path):
    with pytest.raises(DataError) as error:
        catalog.load(config(dataset="mnist", data_dir=str(tmp_path)))
    assert "python -m trainer.data --dataset mnist" in str(error.value) and "--download" in str(error.value)


def test_prepare_command_accepts_synthetic_without_work():
    result = subprocess.run(
        [sys.executable, "-m", "trainer.data", "--dataset", "synthetic"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and "nothing to prepare" in result.stdout


def test_a_failed_download_says_what_to_check(monkeypatch, capsys, tmp_path):
    def unreachable(dataset, data_dir):
        raise ConnectionError("Failed to resolve 'fashion-mnist.example' ([Errno -2] Name or service not known)")

    monkeypatch.setattr(data, "prepare", unreachable)
    assert data.main(["--dataset", "fashion_mnist", "--data-dir", str(tmp_path)]) == 1
    message = capsys.readouterr().err
    assert "preparing fashion_mnist" in message and "ConnectionError" in message
    assert "Check the network" in message and "--dataset synthetic" in message


def run_with_a_module_missing(tmp_path, missing, *args, env=None):
    """`python -m ARGS` in this venv with the top-level module MISSING uninstallable, as in an image whose lock left
    its package out."""
    return subprocess.run(
        imports_of.command(str(tmp_path / "imports.json"), args, [missing]),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=300,
    )


def test_a_module_missing_from_the_image_is_named_as_a_broken_image_with_the_fix_not_as_the_network(tmp_path):
    # The default dataset's preparation in an image built without importlib_resources (TFDS imports it lazily).
    with refused_downloads() as env:
        data_dir = str(tmp_path / "data")
        result = run_with_a_module_missing(tmp_path, "importlib_resources", *PREPARE_DEFAULT_DATASET, data_dir, env=env)
    assert result.returncode == 2, result.stderr[-3000:]
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith("error: preparing fashion_mnist failed: the Python module 'importlib_resources'")
    assert "incomplete" in message and "make lock" in message and "make install" in message
    assert "Check the network" not in result.stderr


def test_the_trainer_names_a_module_missing_from_its_environment_in_one_line_and_exits_permanently(tmp_path):
    model_dir = tmp_path / "model"
    result = run_with_a_module_missing(
        tmp_path,
        "tensorflow_datasets",
        *("trainer", "--dataset", "fashion_mnist", "--data-dir", str(tmp_path), "--model-dir", str(model_dir)),
    )
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "error: the Python module 'tensorflow_datasets' is not installed" in result.stderr
    status = json.loads((model_dir / "status.json").read_text())
    assert status["state"] == "failed" and "tensorflow_datasets" in status["error"]
