"""TF_CONFIG in every shape the Kubeflow operator writes, and every bad one a person writes."""

import dataclasses
import json
import subprocess
import sys

import pytest

from multiworker import ROOT
from trainer.cluster import SINGLE_PROCESS, parse_tf_config
from trainer.errors import ClusterConfigError


def tf_config(cluster, task_type, index, **extra):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}, **extra})


WORKERS = {"worker": ["job-worker-0.default.svc:2222", "job-worker-1.default.svc:2222"]}
CHIEF_AND_WORKERS = {"chief": ["job-chief-0.default.svc:2222"],
                     "worker": ["job-worker-0.default.svc:2222", "job-worker-1.default.svc:2222"]}


@pytest.mark.parametrize("text", [None, "", "   ", "{}", '{"cluster": {}}',
                                  tf_config({"worker": ["localhost:2222"]}, "worker", 0)])
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


def test_ps_and_evaluator_entries_are_accepted_but_not_counted_as_trainers():
    cluster = {**CHIEF_AND_WORKERS, "ps": ["job-ps-0.default.svc:2222"],
               "evaluator": ["job-evaluator-0.default.svc:2222"]}
    worker = parse_tf_config(tf_config(cluster, "worker", 1, environment="cloud"))
    evaluator = parse_tf_config(tf_config(cluster, "evaluator", 0, environment="cloud"))
    assert worker.num_workers == 3 and worker.rank == 2
    assert evaluator.is_evaluator and not evaluator.is_chief


def test_value_is_immutable():
    cluster = parse_tf_config(tf_config(WORKERS, "worker", 0))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cluster.task_index = 1


@pytest.mark.parametrize("text, field, fix", [
    ("{not json", "(whole value)", "JSON"),
    ("[1, 2]", "(whole value)", "object"),
    (json.dumps({"cluster": WORKERS}), "task", '"task"'),
    (tf_config(WORKERS, "chief", 0), "task.type", "add \"chief\""),
    (tf_config(WORKERS, "worker", 2), "task.index", "0..1"),
    (tf_config(WORKERS, "worker", -1), "task.index", "0..1"),
    (tf_config(WORKERS, "worker", "0"), "task.index", "integer"),
    (tf_config({"master": ["m:2222"], "worker": ["w:2222"]}, "worker", 0), "cluster.master", "chief"),
    (tf_config({"worker": ["a:1", "b:2"]}, "master", 0), "task.type", "chief"),
    (tf_config({"worker": ["a:1"], "ps": ["p:1"]}, "ps", 0), "task.type", "Worker"),
    (tf_config({"worker": "a:1"}, "worker", 0), "cluster.worker", "list"),
    (tf_config({"chief": ["a:1", "b:1"]}, "chief", 0), "cluster.chief", "one chief"),
    (tf_config({"trainer": ["a:1"]}, "trainer", 0), "cluster.trainer", "unknown"),
])
def test_bad_tf_config_names_field_and_fix(text, field, fix):
    with pytest.raises(ClusterConfigError) as error:
        parse_tf_config(text)
    message = str(error.value)
    assert f"TF_CONFIG {field}:" in message and "Fix:" in message and fix in message


def test_bad_tf_config_exits_2_before_tensorflow_is_imported():
    probe = ("import sys; from trainer.__main__ import main; code = main(['--dataset', 'synthetic']); "
             "print('tensorflow imported:', 'tensorflow' in sys.modules); sys.exit(code)")
    bad = tf_config({"worker": ["a:1", "b:1"]}, "master", 0)
    result = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={"TF_CONFIG": bad, "PATH": "/usr/bin"},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "tensorflow imported: False" in result.stdout
    assert "TF_CONFIG task.type" in result.stderr and "chief" in result.stderr
