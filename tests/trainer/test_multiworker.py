"""Real two-process training groups on 127.0.0.1: what a user of MultiWorkerMirroredStrategy relies on."""

import json
import os
import shutil

import numpy as np
import pytest
import tensorflow as tf

from multiworker import free_ports, run_group, start, tf_config, trainer_flags, wait_all, worker_cluster
from trainer.artifacts import layout
from trainer.base.errors import ExitCode
from trainer.data import synthetic
from trainer.reporting import status

# 513 test examples: one worker's test shard has one batch more, so the other evaluates an empty batch meanwhile.
SMALL_RUN = trainer_flags(dataset="synthetic", epochs=2, train_examples=2048, test_examples=513, seed=7, log_every=16)


def finished_line(output):
    return next(line for line in output.splitlines() if " finished: " in line)


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    root = tmp_path_factory.mktemp("two_workers")
    scratch = root / "scratch"
    scratch.mkdir()
    results = run_group(
        2,
        [*SMALL_RUN, "--per-worker-batch-size", "32", "--model-dir", str(root / "model")],
        env={"TMPDIR": str(scratch)},
    )
    return root, results


def test_both_workers_succeed_with_identical_weights(two_workers):
    _, results = two_workers
    for result in results.values():
        assert result.returncode == 0, result.output[-3000:]
    digests = {finished_line(r.output).split("weights sha256 ")[1] for r in results.values()}
    assert len(digests) == 1


def test_only_the_chief_logs_progress(two_workers):
    _, results = two_workers
    assert "epoch 2/2 done" in results["worker-0"].output
    assert "epoch 2/2 done" not in results["worker-1"].output


def test_exactly_one_model_and_no_worker_scratch_left(two_workers):
    root, _ = two_workers
    assert sorted(os.listdir(root / "model")) == sorted(
        [layout.KERAS_MODEL, layout.SERVING, layout.METRICS, layout.CHECKPOINTS, layout.LOGS, layout.STATUS]
    )
    assert not [name for name in os.listdir(root / "scratch") if name.startswith("trainer-worker-save-")]
    assert sorted(os.listdir(root)) == ["model", "scratch"]


def test_only_the_chief_writes_checkpoints_and_tensorboard_logs(two_workers):
    root, _ = two_workers
    for split in ("train", "test"):
        assert len(os.listdir(root / "model" / "logs" / split)) == 1  # one writer: the chief's
    checkpoints = os.listdir(root / "model" / "checkpoints")
    assert "checkpoint" in checkpoints and "run-setup.json" in checkpoints
    assert not [name for name in os.listdir(root / "scratch") if name.startswith("trainer-worker-ckpt-")]


def test_saved_model_serves_raw_images_like_the_keras_model(two_workers):
    root, _ = two_workers
    example = synthetic.example_fn(7)
    images = np.stack([example(tf.constant(i, tf.int64))[0].numpy() for i in range(8)])
    served = tf.saved_model.load(layout.ModelDir(str(root / "model")).latest_saved_model()).signatures["serve"](
        images=tf.constant(images)
    )
    probabilities = served["probabilities"].numpy()
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)
    import keras

    logits = keras.models.load_model(root / "model" / layout.KERAS_MODEL).predict(images, verbose=0)
    np.testing.assert_array_equal(served["class_id"].numpy(), logits.argmax(axis=1))


