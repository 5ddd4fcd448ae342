"""The private TensorFlow and Keras APIs of trainer/base/private_api.py, each checked for what the trainer relies on. A
failure names the version the function was written for and the one installed: the first place to look after an
upgrade."""

from __future__ import annotations

import keras
import pytest
import tensorflow as tf

from replicas import two_replicas
from trainer.base import private_api


def broken(what: str) -> str:
    written = private_api.WRITTEN_FOR
    return (
        f"{what}: trainer/base/private_api.py was written for TensorFlow {written['tensorflow']} and Keras "
        f"{written['keras']}; installed are TensorFlow {tf.__version__} and Keras {keras.__version__}"
    )


def test_the_pins_are_the_versions_it_was_written_for():
    assert tf.__version__.startswith(private_api.WRITTEN_FOR["tensorflow"] + "."), broken("TensorFlow moved")
    assert keras.__version__.startswith(private_api.WRITTEN_FOR["keras"] + "."), broken("Keras moved")


def test_the_optimizer_sums_its_gradients_through_the_replaced_method():
    strategy = two_replicas()
    seen = []
    with strategy.scope():
        variable = tf.Variable([1.0, 2.0])
        optimizer = keras.optimizers.SGD(learning_rate=1.0)
        original = getattr(optimizer, private_api.KERAS_GRADIENT_ALL_REDUCE, None)
        assert callable(original), broken(f"Keras optimizers lost {private_api.KERAS_GRADIENT_ALL_REDUCE}")

        def reducer(grads_and_vars):
            pairs = list(grads_and_vars)
            seen.append(len(pairs))
            return original(pairs)

        private_api.replace_gradient_all_reduce(optimizer, reducer)
        optimizer.build([variable])

    @tf.function
    def step():
        def replica():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(variable)
            optimizer.apply_gradients([(tape.gradient(loss, variable), variable)])

        strategy.run(replica)

    step()
    assert seen, broken("apply_gradients no longer calls the gradient all-reduce method")
    # Each replica's gradient is 1 per element; summed over the two replicas and applied once: 1 - 2, 2 - 2.
    assert variable.numpy().tolist() == [-1.0, 0.0], broken("the method's sum is not what the optimizer applies")


def test_a_replica_variable_knows_its_distributed_container():
    strategy = two_replicas()
    with strategy.scope():
        mirrored = tf.Variable(1.0)
    component = mirrored.values[1]
    assert private_api.distributed_container(component) is mirrored, broken("_distributed_container changed")
    plain = tf.Variable(2.0)
    assert private_api.distributed_container(plain) is plain


def test_the_checkpoint_keys_and_shapes_are_those_a_save_writes(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    checkpoint = tf.train.Checkpoint(model=model, step=tf.Variable(0, dtype=tf.int64))
    predicted = private_api.checkpoint_variable_shapes(checkpoint)
    assert predicted is not None, broken("save_util's serialized graph no longer holds plain variables")
    written = dict(tf.train.list_variables(checkpoint.write(str(tmp_path / "ckpt"))))
    assert {key: list(shape) for key, shape in written.items() if key in predicted} == predicted
    assert set(written) - set(predicted) <= {"_CHECKPOINTABLE_OBJECT_GRAPH"}, broken("save_util names other keys")


def test_the_barrier_exists_and_needs_the_coordination_service():
    # A group's workers meet at it for real in tests/trainer/test_multiworker.py; alone, it must refuse cleanly.
    with pytest.raises(tf.errors.FailedPreconditionError, match="[Cc]oordination service"):
        private_api.wait_at_barrier("private_api_probe", 100)


# The error a chief's copy of a call's output raised when the worker died (tests/trainer/test_async.py reproduces it).
COPY_FROM_A_DEAD_WORKER = (
    "{{function_node __wrapped__Identity_device_/job:chief/replica:0/task:0/device:CPU:0}} failed to connect to all "
    "addresses; last error: UNKNOWN: ipv4:127.0.0.1:46639: Failed to connect to remote host: Connection refused\n"
    "Additional GRPC error information from remote target /job:worker/replica:0/task:1 while calling "
    "/tensorflow.eager.EagerService/Enqueue"
)


def test_the_coordinator_counts_a_dead_workers_connection_as_a_lost_worker_and_nothing_else():
    lost = tf.errors.UnavailableError(None, None, COPY_FROM_A_DEAD_WORKER)
    assert private_api.is_lost_worker(lost), broken("ClusterCoordinator no longer reruns a dead worker's calls")
    from_a_ps = tf.errors.UnavailableError(None, None, COPY_FROM_A_DEAD_WORKER.replace("/job:worker", "/job:ps"))
    assert not private_api.is_lost_worker(from_a_ps)  # the variables are lost: the group restarts
    assert not private_api.is_lost_worker(tf.errors.InvalidArgumentError(None, None, "bad input on /job:worker"))
