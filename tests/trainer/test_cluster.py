"""TF_CONFIG in every shape the Kubeflow operator writes, and every bad one a person writes."""

import dataclasses
import json

import pytest

from multiworker import run_python
from scripts.common.tfconfig import operator_address
from scripts.common.tfconfig import tf_config as operator_tf_config
from trainer.base.errors import ClusterConfigError
from trainer.distribution.cluster import SINGLE_PROCESS, parse_tf_config


def tf_config(cluster, task_type, index, **extra):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}, **extra})


WORKERS = {"worker": ["job-worker-0.default.svc:2222", "job-worker-1.default.svc:2222"]}
CHIEF_AND_WORKERS = {
    "chief": ["job-chief-0.default.svc:2222"],
    "worker": ["job-worker-0.default.svc:2222", "job-worker-1.default.svc:2222"],
}


@pytest.mark.parametrize(
    "text", [None, "", "   ", "{}", '{"cluster": {}}', tf_config({"worker": ["localhost:2222"]}, "worker", 0)]
)
def test_no_or_single_task_config_means_one_process(text):
    cluster = parse_tf_config(text)
    assert cluster == SINGLE_PROCESS
    assert (cluster.num_workers, cluster.rank, cluster.is_chief, cluster.is_distributed) == (1, 0, True, False)


def test_operator_worker_only_shape():
    second = parse_tf_config(tf_config(WORKERS, "worker", 1, environment="cloud"))
    first = parse_tf_config(tf_config(WORKERS, "worker", 0, environment="cloud"))
    assert (first.rank, first.is_chief, second.rank, second.is_chief) == (0, True, 1, False)
    assert first.num_workers == 2 and first.is_distributed
    assert first.chief_address == "job-worker-0.default.svc:2222"


def test_operator_chief_and_workers_shape_ranks_chief_first():
    chief = parse_tf_config(tf_config(CHIEF_AND_WORKERS, "chief", 0, environment="cloud"))
    worker0 = parse_tf_config(tf_config(CHIEF_AND_WORKERS, "worker", 0, environment="cloud"))
    worker1 = parse_tf_config(tf_config(CHIEF_AND_WORKERS, "worker", 1, environment="cloud"))
    assert [c.rank for c in (chief, worker0, worker1)] == [0, 1, 2]
    assert [c.is_chief for c in (chief, worker0, worker1)] == [True, False, False]
    assert chief.num_workers == 3
    assert worker1.chief_address == "job-chief-0.default.svc:2222"


def test_evaluator_entry_is_accepted_but_not_counted_as_a_trainer():
    cluster = {**CHIEF_AND_WORKERS, "evaluator": ["job-evaluator-0.default.svc:2222"]}
    worker = parse_tf_config(tf_config(cluster, "worker", 1, environment="cloud"))
    evaluator = parse_tf_config(tf_config(cluster, "evaluator", 0, environment="cloud"))
    assert worker.num_workers == 3 and worker.rank == 2 and worker.role == "trainer"
    assert evaluator.is_evaluator and not evaluator.is_chief and evaluator.role == "evaluator"
    assert not evaluator.is_async


ASYNC_REPLICAS = {"Chief": 1, "PS": 1, "Worker": 2, "Evaluator": 1}


@pytest.mark.parametrize("strategy", ["auto", "async"])
def test_operator_chief_ps_worker_evaluator_shape_is_async_with_a_role_per_task(strategy):
    address = operator_address("mnist", "default", 2222)
    roles = {}
    for rtype, count in ASYNC_REPLICAS.items():
        for index in range(count):
            cluster = parse_tf_config(operator_tf_config(ASYNC_REPLICAS, rtype, index, address), strategy)
            assert cluster.is_async and cluster.num_workers == 2 and cluster.num_ps == 1
            roles[cluster.name] = cluster.role
    assert roles == {
        "chief-0": "coordinator",
        "ps-0": "server",
        "worker-0": "server",
        "worker-1": "server",
        "evaluator-0": "evaluator",
    }
    chief = parse_tf_config(operator_tf_config(ASYNC_REPLICAS, "Chief", 0, address))
    assert chief.is_chief and chief.chief_address == "mnist-chief-0.default.svc:2222"
    worker = parse_tf_config(operator_tf_config(ASYNC_REPLICAS, "Worker", 0, address))
    assert not worker.is_chief and worker.chief_address == "mnist-chief-0.default.svc:2222"


def test_two_ps_tasks_are_counted():
    cluster = {"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1", "p:2"]}
    assert parse_tf_config(tf_config(cluster, "ps", 1)).num_ps == 2


