"""Data at any scale: each worker reads only its shard, on real files and real process groups."""

import json
import re
import shutil
import subprocess
import sys

import pytest

from local_runner import digests, finish, job_model_dir, replica, start_runner
from multiworker import ROOT, run_group, start, tf_config, trainer_flags, wait_all, wait_for_step, worker_cluster
from record_files import write_records
from trainer.artifacts import layout
from trainer.data import catalog, datasets, tfrecord

TRAIN, TEST = 1024, 300
RECORD_FLAGS = ["--dataset", "tfrecord", "--image-shape", "28x28x1", "--num-classes", "10", "--seed", "3"]


@pytest.fixture(scope="module")
def eight_files(tmp_path_factory):
    out = tmp_path_factory.mktemp("eight")
    return out, write_records(out, TRAIN, 8, TEST, 2, seed=3)


@pytest.fixture(scope="module")
def one_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    return out, write_records(out, TRAIN, 1, TEST, 1, seed=3)


def opened_files(trace_path, directory):
    """The record files this process really opened: the kernel's openat calls, as strace logged them."""
    # A call interrupted by another thread's is logged "<unfinished ...>" without its result: keep all but failures.
    return sorted(
        {
            name
            for line in trace_path.read_text().splitlines()
            if "= -1 " not in line
            for name in re.findall(rf'openat\(AT_FDCWD, "{re.escape(str(directory))}/([^"]+\.tfrecord)"', line)
        }
    )


def probe_group(tmp_path, files, epochs=2, per_worker_batch=32, trace=False):
    """Runs shard_probe as two real workers; returns each rank's record (and strace log when traced)."""
    cluster = worker_cluster(2)
    outputs = [tmp_path / f"rank{i}.json" for i in range(2)]
    traces = [tmp_path / f"rank{i}.trace" for i in range(2)]
    args = [
        *RECORD_FLAGS,
        *files,
        "--label-feature",
        "index",
        "--epochs",
        str(epochs),
        "--per-worker-batch-size",
        str(per_worker_batch),
        "--shuffle-buffer",
        "100",
        "--cache",
        "none",
    ]
    processes = {
        f"worker-{i}": start(
            [str(outputs[i]), *args],
            tf_config(cluster, "worker", i),
            module="shard_probe",
            wrapper=["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=openat", "-o", str(traces[i])]
            if trace
            else (),
        )
        for i in range(2)
    }
    for result in wait_all(processes, timeout=240).values():
        assert result.returncode == 0, result.output[-3000:]
    return [json.loads(path.read_text()) for path in outputs], traces