def test_metrics_describe_the_run(two_workers):
    root, _ = two_workers
    metrics = json.loads((root / "model" / layout.METRICS).read_text())
    assert metrics["workers"] == 2 and metrics["global_batch_size"] == 64
    assert metrics["steps"] == 2 * (2048 // 64)
    assert metrics["test_accuracy"] > 0.5 and metrics["examples_per_second"] > 0
    assert metrics["config"]["per_worker_batch_size"] == 32
    assert {"tensorflow", "keras", "python"} <= set(metrics["versions"])


ACCURACY_RUN = [
    "--dataset",
    "synthetic",
    "--epochs",
    "3",
    "--train-examples",
    "4096",
    "--test-examples",
    "2000",
    "--seed",
    "5",
    "--log-every",
    "64",
]


def accuracy_of(results, model_dir):
    for result in results.values():
        assert result.returncode == 0, result.output[-3000:]
    return json.loads((model_dir / layout.METRICS).read_text())["test_accuracy"]


@pytest.mark.slow
def test_one_process_and_two_workers_reach_the_synthetic_tasks_best_accuracy_and_a_wrong_loss_scale_does_not(tmp_path):
    one = accuracy_of(
        {
            "single": wait_all(
                {
                    "single": start(
                        [*ACCURACY_RUN, "--per-worker-batch-size", "64", "--model-dir", str(tmp_path / "one")], None
                    )
                },
                timeout=300,
            )["single"]
        },
        tmp_path / "one",
    )
    two = accuracy_of(
        run_group(
            2, [*ACCURACY_RUN, "--per-worker-batch-size", "32", "--model-dir", str(tmp_path / "two")], timeout=300
        ),
        tmp_path / "two",
    )
    best = synthetic.BEST_ACCURACY
    assert abs(one - two) <= 0.02 and abs(one - best) <= 0.02 and abs(two - best) <= 0.02, (one, two)
    # Adam divides out any constant gradient scale (2x, the local-instead-of-global batch bug, trains the same:
    # the quick SGD check below catches that one); a scale that sinks the gradients under Adam's epsilon stops
    # learning, and the comparison must see it.
    wrong = accuracy_of(
        run_group(
            2,
            [*ACCURACY_RUN, "--per-worker-batch-size", "32", "--model-dir", str(tmp_path / "wrong")],
            timeout=300,
            module="wrong_loss_scale",
            env={"WRONG_LOSS_SCALE": "1e-9"},
        ),
        tmp_path / "wrong",
    )
    assert abs(wrong - best) > 0.02 and abs(wrong - one) > 0.02, (wrong, one)


def sgd_update(strategy, initial, batch, model_name):
    """The weights' change after one step of the trainer's own step function (trainer.step.train_step) with plain
    SGD, under strategy, on one global batch that the strategy splits over its replicas."""
    import keras

    from trainer.context import parse_config
    from trainer.data.datasets import Source
    from trainer.step import NonFiniteGuard, train_step
    from trainer.task import task_of

    config = parse_config(["--dataset", "synthetic", "--model", model_name], environ={})
    task = task_of(config)
    spec = (tf.TensorSpec((28, 28, 1), tf.uint8), tf.TensorSpec((), tf.int64))
    with strategy.scope():
        model = task.build_model(Source(train=None, test=None, element_spec=spec, num_classes=10))
        if initial is not None:
            model.set_weights(initial)
        optimizer = keras.optimizers.SGD(learning_rate=0.1)
        optimizer.build(model.trainable_variables)
    before = [w.copy() for w in model.get_weights()]
    guard = NonFiniteGuard(config.on_nonfinite, loss_scaled=False)
    global_batch = len(batch[1])
    (distributed,) = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(batch))

    @tf.function(autograph=False)
    def step(batch):
        strategy.run(lambda b: train_step(task, model, optimizer, b, global_batch, guard), args=(batch,))

    step(distributed)
    return before, [after - start for after, start in zip(model.get_weights(), before, strict=True)]


@pytest.mark.parametrize("model_name", ["cnn", "batch_norm"])
def test_one_sgd_step_on_two_replicas_moves_the_weights_as_one_replica_on_the_same_global_batch(model_name, request):
    # Under SGD (and --clip-norm) the loss's scale is the step's size: averaging each replica's loss over its own
    # batch instead of the global one sums to twice the update on two replicas, which Adam would divide out
    # (the accuracy comparison above cannot see it). Two logical CPUs: tests/trainer/conftest.py.
    import keras

    from replicas import two_replicas

    # float32 whatever an earlier in-process run left as the global policy, and the same initial weights every run.
    policy = keras.mixed_precision.global_policy()
    keras.mixed_precision.set_global_policy("float32")
    request.addfinalizer(lambda: keras.mixed_precision.set_global_policy(policy))
    keras.utils.set_random_seed(5)
    rng = np.random.default_rng(5)
    batch = (
        tf.constant(rng.integers(0, 256, (16, 28, 28, 1), dtype=np.uint8)),
        tf.constant(rng.integers(0, 10, (16,), dtype=np.int64)),
    )
    two = two_replicas()
    assert two.num_replicas_in_sync == 2
    initial, on_two = sgd_update(two, None, batch, model_name)
    _, on_one = sgd_update(tf.distribute.OneDeviceStrategy("/cpu:0"), initial, batch, model_name)
    moved = np.sqrt(sum(float(np.sum(u**2)) for u in on_one))
    assert moved > 1e-3  # the step did move the weights
    # Each variable's update equal within float rounding (the replicas sum in another order; synchronized batch
    # norm's statistics are all-reduced): under 2% of its size (or of a thousandth of the whole step, for a variable
    # that hardly moves), where the local-batch bug is 100%.
    off = [
        float(np.linalg.norm(two_update - one_update) / max(np.linalg.norm(one_update), 1e-3 * moved))
        for two_update, one_update in zip(on_two, on_one, strict=True)
    ]
    assert max(off) < 0.02, off