def test_chief_and_workers_without_ps_stay_sync_unless_async_is_asked():
    chief = parse_tf_config(tf_config(CHIEF_AND_WORKERS, "chief", 0), "auto")
    assert not chief.is_async and chief.role == "trainer" and chief.num_workers == 3
    assert parse_tf_config(tf_config(CHIEF_AND_WORKERS, "chief", 0), "sync") == chief


@pytest.mark.parametrize(
    "cluster, task, strategy, field, fix",
    [
        ({"worker": ["a:1", "b:1"], "ps": ["p:1"]}, "worker", "auto", "cluster.chief", "Chief"),
        ({"chief": ["c:1"], "ps": ["p:1"]}, "chief", "auto", "cluster.worker", "Worker"),
        ({"chief": ["c:1"], "ps": ["p:1"]}, "ps", "async", "cluster.worker", "Worker"),
        (CHIEF_AND_WORKERS, "chief", "async", "cluster.ps", "--strategy sync"),
        ({"chief": ["c:1"], "worker": ["w:1"], "ps": ["p:1"]}, "chief", "sync", "cluster.ps", "--strategy async"),
        ({"worker": ["a:1"], "ps": ["p:1"]}, "ps", "auto", "cluster.chief", "Chief"),
    ],
)
def test_bad_async_shapes_name_the_fix(cluster, task, strategy, field, fix):
    with pytest.raises(ClusterConfigError) as error:
        parse_tf_config(tf_config(cluster, task, 0), strategy)
    message = str(error.value)
    assert f"TF_CONFIG {field}:" in message and "Fix:" in message and fix in message


def test_async_without_tf_config_is_refused():
    with pytest.raises(ClusterConfigError, match="cluster.ps: missing"):
        parse_tf_config(None, "async")


