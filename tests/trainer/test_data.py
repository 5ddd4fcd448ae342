"""Datasets and the input pipeline, in one process."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf
import tensorflow_datasets as tfds

from multiworker import ROOT
from trainer import data


def as_arrays(dataset):
    images, labels = zip(*[(x.numpy(), y.numpy()) for x, y in dataset], strict=True)
    return np.stack(images), np.array(labels)


def test_synthetic_is_deterministic_and_shaped_like_fashion_mnist():
    first, again, other = (data.synthetic_splits(seed, 256, 64) for seed in (7, 7, 8))
    images, labels = as_arrays(first.train)
    assert images.shape == (256, 28, 28, 1) and images.dtype == np.uint8
    assert set(labels) <= set(range(10)) and len(set(labels)) == 10
    np.testing.assert_array_equal(images, as_arrays(again.train)[0])
    assert not np.array_equal(images, as_arrays(other.train)[0])
    assert (first.image_shape, first.num_classes) == ((28, 28, 1), 10)


def test_synthetic_labels_follow_from_images():
    splits = data.synthetic_splits(3, 2000, 500)
    train_images, train_labels = as_arrays(splits.train)
    test_images, test_labels = as_arrays(splits.test)
    # A nearest-class-mean classifier, fit on train and scored on test, far above the 10% of chance.
    means = np.stack([train_images[train_labels == c].mean(axis=0) for c in range(10)]).reshape(10, -1)
    distances = ((test_images.reshape(len(test_images), 1, -1) - means[None]) ** 2).sum(-1)
    assert (distances.argmin(1) == test_labels).mean() > 0.9
    assert not (set(map(bytes, test_images[:50])) & set(map(bytes, train_images)))


def ids(size):
    return tf.data.Dataset.range(size).map(lambda i: (i, i))


def batches(dataset):
    return [x.numpy().tolist() for x, _ in dataset]


def test_train_pipeline_gives_full_global_batches_each_epoch_in_a_new_order():
    got = batches(data.train_pipeline(ids(100), 100, global_batch_size=32, seed=1, epochs=2))
    assert len(got) == 6 and all(len(b) == 32 for b in got)
    first_epoch, second_epoch = sum(got[:3], []), sum(got[3:], [])
    assert len(set(first_epoch)) == 96 and len(set(second_epoch)) == 96
    assert first_epoch != second_epoch


def test_train_pipeline_order_depends_only_on_seed():
    one = batches(data.train_pipeline(ids(64), 64, 16, seed=5, epochs=2))
    two = batches(data.train_pipeline(ids(64), 64, 16, seed=5, epochs=2))
    other = batches(data.train_pipeline(ids(64), 64, 16, seed=6, epochs=2))
    assert one == two and one != other


@pytest.mark.parametrize("start_step", [1, 4, 5, 7])
def test_train_pipeline_resumes_at_any_step(start_step):
    full = batches(data.train_pipeline(ids(80), 80, 16, seed=2, epochs=2))
    resumed = batches(data.train_pipeline(ids(80), 80, 16, seed=2, epochs=2, start_step=start_step))
    assert resumed == full[start_step:]


def test_train_pipeline_refuses_a_split_smaller_than_one_batch():
    with pytest.raises(data.DataError, match="fewer than one global batch of 64"):
        data.train_pipeline(ids(10), 10, 64, seed=0, epochs=1)


def test_test_pipeline_keeps_every_example_once():
    got = batches(data.test_pipeline(ids(70), 32))
    assert [len(b) for b in got] == [32, 32, 6] and sorted(sum(got, [])) == list(range(70))


def test_limits_keep_the_first_examples():
    splits = data.load_splits("synthetic", "unused", seed=1, train_examples=128, test_examples=32)
    assert (splits.train_size, splits.test_size) == (128, 32)
    assert len(as_arrays(splits.train)[1]) == 128


@pytest.mark.parametrize("name, shape", [("fashion_mnist", (28, 28, 1)), ("mnist", (28, 28, 1)),
                                         ("cifar10", (32, 32, 3))])
def test_tfds_datasets_load_through_the_real_builder(tmp_path, name, shape):
    with tfds.testing.mock_data(num_examples=48):
        splits = data.load_splits(name, str(tmp_path), seed=0, download=True, train_examples=40)
        images, labels = as_arrays(splits.train)
    assert splits.image_shape == shape and splits.num_classes == 10
    assert images.shape == (40, *shape) and images.dtype == np.uint8
    assert splits.train_size == 40 and splits.test_size == 48


def test_missing_tfds_dataset_says_how_to_prepare_it(tmp_path):
    with pytest.raises(data.DataError) as error:
        data.load_splits("mnist", str(tmp_path), seed=0, download=False)
    assert "python -m trainer.data --dataset mnist" in str(error.value) and "--download" in str(error.value)


def test_prepare_command_accepts_synthetic_without_work():
    result = subprocess.run([sys.executable, "-m", "trainer.data", "--dataset", "synthetic"], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and "nothing to prepare" in result.stdout


def test_a_failed_download_says_what_to_check(monkeypatch, capsys, tmp_path):
    def unreachable(dataset, data_dir):
        raise ConnectionError("Failed to resolve 'fashion-mnist.example' ([Errno -2] Name or service not known)")

    monkeypatch.setattr(data, "prepare", unreachable)
    assert data.main(["--dataset", "fashion_mnist", "--data-dir", str(tmp_path)]) == 1
    message = capsys.readouterr().err
    assert "preparing fashion_mnist" in message and "ConnectionError" in message
    assert "Check the network" in message and "--dataset synthetic" in message