def assert_epochs_disjoint_and_covering(records, epochs, per_worker_batch=32):
    steps_per_epoch = TRAIN // (2 * per_worker_batch)
    orders = []
    for epoch in range(epochs):
        seen = [sum(r["steps"][epoch * steps_per_epoch : (epoch + 1) * steps_per_epoch], []) for r in records]
        assert all(len(s) == len(set(s)) == TRAIN // 2 for s in seen)
        assert not set(seen[0]) & set(seen[1])
        assert sorted(seen[0] + seen[1]) == list(range(TRAIN))
        orders.append(seen[0])
    assert orders[0] != orders[1]  # a new order every epoch
    tested = [r["test"] for r in records]
    assert not set(tested[0]) & set(tested[1]) and sorted(tested[0] + tested[1]) == list(range(TEST))


@pytest.mark.slow  # strace is the honest record of what each process opened; CI installs it, a fresh machine may not
def test_two_workers_on_eight_files_each_open_only_their_own_four(tmp_path, eight_files):
    directory, files = eight_files
    assert shutil.which("strace"), "this test records the files each worker opens with strace: apt-get install strace"
    records, traces = probe_group(tmp_path, files, trace=True)
    train_files = [[name for name in opened_files(trace, directory) if name.startswith("train-")] for trace in traces]
    assert train_files[0] == [f"train-{i:05d}-of-00008.tfrecord" for i in (0, 2, 4, 6)]
    assert train_files[1] == [f"train-{i:05d}-of-00008.tfrecord" for i in (1, 3, 5, 7)]
    assert_epochs_disjoint_and_covering(records, epochs=2)


@pytest.mark.slow  # several processes for long: make test-slow
def test_with_one_file_two_workers_fall_back_to_element_sharding(tmp_path, one_file):
    _, files = one_file
    records, _ = probe_group(tmp_path, files)
    for record in records:
        assert "keeping one record in 2 (element sharding): fewer files than workers" in record["reads"]
    assert_epochs_disjoint_and_covering(records, epochs=2)


def finished_digests(results):
    for result in results.values():
        assert result.returncode == 0, result.output[-3000:]
    return {re.search(r"weights sha256 (\w+)", r.output).group(1) for r in results.values()}


@pytest.mark.slow
def test_two_workers_train_on_eight_files_with_identical_weights_and_count_each_test_example_once(
    tmp_path, eight_files
):
    directory, files = eight_files
    flags = trainer_flags(epochs=1, per_worker_batch_size=32, model_dir=tmp_path / "model")
    results = run_group(2, [*RECORD_FLAGS, *files, *flags])
    assert len(finished_digests(results)) == 1
    assert "worker-0 reads its own 4 of 8 files" in results["worker-0"].output
    metrics = json.loads((tmp_path / "model" / layout.METRICS).read_text())
    assert metrics["test_examples"] == metrics["test_examples_evaluated"] == TEST  # 150 per worker, last batch partial


@pytest.mark.slow
def test_two_workers_train_on_one_file_and_say_why_each_reads_it_all(tmp_path, one_file):
    _, files = one_file
    flags = trainer_flags(epochs=1, per_worker_batch_size=32, model_dir=tmp_path / "model")
    results = run_group(2, [*RECORD_FLAGS, *files, *flags])
    assert len(finished_digests(results)) == 1
    for name, result in results.items():
        lines = [line for line in result.output.splitlines() if "element sharding" in line]
        assert len(lines) == 1 and f"{name} reads all 1 file(s)" in lines[0]


USER_MODULE = '''
"""A user's own dataset, outside the trainer: registered by name, found through --dataset-module."""
import tensorflow as tf

from trainer.data import datasets


def example(index):
    label = index % 3
    image = tf.fill((28, 28, 1), tf.cast(label * 100, tf.uint8))
    return image, label


@datasets.register("stripes")
def stripes(config):
    return datasets.Source(train=datasets.Generated(example, 384), test=datasets.Generated(example, 96, 10_000),
                           element_spec=datasets.image_spec((28, 28, 1)), num_classes=3)
'''


@pytest.mark.slow  # the quick suite's margin: test_fork_module's one-dataset module stays quick
def test_a_dataset_defined_in_the_users_own_module_trains(tmp_path):
    (tmp_path / "my_data.py").write_text(USER_MODULE)
    result = wait_all(
        {
            "single": start(
                [
                    "--dataset-module",
                    "my_data",
                    "--dataset",
                    "stripes",
                    "--epochs",
                    "2",
                    "--per-worker-batch-size",
                    "32",
                    "--model-dir",
                    str(tmp_path / "model"),
                ],
                None,
                env={"PYTHONPATH": str(tmp_path)},
            )
        },
        timeout=180,
    )["single"]
    assert result.returncode == 0, result.output[-3000:]
    metrics = json.loads((tmp_path / "model" / layout.METRICS).read_text())
    assert (metrics["train_examples"], metrics["test_examples_evaluated"]) == (384, 96)
    assert metrics["test_accuracy"] > 0.9  # three flat grey levels: trivially learnable


def test_an_unknown_dataset_fails_before_the_group_forms(tmp_path):
    cluster = worker_cluster(2)  # worker 0 alone: a group could never form, so exit 2 proves the order
    result = wait_all(
        {"w": start(["--dataset", "fashion_mnistt", "--model-dir", str(tmp_path)], tf_config(cluster, "worker", 0))},
        timeout=120,
    )["w"]
    assert result.returncode == 2, result.output[-3000:]
    assert "unknown dataset 'fashion_mnistt'" in result.output and "--module" in result.output


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--dataset", "tfrecord"], "--dataset tfrecord needs --train-files, --test-files, --image-shape"),
        (["--dataset-module", "no_such_module_here"], "--dataset-module no_such_module_here: cannot import it"),
    ],
)
def test_dataset_flags_are_checked_with_the_fix_named(argv, message):
    from trainer.base.errors import DataError
    from trainer.context import parse_config

    with pytest.raises(DataError, match=re.escape(message)):
        catalog.check_dataset(parse_config(argv))


