"""Resuming on another number of workers: the global step goes on, the global batch stays, the change is said.

The rules in one process; then the real thing: a job of 2 workers under the local runner loses a worker mid-epoch and
is resubmitted with 3 on the same volume (docs/data.md, "Resuming on another number of workers").
"""

import json

import psutil
import pytest

from local_runner import job_model_dir, replica, start_runner
from multiworker import run_group, wait_for_step
from trainer.artifacts import checkpoint
from trainer.artifacts.layout import ModelDir
from trainer.base.errors import ConfigError

RECORDED = {"workers": 2, "global_batch_size": 96, "per_worker_batch_size": 48, "steps_per_epoch": 66}


@pytest.mark.parametrize(
    "recorded, per_worker, workers, expected",
    [
        (None, 48, 3, 48),  # nothing to resume: the flags decide
        (RECORDED, 48, 2, 48),  # the same workers
        (RECORDED, 48, 3, 32),  # 96 kept: 3 x 32
        (RECORDED, 48, 4, 24),
        (RECORDED, 48, 1, 96),
        (RECORDED, 16, 3, 16),  # the batch flag changed: the user asks for another global batch (then refused)
        ({"global_batch_size": 96}, 48, 3, 48),  # a record from before workers were recorded
    ],
)
def test_a_resumed_run_keeps_the_checkpoints_global_batch(recorded, per_worker, workers, expected):
    assert checkpoint.resumed_per_worker_batch(recorded, per_worker, workers) == expected


def test_a_worker_count_that_cannot_share_the_global_batch_is_refused_naming_the_choices():
    with pytest.raises(ConfigError) as refused:
        checkpoint.resumed_per_worker_batch(RECORDED, 48, 5)
    message = str(refused.value)
    assert "written by 2 workers with a global batch of 96" in message and "5 workers cannot share it" in message
    assert "(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)" in message and "CLEAN=1" in message


def test_the_resume_line_says_what_changed_and_what_it_means_for_the_epoch():
    setup = {**RECORDED, "workers": 3, "cache": "memory", "shuffle_buffer": 10_000}
    recorded = {**RECORDED, "cache": "memory", "shuffle_buffer": 10_000}
    note = checkpoint.resume_note(recorded, setup, 80)
    assert note.startswith("resuming at step 80 with workers 2 -> 3: the global step goes on")
    assert "global batch stays 96 (32 per worker)" in note and "epoch 2 goes on from its step 15 of 66" in note
    assert "up to 1344 of its examples may come twice" in note
    assert checkpoint.resume_note(recorded, {**setup, "workers": 2}, 80) is None  # exact: nothing to say


def test_a_checkpoint_of_other_training_files_is_refused(tmp_path):
    saver = checkpoint.Checkpointer(ModelDir(str(tmp_path)), True, "worker-0", 3)
    saver.record_run_setup({"train_data": "8 TFRecord files, names sha256 aaaa", "global_batch_size": 64})
    saver.save(5)
    with pytest.raises(checkpoint.ModelDirError, match="train_data: checkpoint has '8 TFRecord files"):
        saver.check_run_setup({"train_data": "9 TFRecord files, names sha256 bbbb", "global_batch_size": 64})


# 6400 examples: 2 workers x 48 or 3 x 32 = global batch 96, 66 steps per epoch, 2 epochs.
RUN = [
    *("--dataset", "synthetic", "--train-examples", "6400", "--test-examples", "1000", "--epochs", "2"),
    *("--per-worker-batch-size", "48", "--checkpoint-every", "20", "--log-every", "4", "--steps-per-loop", "4"),
    *("--threads", "1"),
]
TOTAL_STEPS = 132
TOLERANCE = 0.02  # the tests' accuracy tolerance between runs that see the same examples (test_multiworker)


def kill_job(runner):
    """The job torn down at once, as deleting a TFJob does: every replica and the runner, SIGKILL."""
    for process in psutil.Process(runner.pid).children(recursive=True):
        process.kill()
    runner.kill()
    runner.communicate(timeout=60)


@pytest.mark.slow
def test_a_job_of_two_workers_killed_mid_epoch_resumes_on_three(tmp_path):
    uninterrupted = run_group(2, [*RUN, "--model-dir", str(tmp_path / "uninterrupted")], timeout=600)
    for result in uninterrupted.values():
        assert result.returncode == 0, result.output[-3000:]
    expected = json.loads(open(ModelDir(str(tmp_path / "uninterrupted")).metrics).read())

    job, model_dir = tmp_path / "job", job_model_dir(tmp_path / "job")
    runner_args = ["--dataset", "synthetic", "--epochs", "2"]
    first = start_runner(job, tmp_path / "scratch2", ["--workers", "2", *runner_args], RUN)
    wait_for_step(model_dir, 50, first, timeout=400)
    replica(first, "worker-1").kill()
    kill_job(first)
    killed_at = json.loads(open(ModelDir(str(model_dir)).status).read())["global_step"]

    second = start_runner(job, tmp_path / "scratch3", ["--workers", "3", *runner_args], RUN)
    output, _ = second.communicate(timeout=600)
    assert second.returncode == 0 and "Succeeded" in output, output[-4000:]
    metrics = json.loads(open(ModelDir(str(model_dir)).metrics).read())
    assert (metrics["steps"], metrics["workers"], metrics["global_batch_size"]) == (TOTAL_STEPS, 3, 96)
    assert 0 < metrics["resumed_from_step"] <= killed_at and metrics["resumed_from_step"] % 66  # mid-epoch
    lines = [line for line in output.splitlines() if "resuming at step" in line and "workers 2 -> 3" in line]
    assert len(lines) == 1, output[-4000:]
    assert abs(metrics["test_accuracy"] - expected["test_accuracy"]) <= TOLERANCE, (metrics, expected)
    recorded = json.loads(open(ModelDir(str(model_dir)).run_setup).read())
    assert (recorded["workers"], recorded["per_worker_batch_size"]) == (3, 48)  # the flag as given, for later restarts
    logged = lines[0][lines[0].index("resuming at step") :]
    print(
        f"resize figures: uninterrupted 2 workers {expected['steps']} steps, test accuracy "
        f"{expected['test_accuracy']:.4f}; resized {metrics['steps']} steps (resumed from "
        f"{metrics['resumed_from_step']} on 3 workers), test accuracy {metrics['test_accuracy']:.4f}; logged: {logged}"
    )
