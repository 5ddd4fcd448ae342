"""Asynchronous training with parameter servers, as real processes on 127.0.0.1: a chief coordinating, ps tasks
holding the variables, workers running the scheduled steps."""

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import time

import pytest

from multiworker import (
    OutputFollower,
    async_cluster,
    free_ports,
    start,
    start_servers,
    stop_servers,
    tf_config,
    trainer_flags,
    wait_all,
    wait_for_step,
)
from trainer.artifacts import layout
from trainer.base.errors import ExitCode
from trainer.data import synthetic
from trainer.reporting import status

# 4096 examples / batch 32 = 128 steps per epoch, 2 epochs.
RUN = [
    *trainer_flags(dataset="synthetic", train_examples=4096, test_examples=1024, seed=7, epochs=2, threads=1),
    *trainer_flags(log_every=16, per_worker_batch_size=32),
]
# The synthetic task's best test accuracy is 0.9 (10% label noise); the sync tests allow 0.02 around it. Async
# updates computed on stale weights cost a little more on a run this short.
ACCURACY_FLOOR = synthetic.BEST_ACCURACY - 0.03


def run_async(model_dir, args=RUN, workers=2, ps=1, env=None, timeout=300, evaluator=False):
    """Runs the chief (and an evaluator) to the end while the servers serve; returns the cluster, the chief's
    and evaluator's results and the servers' output."""
    cluster = async_cluster(workers, ps)
    if evaluator:
        cluster["evaluator"] = [f"127.0.0.1:{free_ports(1)[0]}"]  # in TF_CONFIG as the operator writes it
    args = [*args, "--model-dir", str(model_dir)]
    servers = start_servers(cluster, args, env)
    try:
        tasks = {"chief": start(args, tf_config(cluster, "chief", 0), env)}
        if evaluator:
            tasks["evaluator"] = start(args, tf_config(cluster, "evaluator", 0), env)
        results = wait_all(tasks, timeout)
    finally:
        outputs = stop_servers(servers)
    return cluster, results, outputs


@pytest.fixture(scope="module")
def one_ps(tmp_path_factory):
    root = tmp_path_factory.mktemp("async")
    scratch = root / "scratch"
    scratch.mkdir()
    cluster, results, servers = run_async(
        root / "model", [*RUN, "--no-eval-in-loop"], env={"TMPDIR": str(scratch)}, evaluator=True
    )
    return root, cluster, results["chief"], servers, results["evaluator"]


@pytest.mark.slow  # several processes for long: make test-slow
def test_chief_one_ps_two_workers_train_to_the_task_accuracy(one_ps):
    root, _, chief, _, _ = one_ps
    assert chief.returncode == 0, chief.output[-4000:]
    metrics = json.loads((root / "model" / layout.METRICS).read_text())
    assert metrics["strategy"] == "async" and metrics["workers"] == 2 and metrics["ps_tasks"] == 1
    assert metrics["steps"] == 2 * 4096 // 32
    assert metrics["test_accuracy"] >= ACCURACY_FLOOR


@pytest.mark.slow  # several processes for long: make test-slow
def test_only_the_chief_writes_and_leaves_every_artifact(one_ps):
    root, _, _, _, _ = one_ps
    assert sorted(os.listdir(root / "model")) == sorted([*layout.ARTIFACTS, layout.STATUS, layout.EVALUATIONS])
    assert not [name for name in os.listdir(root / "scratch") if name.startswith("trainer-")]  # no scratch copies
    model_dir = layout.ModelDir(str(root / "model"))
    assert sorted(os.listdir(model_dir.logs(""))) == ["eval", "test", "train"]
    assert status.read_status(str(root / "model"))["state"] == "succeeded"


@pytest.mark.slow  # several processes for long: make test-slow
def test_each_role_says_what_it_is_and_where_its_coordinator_is(one_ps):
    _, cluster, chief, servers, _ = one_ps
    coordinator = cluster["chief"][0]
    assert "async coordinator of 2 worker(s) and 1 ps task(s)" in chief.output
    for name, output in servers.items():
        kind, index = name.split("-")
        assert f"async {kind} serving at {cluster[kind][int(index)]}; the coordinator is {coordinator}" in output


@pytest.mark.slow  # several processes for long: make test-slow
def test_the_evaluator_follows_the_async_chief_and_the_chief_skips_its_epoch_test_pass(one_ps):
    root, _, chief, _, evaluator = one_ps
    assert evaluator.returncode == 0, evaluator.output[-3000:]
    evaluations = json.loads((root / "model" / layout.EVALUATIONS).read_text())["evaluations"]
    assert evaluations[-1]["global_step"] == 2 * 4096 // 32
    assert "evaluated the final checkpoint (step 256)" in evaluator.output
    assert "epoch 1/2 done: train loss" in chief.output and "(test pass left to the evaluator)" in chief.output


