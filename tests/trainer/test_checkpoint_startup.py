"""Restoring at start-up, in one process: nothing written to learn the model's shapes, no tensor read twice, and a
checkpoint damaged inside its data caught without training on from half-restored weights."""

import pytest
import tensorflow as tf
from tensorflow.python.training import py_checkpoint_reader

from trainer.artifacts.checkpoint import Checkpointer, checkpoint_prefixes
from trainer.artifacts.layout import ModelDir
from trainer.base.errors import ModelDirError
from trainer.context import parse_config
from trainer.data.datasets import Source, image_spec
from trainer.optimizer import build_optimizer
from trainer.task import task_of


def checkpointer(model_dir, seed=1, strategy=None):
    tf.keras.utils.set_random_seed(seed)
    with (strategy or tf.distribute.get_strategy()).scope():
        config = parse_config([], {})
        task = task_of(config)
        model = task.build_model(Source(None, None, image_spec((28, 28, 1)), 10))
        optimizer = build_optimizer(task, config, 1e-3, 0)
        optimizer.build(model.trainable_variables)
        return Checkpointer(ModelDir(str(model_dir)), True, "worker-0", 5, model=model, optimizer=optimizer), model


@pytest.mark.parametrize("distributed", [False, True])
def test_a_restore_writes_no_checkpoint_and_reads_each_tensor_once(tmp_path, monkeypatch, distributed):
    # Mirrored over the two logical CPUs (tests/trainer/conftest.py): variables as a group's workers hold them.
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]) if distributed else None
    saver, trained = checkpointer(tmp_path, seed=1, strategy=strategy)
    saver.save(12)
    restorer, fresh = checkpointer(tmp_path, seed=2, strategy=strategy)
    monkeypatch.setattr(tf.train.Checkpoint, "write", lambda *args, **kwargs: pytest.fail("wrote a checkpoint"))
    read_graph = py_checkpoint_reader.CheckpointReader.get_tensor

    def get_tensor(reader, name):
        # The restore reads the object graph (a string) through the reader; the variables' tensors it reads in C++.
        assert name == "_CHECKPOINTABLE_OBJECT_GRAPH", f"read {name} to check the checkpoint"
        return read_graph(reader, name)

    monkeypatch.setattr(py_checkpoint_reader.CheckpointReader, "get_tensor", get_tensor)
    assert restorer.restore_latest() == 12
    for mine, theirs in zip(fresh.weights, trained.weights, strict=True):
        assert (mine.numpy() == theirs.numpy()).all()


def corrupt_the_middle(prefix):
    data = f"{prefix}.data-00000-of-00001"
    content = bytearray(open(data, "rb").read())
    middle = len(content) // 2
    content[middle : middle + 64] = bytes(255 - b for b in content[middle : middle + 64])
    open(data, "wb").write(bytes(content))


def test_a_checkpoint_of_another_model_is_refused_from_its_index(tmp_path):
    saver, _ = checkpointer(tmp_path)
    saver.save(4)
    tf.keras.utils.set_random_seed(1)
    other = task_of(parse_config(["--model", "batch_norm"], {})).build_model(
        Source(None, None, image_spec((28, 28, 1)), 10)
    )
    with pytest.raises(ModelDirError, match="was written by a different model"):
        Checkpointer(ModelDir(str(tmp_path)), True, "worker-0", 5, model=other).restore_latest()


def test_a_checkpoint_damaged_inside_falls_back_to_the_one_before(tmp_path):
    saver, _ = checkpointer(tmp_path)
    saver.save(4)
    saver.save(8)
    corrupt_the_middle(checkpoint_prefixes(saver.directory)[0])
    restorer, _ = checkpointer(tmp_path, seed=2)
    assert restorer.restore_latest() == 4


def test_a_damaged_only_checkpoint_is_refused_rather_than_trained_on_from_half_restored_weights(tmp_path):
    saver, _ = checkpointer(tmp_path)
    saver.save(8)
    corrupt_the_middle(checkpoint_prefixes(saver.directory)[0])
    restorer, _ = checkpointer(tmp_path, seed=2)
    with pytest.raises(ModelDirError, match=r"ckpt-8 failed while being read\).*Delete the damaged checkpoint"):
        restorer.restore_latest()