@pytest.mark.slow  # several processes for long: make test-slow
@pytest.mark.parametrize("present", ["worker-0", "worker-1"])
def test_a_worker_whose_peer_never_comes_fails_with_a_clear_error(present, tmp_path):
    cluster = worker_cluster(2)
    index = int(present[-1])
    alone = start(
        ["--dataset", "synthetic", "--startup-timeout", "5", "--model-dir", str(tmp_path / "model")],
        tf_config(cluster, "worker", index),
    )
    result = wait_all({present: alone}, timeout=90)[present]
    assert result.returncode == -9  # SIGKILL from the start-up watchdog: 137 in a pod, retryable
    assert "the training group did not form within 5 s" in result.output
    assert cluster["worker"][0] in result.output
    assert "joining the group led by" in result.output  # said before the wait, by chief and worker alike


def test_download_in_a_group_is_refused_before_tensorflow_starts(tmp_path):
    cluster = worker_cluster(2)
    result = wait_all(
        {
            "w": start(
                ["--dataset", "mnist", "--download", "--model-dir", str(tmp_path)], tf_config(cluster, "worker", 1)
            )
        },
        timeout=60,
    )["w"]
    assert result.returncode == 2 and "python -m trainer.data" in result.output


def test_a_peer_whose_host_name_never_resolves_ends_the_start_up_retryably_with_the_name_in_line_and_status(tmp_path):
    # Was sys.exit(137) from inside the strategy module: the status then recorded "SystemExit: 137" with exit code 1.
    cluster = {"worker": [f"127.0.0.1:{free_ports(1)[0]}", "no-such-peer.invalid:2222"]}
    args = ["--dataset", "synthetic", "--startup-timeout", "2", "--model-dir", str(tmp_path)]
    result = wait_all({"w": start(args, tf_config(cluster, "worker", 0))}, timeout=90)["w"]
    assert result.returncode == ExitCode.STARTUP_TIMEOUT, result.output[-3000:]
    assert "host names never resolved: no-such-peer.invalid" in result.output
    reported = status.read_status(str(tmp_path))
    assert reported["state"] == "failed" and reported["exit_code"] == ExitCode.STARTUP_TIMEOUT
    assert "no-such-peer.invalid" in reported["error"]


def test_a_bad_model_name_exits_2_before_the_group_forms(tmp_path):
    # A lone worker of a two-worker group: had it waited for its peer, the start-up watchdog would kill it.
    cluster = worker_cluster(2)
    result = wait_all(
        {
            "w": start(
                [
                    "--dataset",
                    "synthetic",
                    "--model",
                    "resnet",
                    "--startup-timeout",
                    "30",
                    "--model-dir",
                    str(tmp_path),
                ],
                tf_config(cluster, "worker", 0),
            )
        },
        timeout=90,
    )["w"]
    assert result.returncode == 2, result.output[-3000:]
    assert "unknown model 'resnet'; choose one of batch_norm, cnn, dropout" in result.output
    assert "joining the group" not in result.output


@pytest.mark.slow
@pytest.mark.parametrize("model", ["dropout", "batch_norm"])
def test_every_model_variant_ends_with_identical_weights_on_both_workers(model, tmp_path):
    results = run_group(
        2,
        [
            *SMALL_RUN,
            "--epochs",
            "1",
            "--model",
            model,
            "--per-worker-batch-size",
            "32",
            "--model-dir",
            str(tmp_path / "model"),
        ],
    )
    for result in results.values():
        assert result.returncode == 0, result.output[-3000:]
    assert len({finished_line(r.output).split("weights sha256 ")[1] for r in results.values()}) == 1


@pytest.mark.slow
def test_workers_that_restored_different_checkpoints_stop_with_the_fix(tmp_path):
    """A worker whose --model-dir is not the chief's shared volume restores another step: training on would
    silently diverge, so every worker exits 2 naming the fix."""
    run = trainer_flags(dataset="synthetic", train_examples=256, test_examples=64, per_worker_batch_size=32)
    first = run_group(2, [*run, "--epochs", "1", "--model-dir", str(tmp_path / "shared")])
    assert all(result.returncode == 0 for result in first.values()), first
    # The same run's setup without its checkpoints: the worker that mounts it restores step 0, the chief step 4.
    shutil.copytree(tmp_path / "shared", tmp_path / "local")
    shutil.rmtree(layout.ModelDir(str(tmp_path / "local")).checkpoints)
    cluster = worker_cluster(2)
    processes = {
        f"worker-{index}": start(
            [*run, "--epochs", "2", "--model-dir", str(tmp_path / model_dir)], tf_config(cluster, "worker", index)
        )
        for index, model_dir in enumerate(["shared", "local"])
    }
    for result in wait_all(processes, timeout=240).values():
        assert result.returncode == 2, result.output[-2000:]
        assert "restored different checkpoints (steps by rank: [4, 0])" in result.output
        assert "mount the same shared volume" in result.output