@pytest.mark.slow  # several processes for long: make test-slow
def test_two_ps_tasks_each_hold_part_of_the_variables_and_the_loop_is_the_sync_modes(tmp_path):
    flags = [*RUN, "--epochs", "1", "--train-examples", "1024", "--scale-learning-rate"]
    flags += ["--warmup-steps", "8", "--learning-rate-schedule", "cosine", "--clip-norm", "1"]
    _, results, _ = run_async(tmp_path / "model", flags, ps=2)
    chief = results["chief"]
    assert chief.returncode == 0, chief.output[-4000:]
    assert "learning rate 0.002 (warmup 8 steps, cosine decay)" in chief.output
    placement = next(line for line in chief.output.splitlines() if "variables on the ps tasks:" in line)
    assert "ps-0 " in placement and "ps-1 " in placement, placement
    # The drift one loop skeleton ends: the async loop ignored --scale-learning-rate and counted no test examples;
    # the schedule and the clip are the core's, in both modes.
    metrics = json.loads((tmp_path / "model" / layout.METRICS).read_text())
    assert metrics["learning_rate"] == pytest.approx(2 * 1e-3)
    assert metrics["test_examples_evaluated"] == metrics["test_examples"] == 1024


LONG_RUN = [*RUN, "--epochs", "2", "--train-examples", "8192", "--checkpoint-every", "64", "--steps-per-loop", "4"]
LONG_TOTAL = 2 * 8192 // 32
# Long enough for two kills and two restarts before the last step (both take CPU, so the share they take is about the
# same on any machine); the test checks that steps are left after the second kill.
FAULT_RUN = [*LONG_RUN, "--epochs", "6"]
FAULT_TOTAL = 6 * 8192 // 32
# Under restartPolicy ExitCode the operator recreates a chief after every retryable exit, without counting it
# against backoffLimit; the test stops after this many so that a chief failing for good still fails the test.
CHIEF_RECREATIONS = 3


def kill(process):
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@dataclasses.dataclass
class LongRun:
    cluster: dict[str, list[str]]
    args: list[str]
    servers: dict[str, subprocess.Popen]
    chief: subprocess.Popen

    def start(self, kind, index):
        """Starts (or restarts) one task of the run, as the operator would."""
        return start(self.args, tf_config(self.cluster, kind, index))


@contextlib.contextmanager
def long_run_past_step_100(model_dir):
    """A LONG_RUN cluster (2 workers, 1 ps) whose chief has passed step 100; its servers are stopped at the end."""
    cluster = async_cluster(2, 1)
    args = [*LONG_RUN, "--model-dir", str(model_dir)]
    servers = start_servers(cluster, args)
    try:
        chief = start(args, tf_config(cluster, "chief", 0))
        wait_for_step(model_dir, 100, chief, timeout=240)
        yield LongRun(cluster, args, servers, chief)
    finally:
        stop_servers(servers)


