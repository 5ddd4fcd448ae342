"""The operator's decisions after each replica exit (restart, recreate, succeed, fail), without processes."""

import pytest

from k8s.engines.tfjob.local_rules import TFJobRules
from scripts.localrun.batch_job import BatchJobRules
from scripts.localrun.operator_rules import KubeletBackoff, Replica, exit_code_of


def job(*replicas, backoff_limit=None, deadline=None, success_policy=""):
    return TFJobRules("demo", "default", list(replicas), backoff_limit, deadline, success_policy)


def workers(n, policy):
    return [Replica("Worker", i, policy) for i in range(n)]


def test_a_signal_death_is_reported_as_128_plus_the_signal():
    assert exit_code_of(-9) == 137
    assert exit_code_of(-15) == 143
    assert exit_code_of(3) == 3


@pytest.mark.parametrize("code", [128, 137, 143, 144])
def test_exit_code_policy_recreates_a_pod_that_exits_retryably(code):
    w0, w1 = workers(2, "ExitCode")
    rules = job(w0, w1, backoff_limit=3)
    outcome = rules.on_exit(w1, code, 0.0)
    assert outcome.recreate and outcome.restart_after is None
    assert outcome.condition.type == "Restarting"
    assert outcome.condition.message == "TFJob demo is restarting because Worker replica(s) failed."
    assert w1.recreations == 1 and w1.restart_count == 0


@pytest.mark.parametrize("code", [1, 2, 127])
def test_exit_code_policy_fails_the_job_on_a_permanent_code(code):
    w0, w1 = workers(2, "ExitCode")
    outcome = job(w0, w1).on_exit(w1, code, 0.0)
    assert not outcome.recreate and outcome.restart_after is None
    assert outcome.condition.type == "Failed"
    assert outcome.condition.message == "TFJob default/demo has failed because 1 Worker replica(s) failed."


def test_never_policy_fails_the_job_on_any_non_zero_exit():
    w0, w1 = workers(2, "Never")
    outcome = job(w0, w1).on_exit(w1, 137, 0.0)
    assert outcome.condition.type == "Failed" and not outcome.recreate


def test_on_failure_restarts_in_place_with_the_kubelets_back_off():
    w0, w1 = workers(2, "OnFailure")
    rules = job(w0, w1)
    delays = [rules.on_exit(w1, 1, t).restart_after for t in (0.0, 1.0, 12.0, 33.0)]
    assert delays == [0.0, 10.0, 20.0, 40.0]
    assert w1.restart_count == 4 and w1.phase not in ("Succeeded", "Failed")


def test_the_kubelet_forgets_the_back_off_after_ten_quiet_minutes():
    backoff = KubeletBackoff()
    assert [backoff.delay(0.0), backoff.delay(1.0)] == [0.0, 10.0]
    assert backoff.delay(1.0 + 10 + 601) == 0.0


def test_on_failure_does_not_restart_a_replica_that_succeeded():
    w0, w1 = workers(2, "OnFailure")
    outcome = job(w0, w1, success_policy="AllWorkers").on_exit(w1, 0, 0.0)
    assert outcome.restart_after is None and w1.phase == "Succeeded" and outcome.condition is None


def test_always_restarts_even_after_exit_zero():
    (w0,) = workers(1, "Always")
    outcome = job(w0).on_exit(w0, 0, 0.0)
    assert outcome.restart_after == 0.0 and outcome.condition is None


def test_backoff_limit_counts_in_place_restarts_of_running_pods():
    w0, w1 = [Replica("Worker", i, "OnFailure", phase="Running") for i in range(2)]
    rules = job(w0, w1, backoff_limit=2)
    assert rules.on_exit(w1, 1, 0.0).condition is None
    outcome = rules.on_exit(w0, 1, 1.0)
    assert outcome.condition.type == "Failed"
    assert outcome.condition.message == "Job demo has failed because it has reached the specified backoff limit"


def test_backoff_limit_zero_fails_on_the_first_restart_even_under_exit_code():
    w0, w1 = workers(2, "ExitCode")
    outcome = job(w0, w1, backoff_limit=0).on_exit(w1, 137, 0.0)
    assert not outcome.recreate
    assert outcome.condition.message == "Job demo has failed because it has reached the specified backoff limit"


def test_exit_code_recreations_do_not_count_towards_a_non_zero_backoff_limit():
    # The operator counts container restarts; a recreated pod starts at 0 (kubeflow/trainer#2045).
    w0, w1 = [Replica("Worker", i, "ExitCode", phase="Running") for i in range(2)]
    rules = job(w0, w1, backoff_limit=1)
    for _ in range(5):
        assert rules.on_exit(w1, 137, 0.0).recreate
        w1.phase = "Running"


def test_default_success_policy_succeeds_when_worker_zero_succeeds():
    w0, w1 = workers(2, "ExitCode")
    rules = job(w0, w1)
    assert rules.on_exit(w1, 0, 0.0).condition is None
    w1.phase = "Running"
    assert rules.on_exit(w0, 0, 0.0).condition.message == "TFJob default/demo successfully completed."


def test_all_workers_success_policy_waits_for_every_worker():
    w0, w1 = workers(2, "ExitCode")
    rules = job(w0, w1, success_policy="AllWorkers")
    assert rules.on_exit(w0, 0, 0.0).condition is None
    assert rules.on_exit(w1, 0, 0.0).condition.type == "Succeeded"


def test_with_a_chief_the_chief_decides_success():
    chief, w0 = Replica("Chief", 0, "ExitCode"), Replica("Worker", 0, "ExitCode")
    rules = job(chief, w0, success_policy="AllWorkers")
    assert rules.on_exit(w0, 0, 0.0).condition is None
    assert rules.on_exit(chief, 0, 0.0).condition.type == "Succeeded"


def test_active_deadline_fails_the_job_once_reached():
    rules = job(*workers(2, "ExitCode"), deadline=5)
    assert rules.past_deadline(4.9) is None
    assert (
        rules.past_deadline(5.0).message == "Job demo has failed because it was active longer than specified deadline"
    )
    assert job(*workers(1, "Never")).past_deadline(1e9) is None


@pytest.mark.parametrize(
    ("code", "condition"),
    [
        (0, ("Succeeded", "JobSucceeded", "Job default/prepare successfully completed.")),
        (3, ("Failed", "JobFailed", "Job default/prepare has failed because 1 Worker replica(s) failed.")),
    ],
)
def test_a_batch_jobs_one_pod_decides_the_job_and_is_not_restarted(code, condition):
    rules = BatchJobRules("prepare", "default")
    (pod,) = rules.replicas
    outcome = rules.on_exit(pod, code, 0.0)
    assert (outcome.condition.type, outcome.condition.reason, outcome.condition.message) == condition
    assert not (outcome.recreate or outcome.restart_group) and outcome.restart_after is None
    assert pod.phase == condition[0] and pod.exit_codes == [code]