def test_files_that_match_nothing_say_which_flag(tmp_path):
    with pytest.raises(datasets.DataError, match="--train-files .* matches no file"):
        tfrecord.glob_files(str(tmp_path / "missing-*"), "--train-files")


@pytest.mark.slow
def test_the_data_check_reports_files_and_examples_in_one_line(eight_files):
    _, files = eight_files
    result = subprocess.run(
        [sys.executable, "-m", "trainer.data", *RECORD_FLAGS, *files],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == (
        f"dataset tfrecord is ready: train 8 files {TRAIN} examples, test 2 files {TEST} examples"
    )


# The batches each probe reads: four times the small dataset (60,000 examples, 937 batches of 64), so a cache of
# the small one is full and stays full while the large one's would hold four times as many examples.
PROBE_BATCHES = 4 * 60_000 // 64


def peak_rss_mb(examples, cache):
    probe = start([str(examples), cache, str(PROBE_BATCHES)], None, module="rss_probe")
    result = wait_all({"probe": probe}, timeout=300)["probe"]
    assert result.returncode == 0, result.output[-3000:]
    return json.loads(result.output.strip().splitlines()[-1])["peak_rss_mb"]


@pytest.mark.slow
@pytest.mark.parametrize("cache", ["none", "auto"])
def test_a_workers_peak_memory_does_not_grow_with_the_dataset(cache):
    """The kernel's peak RSS of the pipeline at 60,000 and 600,000 examples, each read for 240,000 examples
    (main's pipeline before this change: 754 MB and 1,410 MB, the whole split cached and shuffled in memory on every
    worker; --cache none caching in memory: 762 MB and 1,020 MB). With --cache auto the small split is cached (at
    most 256 MiB) and the large one is not."""
    one, ten = peak_rss_mb(60_000, cache), peak_rss_mb(600_000, cache)
    assert ten <= 1.1 * one, (one, ten)


RESUME_FLAGS = [
    *RECORD_FLAGS,
    "--epochs",
    "2",
    "--per-worker-batch-size",
    "32",
    "--cache",
    "none",
    "--shuffle-buffer",
    "500",
    "--checkpoint-every",
    "20",
    "--steps-per-loop",
    "4",
    "--log-every",
    "20",
    # The same thread pools in both runs (run-local sets TRAINER_THREADS from the pod's CPU limit, a bare group
    # shares the cores out): the number of intra-op threads changes float rounding, hence the weights' digest.
    "--threads",
    "1",
]


@pytest.mark.slow
def test_a_worker_killed_mid_epoch_on_files_resumes_to_the_weights_of_an_uninterrupted_run(tmp_path_factory):
    """Kill worker-1 mid-epoch under the local runner; after the restart the group skips to the checkpoint's
    step in the same per-epoch file order and shuffle, so the final weights equal an uninterrupted run's."""
    out = tmp_path_factory.mktemp("resume")
    files = write_records(out / "data", 6400, 8, 500, 2, seed=3)
    uninterrupted = run_group(2, [*RESUME_FLAGS, *files, "--model-dir", str(out / "uninterrupted")], timeout=400)
    expected = finished_digests(uninterrupted)

    scratch = out / "scratch"
    runner_args = ["--workers", "2", "--dataset", "tfrecord", "--skip-prepare", "--epochs", "2"]
    runner = start_runner(out / "job", scratch, runner_args, [*RESUME_FLAGS, *files])
    wait_for_step(job_model_dir(out / "job"), 50, runner)
    replica(runner, "worker-1").kill()
    output = finish(runner, scratch)
    metrics = json.loads((job_model_dir(out / "job") / layout.METRICS).read_text())
    assert metrics["restarts"] == 1 and 0 < metrics["resumed_from_step"] % 100  # resumed mid-epoch
    assert digests(output) == expected