def progress_or_retryable_exit(model_dir, at_least, chief, timeout=240):
    """Waits until the run shows `at_least` steps; returns None then, or the chief's output if it exited 144."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if chief.poll() is not None:
            output = chief.communicate()[0]
            assert chief.returncode == ExitCode.GROUP_FAILED, output[-4000:]
            return output
        if (status.read_status(str(model_dir)).get("global_step") or 0) >= at_least:
            return None
        time.sleep(0.05)
    raise AssertionError(f"step {at_least} not reached in {timeout} s")


@pytest.mark.slow  # three processes for 15 s: make test-slow, as the other fault tests
def test_a_worker_lost_before_its_calls_output_reached_the_chief_has_the_call_run_again():
    """The coordinator marks a call's output ready before its own thread has copied it to the chief, so the chief's
    fetch may copy it first, from a worker that has just died. The fetch must wait for the call's second run (on
    the restarted worker), not fail the run."""
    cluster = async_cluster(1, 1)
    servers = start_servers(cluster, RUN)
    chief = None
    try:
        command = [str(servers["worker-0"].pid)]
        chief = OutputFollower(start(command, tf_config(cluster, "chief", 0), module="worker_lost_in_copy"))
        chief.wait_for("worker killed")
        servers["worker-0"].wait()
        servers["worker-0"] = start(RUN, tf_config(cluster, "worker", 0))
        chief.process.wait(timeout=180)
    finally:
        if chief is not None and chief.process.poll() is None:
            kill(chief.process)
        stop_servers(servers)
    output = chief.output()
    assert chief.process.returncode == 0, output[-3000:]
    assert "fetched [2.0, 4.0, 6.0]" in output, output[-3000:]
    assert "waiting for the coordinator to run the call again" in output  # the fetch did copy from the dead worker


@pytest.mark.slow
def test_a_killed_worker_is_worked_around_and_gets_work_again_after_its_restart(tmp_path):
    """The first kill must be worked around (the chief's fetch waits for a call whose output was lost with the
    worker to run again). After the second, when the coordinator reconnects to the restarted worker, the chief may
    still exit 144 (retryable); recreated as the operator would, it resumes from its checkpoint. Either way the run
    must finish every step."""
    model_dir = tmp_path / "model"
    cluster = async_cluster(2, 1)
    args = [*FAULT_RUN, "--model-dir", str(model_dir)]
    servers = start_servers(cluster, args)
    chief = start(args, tf_config(cluster, "chief", 0))
    restarted = {}
    retried = None
    try:
        wait_for_step(model_dir, 100, chief, timeout=240)
        kill(servers.pop("worker-1"))
        step = wait_for_step(model_dir, 164, chief, timeout=240)  # the coordinator goes on with worker-0 alone
        restarted["worker-1"] = OutputFollower(start(args, tf_config(cluster, "worker", 1)))
        restarted["worker-1"].wait_for("input pipeline built on this worker")
        # Only the restarted worker-1 is left to run steps: progress now proves it receives work again, if the run
        # has steps left to make.
        before_second_kill = status.read_status(str(model_dir))["global_step"]
        assert before_second_kill + 64 < FAULT_TOTAL, (before_second_kill, "too few steps left after the second kill")
        kill(servers.pop("worker-0"))
        retried = progress_or_retryable_exit(model_dir, step + 64, chief)
        restarted["worker-0"] = OutputFollower(start(args, tf_config(cluster, "worker", 0)))
        restarts = 0 if retried is None else 1
        if retried is not None:
            chief = start(args, tf_config(cluster, "chief", 0))
        output, _ = chief.communicate(timeout=400)
        while chief.returncode == ExitCode.GROUP_FAILED and restarts < CHIEF_RECREATIONS:
            restarts += 1
            chief = start(args, tf_config(cluster, "chief", 0))
            output, _ = chief.communicate(timeout=400)
    finally:
        if chief.poll() is None:
            kill(chief)
        stop_servers(servers)
        stop_servers({name: follower.process for name, follower in restarted.items()}, read=False)
    assert chief.returncode == 0, output[-4000:]
    metrics = json.loads((model_dir / layout.METRICS).read_text())
    assert metrics["steps"] == FAULT_TOTAL
    # A retried chief resumes from a checkpoint (every 64 steps) written at or after the one before the second kill.
    assert metrics["resumed_from_step"] == 0 if restarts == 0 else metrics["resumed_from_step"] >= step // 64 * 64


@pytest.mark.slow
def test_sigterm_to_the_chief_checkpoints_exits_143_and_a_new_chief_resumes_there(tmp_path):
    model_dir = tmp_path / "model"
    with long_run_past_step_100(model_dir) as run:
        os.killpg(run.chief.pid, signal.SIGTERM)
        stopped = wait_all({"chief": run.chief}, 120)["chief"]
        assert stopped.returncode == 143, stopped.output[-3000:]
        stopped_at = status.read_status(str(model_dir))["global_step"]
        assert status.read_status(str(model_dir))["state"] == "preempted"
        resumed = wait_all({"chief": run.start("chief", 0)}, 300)["chief"]
    assert resumed.returncode == 0, resumed.output[-3000:]
    assert f"resuming at step {stopped_at}" in resumed.output
    metrics = json.loads((model_dir / layout.METRICS).read_text())
    assert metrics["steps"] == LONG_TOTAL and metrics["resumed_from_step"] == stopped_at


@pytest.mark.slow
def test_a_lost_ps_makes_the_chief_exit_retryably_and_the_restarted_tasks_resume_from_the_last_checkpoint(tmp_path):
    model_dir = tmp_path / "model"
    with long_run_past_step_100(model_dir) as run:
        kill(run.servers.pop("ps-0"))
        lost = wait_all({"chief": run.chief}, 180)["chief"]
        # Under restartPolicy ExitCode the operator recreates both: the ps (killed, 137) and the chief (144).
        assert lost.returncode == 144, lost.output[-3000:]
        run.servers["ps-0"] = run.start("ps", 0)
        resumed = wait_all({"chief": run.start("chief", 0)}, 300)["chief"]
    assert resumed.returncode == 0, resumed.output[-3000:]
    metrics = json.loads((model_dir / layout.METRICS).read_text())
    assert metrics["steps"] == LONG_TOTAL and metrics["resumed_from_step"] >= 64