def test_value_is_immutable():
    cluster = parse_tf_config(tf_config(WORKERS, "worker", 0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cluster.task_index = 1


@pytest.mark.parametrize(
    "text, field, fix",
    [
        ("{not json", "(whole value)", "JSON"),
        ("[1, 2]", "(whole value)", "object"),
        (json.dumps({"cluster": WORKERS}), "task", '"task"'),
        (tf_config(WORKERS, "chief", 0), "task.type", 'add "chief"'),
        (tf_config(WORKERS, "worker", 2), "task.index", "0..1"),
        (tf_config(WORKERS, "worker", -1), "task.index", "0..1"),
        (tf_config(WORKERS, "worker", "0"), "task.index", "integer"),
        (tf_config({"master": ["m:2222"], "worker": ["w:2222"]}, "worker", 0), "cluster.master", "chief"),
        (tf_config({"worker": ["a:1", "b:2"]}, "master", 0), "task.type", "chief"),
        (tf_config({"worker": "a:1"}, "worker", 0), "cluster.worker", "list"),
        (tf_config({"chief": ["a:1", "b:1"]}, "chief", 0), "cluster.chief", "one chief"),
        (tf_config({"trainer": ["a:1"]}, "trainer", 0), "cluster.trainer", "unknown"),
    ],
)
def test_bad_tf_config_names_field_and_fix(text, field, fix):
    with pytest.raises(ClusterConfigError) as error:
        parse_tf_config(text)
    message = str(error.value)
    assert f"TF_CONFIG {field}:" in message and "Fix:" in message and fix in message


def test_bad_tf_config_exits_2_before_tensorflow_is_imported():
    probe = (
        "import sys; from trainer.__main__ import main; code = main(['--dataset', 'synthetic']); "
        "print('tensorflow imported:', 'tensorflow' in sys.modules); sys.exit(code)"
    )
    bad = tf_config({"worker": ["a:1", "b:1"]}, "master", 0)
    result = run_python(probe, {"TF_CONFIG": bad, "PATH": "/usr/bin"})
    assert result.returncode == 2
    assert "tensorflow imported: False" in result.stdout
    assert "TF_CONFIG task.type" in result.stderr and "chief" in result.stderr


def test_async_without_ps_exits_2_before_tensorflow_is_imported():
    probe = (
        "import sys; from trainer.__main__ import main; code = main(['--strategy', 'async']); "
        "print('tensorflow imported:', 'tensorflow' in sys.modules); sys.exit(code)"
    )
    text = tf_config(CHIEF_AND_WORKERS, "chief", 0)
    result = run_python(probe, {"TF_CONFIG": text, "PATH": "/usr/bin"})
    assert result.returncode == 2
    assert "tensorflow imported: False" in result.stdout
    assert "TF_CONFIG cluster.ps: missing" in result.stderr and "--strategy sync" in result.stderr


def test_tasks_on_this_host_count_the_processes_that_share_its_cores():
    local = {"cluster": {"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}, "task": {"type": "worker", "index": 1}}
    assert parse_tf_config(json.dumps(local)).tasks_on_this_host == 2
    pods = operator_tf_config({"Worker": 2}, "Worker", 0, operator_address("job", "default", 2222))
    assert parse_tf_config(pods).tasks_on_this_host == 1  # each pod has its own host name and cores
    async_cluster = {
        "chief": ["localhost:1"],
        "ps": ["localhost:2"],
        "worker": ["localhost:3", "other:4"],
        "evaluator": ["localhost:5"],
    }
    on_localhost = {"cluster": async_cluster, "task": {"type": "ps", "index": 0}}
    assert parse_tf_config(json.dumps(on_localhost)).tasks_on_this_host == 4
    assert SINGLE_PROCESS.tasks_on_this_host == 1


# A range: how an engine's pod template writes N addresses with Kubernetes' $(VAR) references (k8s/engines/jobset/).
def test_a_range_is_the_same_list_written_out():
    ranged = {"worker": {"count": 3, "address": "mw-worker-0-{index}.mw:2222"}}
    listed = {"worker": [f"mw-worker-0-{i}.mw:2222" for i in range(3)]}
    assert parse_tf_config(tf_config(ranged, "worker", 2)) == parse_tf_config(tf_config(listed, "worker", 2))


def test_ranges_and_lists_mix_across_task_types():
    cluster = {"chief": ["mw-chief-0-0.mw:2222"], "ps": ["mw-ps-0-0.mw:2222"]}
    cluster["worker"] = {"count": 2, "address": "mw-node-0-{index}.mw:2222"}
    coordinator = parse_tf_config(tf_config(cluster, "chief", 0))
    assert coordinator.role == "coordinator" and coordinator.members["worker"] == (
        "mw-node-0-0.mw:2222",
        "mw-node-0-1.mw:2222",
    )


@pytest.mark.parametrize(
    "listed, says",
    [
        ({"count": 2}, "cluster.worker: a range has exactly count and address"),
        ({"count": 2, "address": "a-{index}:1", "step": 1}, "a range has exactly count and address"),
        ({"count": 0, "address": "a-{index}:1"}, "cluster.worker.count: must be a whole number of tasks, 1 or more"),
        ({"count": "2", "address": "a-{index}:1"}, "cluster.worker.count: must be a whole number"),
        ({"count": 2, "address": "a-0:1"}, "cluster.worker.address: must hold {index} once"),
        ({"count": 2, "address": "a-{index}-{i}:1"}, "must hold {index} once and no other braces"),
    ],
)
def test_a_bad_range_names_its_field_and_the_fix(listed, says):
    with pytest.raises(ClusterConfigError) as error:
        parse_tf_config(tf_config({"worker": listed}, "worker", 0))
    assert says in str(error.value) and "Fix: use" in str(error.value)


def test_a_reference_the_pod_could_not_expand_names_the_variable_and_exits_2_before_tensorflow():
    # As a pod whose template writes "count": $(WORKERS) with no WORKERS: Kubernetes leaves the reference as written.
    text = '{"cluster": {"worker": {"count": $(WORKERS), "address": "a-{index}:1"}}, "task": {"type": "worker"}}'
    probe = (
        "import sys; from trainer.__main__ import main; code = main(['--dataset', 'synthetic']); "
        "print('tensorflow imported:', 'tensorflow' in sys.modules); sys.exit(code)"
    )
    result = run_python(probe, {"PATH": "/usr/bin:/bin", "TF_CONFIG": text}, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "tensorflow imported: False" in result.stdout
    assert "$(WORKERS) was not expanded: the container has no variable WORKERS defined before TF_CONFIG" in (
        result.stderr
    )


def test_a_pod_template_from_before_tf_config_was_written_exits_2_instead_of_training_alone():
    # An overlay copied before the JobSet's pod template wrote TF_CONFIG sets JOBSET_TASKS and no TF_CONFIG: each pod
    # would have trained as a group of one, into the same model dir.
    probe = "import sys; from trainer.__main__ import main; sys.exit(main(['--dataset', 'synthetic']))"
    env = {"PATH": "/usr/bin:/bin", "JOBSET_NAME": "mw", "JOBSET_TASKS": "worker=2", "JOB_COMPLETION_INDEX": "0"}
    result = run_python(probe, env, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "JOBSET_TASKS is set but TF_CONFIG is not" in result.stderr and "k8s/engines/jobset/sync/jobset.yaml" in (
        result.stderr
    )
