"""run-local's TF_CONFIG is the operator's: pinned against the format of genTFConfigJSONStr (v1.9)."""

import json

from scripts.common import tfconfig

# Literal strings in the operator's format: compact JSON, cluster keys sorted, types lower-cased,
# every replica type in the cluster (evaluator included), "environment":"cloud" last.
WORKER_ONLY_1 = (
    '{"cluster":{"worker":["mnist-worker-0.default.svc:2222","mnist-worker-1.default.svc:2222"]},'
    '"task":{"type":"worker","index":1},"environment":"cloud"}'
)
CHIEF_AND_WORKERS_CHIEF = (
    '{"cluster":{"chief":["mnist-chief-0.team.svc:2222"],'
    '"worker":["mnist-worker-0.team.svc:2222","mnist-worker-1.team.svc:2222"]},'
    '"task":{"type":"chief","index":0},"environment":"cloud"}'
)
ALL_TYPES_PS_1 = (
    '{"cluster":{"chief":["big-chief-0.ml.svc:2223"],"evaluator":["big-evaluator-0.ml.svc:2223"],'
    '"ps":["big-ps-0.ml.svc:2223","big-ps-1.ml.svc:2223"],'
    '"worker":["big-worker-0.ml.svc:2223","big-worker-1.ml.svc:2223","big-worker-2.ml.svc:2223"]},'
    '"task":{"type":"ps","index":1},"environment":"cloud"}'
)


def test_worker_only_job_matches_the_operator():
    address = tfconfig.operator_address("mnist", "default", 2222)
    assert tfconfig.tf_config({"Worker": 2}, "Worker", 1, address) == WORKER_ONLY_1


def test_chief_and_workers_match_the_operator():
    address = tfconfig.operator_address("mnist", "team", 2222)
    assert tfconfig.tf_config({"Worker": 2, "Chief": 1}, "Chief", 0, address) == CHIEF_AND_WORKERS_CHIEF


def test_chief_workers_ps_and_evaluator_match_the_operator():
    address = tfconfig.operator_address("big", "ml", 2223)
    counts = {"Worker": 3, "PS": 2, "Evaluator": 1, "Chief": 1}
    assert tfconfig.tf_config(counts, "PS", 1, address) == ALL_TYPES_PS_1
    evaluator = json.loads(tfconfig.tf_config(counts, "Evaluator", 0, address))
    assert evaluator["task"] == {"type": "evaluator", "index": 0}
    assert evaluator["cluster"]["evaluator"] == ["big-evaluator-0.ml.svc:2223"]


def test_a_job_of_one_replica_gets_no_tf_config():
    address = tfconfig.operator_address("solo", "default", 2222)
    assert tfconfig.tf_config({"Worker": 1}, "Worker", 0, address) is None
    assert tfconfig.tf_config({"Chief": 1, "Worker": 0}, "Chief", 0, address) is None
    assert tfconfig.tf_config({"Chief": 1, "Worker": 1}, "Chief", 0, address) is not None


def test_local_addresses_replace_service_names_in_the_same_format():
    ports = {("Worker", 0): 40001, ("Worker", 1): 40002}
    text = tfconfig.tf_config({"Worker": 2}, "Worker", 0, lambda t, i: f"127.0.0.1:{ports[(t, i)]}")
    assert text == (
        '{"cluster":{"worker":["127.0.0.1:40001","127.0.0.1:40002"]},'
        '"task":{"type":"worker","index":0},"environment":"cloud"}'
    )


def test_the_chief_is_the_chief_replica_else_worker_zero():
    assert tfconfig.chief_of({"Worker": 2}) == ("Worker", 0)
    assert tfconfig.chief_of({"Chief": 1, "Worker": 2}) == ("Chief", 0)
    assert tfconfig.chief_of({"Master": 1, "Worker": 2}) == ("Master", 0)
