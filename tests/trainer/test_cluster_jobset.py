"""The trainer's second cluster source: what a JobSet (or Kubeflow Trainer v2's JobSet) gives a pod, read before
TensorFlow starts, in every shape the overlays ship and every wrong shape (exit 2, the fix named)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from trainer.base.errors import ClusterConfigError
from trainer.distribution.cluster import from_environment, from_jobset, parse_tf_config


def pod(replicated_job: str, index: int, tasks: str, job_index: int = 0, **extra: str) -> dict[str, str]:
    """A JobSet pod's variables as k8s/engines/jobset/* set them (labels through the downward API)."""
    return {
        "JOBSET_NAME": "mw",
        "JOBSET_REPLICATED_JOB": replicated_job,
        "JOBSET_JOB_INDEX": str(job_index),
        "JOB_COMPLETION_INDEX": str(index),
        "JOBSET_TASKS": tasks,
        **extra,
    }


def test_sync_workers_get_the_pods_dns_names_in_index_order():
    cluster = from_environment(pod("worker", 1, "worker=3", JOBSET_PORT="2222"))
    assert cluster.members == {"worker": tuple(f"mw-worker-0-{i}.mw:2222" for i in range(3))}
    assert (cluster.task_type, cluster.task_index, cluster.strategy, cluster.rank) == ("worker", 1, "sync", 1)
    assert not cluster.is_chief


def test_it_is_the_tf_config_the_operator_would_write_for_the_same_names():
    from_pods = from_environment(pod("worker", 0, "worker=2", JOBSET_PORT="2222"))
    tf_config = {"cluster": {"worker": ["mw-worker-0-0.mw:2222", "mw-worker-0-1.mw:2222"]}, "task": {"type": "worker"}}
    assert from_pods == parse_tf_config(json.dumps(tf_config))


def test_trainer_v2_node_job_holds_the_workers_and_the_port_defaults_to_2222():
    cluster = from_environment(pod("node", 0, "node=2"))
    assert cluster.members == {"worker": ("mw-node-0-0.mw:2222", "mw-node-0-1.mw:2222")}
    assert cluster.is_chief


def test_async_shape_gives_every_replicated_job_its_role():
    tasks = "chief=1,ps=1,worker=2,evaluator=1"
    roles = {
        (job, i): from_environment(pod(job, i, tasks)).role
        for job, n in (("chief", 1), ("ps", 1), ("worker", 2), ("evaluator", 1))
        for i in range(n)
    }
    assert roles == {
        ("chief", 0): "coordinator",
        ("ps", 0): "server",
        ("worker", 0): "server",
        ("worker", 1): "server",
        ("evaluator", 0): "evaluator",
    }
    chief = from_environment(pod("chief", 0, tasks))
    assert chief.strategy == "async" and chief.num_ps == 1 and chief.num_workers == 2
    assert chief.chief_address == "mw-chief-0-0.mw:2222"


def test_several_jobs_of_a_replicated_job_number_their_pods_job_by_job():
    cluster = from_environment(pod("worker", 1, "worker=2x2", job_index=1))
    assert cluster.task_index == 3
    assert cluster.members["worker"] == (
        "mw-worker-0-0.mw:2222",
        "mw-worker-0-1.mw:2222",
        "mw-worker-1-0.mw:2222",
        "mw-worker-1-1.mw:2222",
    )


def test_subdomain_and_local_addresses():
    names = {f"mw-worker-0-{i}.train:2222": f"127.0.0.1:{4000 + i}" for i in range(2)}
    cluster = from_environment(
        pod("worker", 1, "worker=2", JOBSET_SUBDOMAIN="train", JOBSET_LOCAL_ADDRESSES=json.dumps(names))
    )
    assert cluster.members == {"worker": ("127.0.0.1:4000", "127.0.0.1:4001")}
    assert cluster.tasks_on_this_host == 2


def test_tf_config_wins_and_no_variable_means_one_process():
    tf_config = {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}}
    assert from_environment({**pod("worker", 0, "worker=2"), "TF_CONFIG": json.dumps(tf_config)}).members == {
        "worker": ("a:1", "b:1")
    }
    assert not from_environment({}).is_distributed


@pytest.mark.parametrize(
    "env, says",
    [
        (pod("worker", 0, ""), "JobSet pod, JOBSET_TASKS: missing"),
        (pod("worker", 0, "worker"), "'worker' is not <replicatedJob>=<pods per Job>[x<Jobs>]"),
        (pod("worker", 0, "worker=two"), "is not <replicatedJob>=<pods per Job>"),
        (pod("worker", 0, "worker=0"), "has no pod"),
        (pod("trainers", 0, "trainers=2"), "replicated job 'trainers' is not named after a task type"),
        (pod("worker", 0, "worker=1,worker=1"), "lists 'worker' twice"),
        (pod("worker", 0, "worker=1,node=1"), "'worker' and 'node' both hold worker tasks"),
        (pod("", 0, "worker=2"), "JOBSET_REPLICATED_JOB: missing. Fix: set it from the pod's label"),
        (pod("ps", 0, "worker=2"), "'ps' is not in JOBSET_TASKS (worker=2). Fix: add ps=<pods>"),
        (pod("worker", 2, "worker=2"), "JOB_COMPLETION_INDEX: 2 is out of range (0..1 by JOBSET_TASKS)"),
        ({**pod("worker", 0, "worker=2"), "JOB_COMPLETION_INDEX": ""}, "JOB_COMPLETION_INDEX: missing. Fix: run"),
        (pod("worker", 0, "worker=2", job_index=1), "JOBSET_JOB_INDEX: 1 is out of range"),
        (pod("worker", 0, "worker=2", JOBSET_PORT="http"), "JOBSET_PORT: 'http' is not a port"),
        (pod("worker", 0, "worker=2", JOBSET_LOCAL_ADDRESSES="{"), "JOBSET_LOCAL_ADDRESSES: not valid JSON"),
        (pod("worker", 0, "worker=2", JOBSET_LOCAL_ADDRESSES="{}"), "has no address for mw-worker-0-0.mw:2222"),
        # Shapes the strategies cannot run: named in JobSet's terms, with TF_CONFIG's check behind.
        (pod("chief", 0, "chief=1,ps=1,evaluator=1"), "cluster.worker: missing: in async mode"),
        (pod("worker", 0, "ps=1,worker=2"), "cluster.chief: missing: in async mode the chief is the coordinator"),
        (pod("chief", 0, "chief=2,worker=1"), "cluster.chief: has 2 entries"),
    ],
)
def test_bad_shapes_name_the_variable_and_the_fix(env, says):
    with pytest.raises(ClusterConfigError) as error:
        from_jobset(env)
    assert says in str(error.value)
    assert "Fix:" in str(error.value)


def test_sync_requested_on_a_ps_shape_is_refused():
    with pytest.raises(ClusterConfigError, match="--strategy sync"):
        from_environment(pod("chief", 0, "chief=1,ps=1,worker=1"), strategy="sync")


def test_a_wrong_jobset_shape_exits_2_before_tensorflow_is_imported():
    probe = (
        "import sys; from trainer.__main__ import main; code = main(['--dataset', 'synthetic']); "
        "print('tensorflow imported:', 'tensorflow' in sys.modules); sys.exit(code)"
    )
    env = {"PATH": "/usr/bin:/bin", **pod("ps", 0, "worker=2")}
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "tensorflow imported: False" in result.stdout
    assert "JOBSET_REPLICATED_JOB: 'ps' is not in JOBSET_TASKS" in result.stderr
