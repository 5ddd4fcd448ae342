"""A peer that stops answering (SIGSTOP: a frozen node): the survivor names it and says the group restarts."""

import os
import signal

import pytest
import tensorflow as tf

from multiworker import OutputFollower, start, tf_config, trainer_flags, wait_for_step, worker_cluster
from trainer.base.errors import ExitCode
from trainer.distribution.cluster import Cluster
from trainer.distribution.strategy import lost_group_message

# What worker-0 raised here (TF 2.21) when worker-1 was SIGSTOPped mid-step; its first line is "Graph execution error:".
STOPPED_PEER = """Graph execution error:

Detected at node while/adam/CollectiveReduceV2 defined at (most recent call last):
/job:worker/replica:0/task:1
The tasks have crashed. Check the task logs for an earlier error, or scheduler events (e.g. preemption, eviction) \
to debug further.
The error could be from a previous operation. Restart your program to reset.
\t [[{{function_node while_body_640}}{{node while/adam/CollectiveReduceV2}}]]"""


def test_the_lost_group_line_names_the_task_that_stopped_answering():
    survivor = Cluster(task_type="worker", task_index=0, members={"worker": ["a:1", "b:2"]})
    message = lost_group_message(tf.errors.UnavailableError(None, None, STOPPED_PEER), survivor)
    assert message.startswith("worker-0 lost contact with the training group: worker-1 stopped answering")
    assert "TensorFlow says: The tasks have crashed." in message and "Graph execution error" not in message
    assert f"The group will be restarted: every worker exits with retryable code {ExitCode.GROUP_FAILED}" in message


@pytest.mark.slow
def test_a_worker_that_stops_answering_is_named_by_the_survivor(tmp_path):
    cluster = worker_cluster(2)
    flags = trainer_flags(dataset="synthetic", train_examples=64000, test_examples=256, epochs=1, threads=1)
    flags += trainer_flags(per_worker_batch_size=32, log_every=4, steps_per_loop=4, model_dir=tmp_path / "model")
    workers = [start(flags, tf_config(cluster, "worker", i)) for i in range(2)]
    survivor = OutputFollower(workers[0])
    try:
        wait_for_step(tmp_path / "model", 8, workers[0], timeout=300)
        os.kill(workers[1].pid, signal.SIGSTOP)
        assert workers[0].wait(timeout=180) == ExitCode.GROUP_FAILED
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()  # SIGKILL ends a stopped process too
            worker.wait()
    errors = [line for line in survivor.output().splitlines() if line.startswith("error:")]
    assert len(errors) == 1, survivor.output()[-3000:]
    assert "worker-0 lost contact with the training group: worker-1 stopped answering" in errors[0]
    assert "The group will be restarted" in errors[0]
