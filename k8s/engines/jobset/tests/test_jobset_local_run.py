"""run-local's JobSet emulation without processes (k8s/engines/jobset/local_run.py, local_rules.py): JobSet's rules
after each pod exit, the pods it plans from the project's overlays (names, hostnames, labels, indexes, the trainer's
cluster from them), and what it does not emulate."""

from __future__ import annotations

import json

import pytest

import engines_here
from k8s.engines.jobset import local_run
from k8s.engines.jobset.local_rules import JobSetRules, JobState
from scripts.common.manifest import ManifestError, customize, overlay, render
from scripts.localrun import manifests
from scripts.localrun.envvars import Problems
from scripts.localrun.operator_rules import Replica
from scripts.localrun.podplan import Planner
from trainer.base.errors import ExitCode
from trainer.distribution.cluster import from_environment

PERMANENT = {
    "action": "FailJob",
    "onExitCodes": {"containerName": "trainer", "operator": "NotIn", "values": [137, 143, 144]},
}
FAIL_ON_PERMANENT = {"name": "permanent_error", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"]}


def jobset_spec(
    shape, failure_policy=None, success_policy=None, backoff_limit=0, pod_rules=(PERMANENT,), policy="Never"
):
    """A JobSet spec of replicated jobs {name: pods}, one Job each."""
    spec = {
        "replicatedJobs": [
            {
                "name": name,
                "replicas": 1,
                "template": {
                    "spec": {
                        "parallelism": pods,
                        "completions": pods,
                        "backoffLimit": backoff_limit,
                        "podFailurePolicy": {"rules": list(pod_rules)},
                        "template": {"spec": {"restartPolicy": policy, "containers": [{"name": "trainer"}]}},
                    }
                },
            }
            for name, pods in shape.items()
        ]
    }
    if failure_policy is not None:
        spec["failurePolicy"] = failure_policy
    if success_policy is not None:
        spec["successPolicy"] = success_policy
    return spec


def rules_for(spec):
    replicas, jobs, pods = [], [], {}
    for rjob in spec["replicatedJobs"]:
        job_spec = rjob["template"]["spec"]
        names = []
        for i in range(job_spec["parallelism"]):
            replica = Replica(rjob["name"], i, job_spec["template"]["spec"]["restartPolicy"])
            replicas.append(replica)
            names.append(replica.name)
            pods[replica.name] = ("trainer", f"demo-{rjob['name']}-0-{i}-x")
        jobs.append(
            JobState(
                f"demo-{rjob['name']}-0",
                rjob["name"],
                names,
                job_spec["backoffLimit"],
                job_spec["podFailurePolicy"]["rules"],
            )
        )
    rules = JobSetRules("demo", "default", spec, replicas, jobs, pods)
    return rules, {r.name: r for r in replicas}


GROUP = {"maxRestarts": 2, "rules": [FAIL_ON_PERMANENT]}


def test_the_shipped_pod_failure_policy_lets_exactly_the_trainers_retryable_exit_codes_restart():
    for (engine,) in engines_here.present(("jobset",), ("trainjob",)):
        objects = render(overlay(engine, "sync"))
        job = manifests.parse(objects, engine).job
        for rjob in job["spec"]["replicatedJobs"]:
            (rule,) = rjob["template"]["spec"]["podFailurePolicy"]["rules"]
            assert rule["action"] == "FailJob" and rule["onExitCodes"]["operator"] == "NotIn"
            assert set(rule["onExitCodes"]["values"]) == {code for code in ExitCode if code >= 128}
            assert (
                rule["onExitCodes"]["containerName"]
                == rjob["template"]["spec"]["template"]["spec"]["containers"][0]["name"]
            )
            assert rjob["template"]["spec"]["template"]["spec"]["restartPolicy"] == "Never"
        assert job["spec"]["failurePolicy"]["rules"][0] == FAIL_ON_PERMANENT


@pytest.mark.parametrize("code", [1, int(ExitCode.BAD_CONFIG), 127])
def test_a_permanent_exit_fails_the_jobset_at_once_without_a_restart(code):
    rules, pods = rules_for(jobset_spec({"worker": 2}, GROUP))
    outcome = rules.on_exit(pods["worker-1"], code, 0.0)
    assert not outcome.restart_group and not outcome.recreate
    assert outcome.condition.type == "Failed"
    assert outcome.condition.reason == "FailJobSetFailurePolicyAction"
    assert outcome.condition.message == "applying FailJobSet failure policy action (first failed job: demo-worker-0)"
    assert f"failed with exit code {code} matching FailJob rule at index 0" in outcome.note
    assert rules.restarts == 0


@pytest.mark.parametrize("code", [137, 143, 144])
def test_a_lost_peer_restarts_the_whole_group_until_max_restarts(code):
    rules, pods = rules_for(jobset_spec({"worker": 2}, GROUP))
    for attempt in (1, 2):
        outcome = rules.on_exit(pods["worker-1"], code, 0.0)
        assert outcome.restart_group and outcome.condition.type == "RestartingJobSet"
        assert outcome.condition.reason == "RestartJobSet"  # no rule matched: the default action
        assert rules.restarts == attempt
        rules.begin_attempt()
        assert {r.phase for r in pods.values()} == {"Pending"}
    outcome = rules.on_exit(pods["worker-0"], code, 0.0)
    assert not outcome.restart_group
    assert (outcome.condition.type, outcome.condition.reason) == ("Failed", "ReachedMaxRestarts")
    assert pods["worker-0"].recreations == 2


def test_restarts_ignoring_max_restarts_are_not_counted():
    policy = {"maxRestarts": 0, "rules": [{"name": "any", "action": "RestartJobSetAndIgnoreMaxRestarts"}]}
    rules, pods = rules_for(jobset_spec({"worker": 2}, policy))
    assert rules.on_exit(pods["worker-0"], 144, 0.0).restart_group
    assert (rules.restarts, rules.restarts_counted) == (1, 0)


def test_without_a_failure_policy_any_job_failure_fails_the_jobset():
    rules, pods = rules_for(jobset_spec({"worker": 2}))
    outcome = rules.on_exit(pods["worker-0"], 144, 0.0)
    assert (outcome.condition.type, outcome.condition.reason) == ("Failed", "FailedJobs")


def test_rules_match_reasons_message_patterns_and_target_replicated_jobs():
    policy = {
        "maxRestarts": 5,
        "rules": [
            {"name": "ps-lost", "action": "FailJobSet", "targetReplicatedJobs": ["ps"]},
            {"name": "oom", "action": "FailJobSet", "onJobFailureMessagePatterns": ["exit code 9[0-9]"]},
        ],
    }
    rules, pods = rules_for(jobset_spec({"worker": 1, "ps": 1}, policy, pod_rules=()))
    assert rules.on_exit(pods["worker-0"], 144, 0.0).restart_group  # BackoffLimitExceeded matches neither rule
    rules.begin_attempt()
    assert rules.on_exit(pods["ps-0"], 144, 0.0).condition.type == "Failed"


def test_backoff_limit_and_ignore_rules_replace_the_pod_instead():
    rules, pods = rules_for(jobset_spec({"worker": 2}, GROUP, backoff_limit=1, pod_rules=()))
    first = rules.on_exit(pods["worker-1"], 137, 0.0)
    assert first.recreate and not first.restart_group and first.condition is None
    assert rules.on_exit(pods["worker-1"], 137, 0.0).restart_group  # the second failure passes backoffLimit 1
    ignore = {"action": "Ignore", "onExitCodes": {"operator": "In", "values": [143]}}
    rules, pods = rules_for(jobset_spec({"worker": 2}, GROUP, pod_rules=(ignore,)))
    for _ in range(3):
        assert rules.on_exit(pods["worker-0"], 143, 0.0).recreate


def test_on_failure_pods_restart_in_place_and_count_toward_the_backoff_limit():
    rules, pods = rules_for(jobset_spec({"worker": 1}, GROUP, backoff_limit=1, pod_rules=(), policy="OnFailure"))
    first = rules.on_exit(pods["worker-0"], 1, 0.0)
    assert first.restart_after == 0.0 and pods["worker-0"].in_place_restarts == 1
    assert rules.on_exit(pods["worker-0"], 1, 1.0).restart_group


@pytest.mark.parametrize(
    "success, shape, finishing, done",
    [
        (None, {"worker": 2}, ["worker-0"], False),  # the default: All, every Job
        (None, {"worker": 2}, ["worker-0", "worker-1"], True),
        ({"operator": "All", "targetReplicatedJobs": ["chief"]}, {"chief": 1, "worker": 2}, ["chief-0"], True),
        ({"operator": "All", "targetReplicatedJobs": ["chief"]}, {"chief": 1, "worker": 1}, ["worker-0"], False),
        ({"operator": "Any"}, {"chief": 1, "worker": 1}, ["worker-0"], True),
    ],
)
def test_success_policy(success, shape, finishing, done):
    rules, pods = rules_for(jobset_spec(shape, GROUP, success_policy=success))
    outcomes = [rules.on_exit(pods[name], 0, 0.0) for name in finishing]
    condition = outcomes[-1].condition
    assert (condition is not None and condition.type == "Completed") == done
    if done:
        assert (condition.reason, condition.message) == ("AllJobsCompleted", "jobset completed successfully")


def test_a_jobs_deadline_fails_it_with_reason_deadline_exceeded():
    deadline_rule = {"name": "d", "action": "FailJobSet", "onJobFailureReasons": ["DeadlineExceeded"]}
    spec = jobset_spec({"worker": 1}, {"maxRestarts": 1, "rules": [deadline_rule]})
    spec["replicatedJobs"][0]["template"]["spec"]["activeDeadlineSeconds"] = 60
    rules, _ = rules_for(spec)
    assert rules.active_deadline_s == 60 and rules.on_deadline(59.0) is None
    assert rules.on_deadline(60.0).condition.reason == "FailJobSetFailurePolicyAction"


def planned(engine, strategy, tmp_path, workers=None):
    objects = render(overlay(engine, strategy))
    if workers is not None:
        objects = customize(objects, workers=workers)
    parsed = manifests.parse(objects, engine)
    problems = Problems()
    planner = Planner(parsed, tmp_path, problems)
    pods, (jobs, names) = local_run.plan(planner)
    assert not problems.errors, problems.errors
    return parsed, planner, pods, jobs, names


@pytest.mark.parametrize("engine, worker_job", engines_here.present(("jobset", "worker"), ("trainjob", "node")))
def test_each_pod_of_the_overlay_gets_jobsets_names_labels_and_indexes_and_the_trainer_finds_its_group(
    tmp_path, engine, worker_job
):
    parsed, planner, pods, jobs, names = planned(engine, "async", tmp_path, workers=3)
    assert [replica.name for replica, _ in pods] == [
        "chief-0",
        "ps-0",
        *(f"{worker_job}-{i}" for i in range(3)),
        "evaluator-0",
    ]
    assert planner.chief is pods[0][1]
    assert [job.name for job in jobs] == [f"multi-worker-{rjob}-0" for rjob in ("chief", "ps", worker_job, "evaluator")]
    clusters = {}
    for replica, plan in pods:
        job_index, pod_index = 0, replica.index
        hostname = f"multi-worker-{replica.rtype}-{job_index}-{pod_index}"
        assert plan.env["HOSTNAME"] == hostname
        assert plan.pod_name.startswith(hostname + "-")
        assert plan.env["JOB_COMPLETION_INDEX"] == str(pod_index)
        assert plan.env["JOBSET_NAME"] == "multi-worker"
        assert names[replica.name][0] == ("node" if engine == "trainjob" else "trainer")
        clusters[replica.name] = from_environment(plan.env)
    # Every pod reads the same group from its TF_CONFIG, every address a local one, and finds itself in it with the
    # task type and index its replicated job and completion index give it.
    assert len({json.dumps(c.members, sort_keys=True) for c in clusters.values()}) == 1
    members = clusters["chief-0"].members
    assert [len(members[t]) for t in ("chief", "ps", "worker", "evaluator")] == [1, 1, 3, 1]
    assert all(a.startswith("127.0.0.1:") for addresses in members.values() for a in addresses)
    assert len({a for addresses in members.values() for a in addresses}) == 6
    assert {name: (c.task_type, c.task_index) for name, c in clusters.items()} == {
        "chief-0": ("chief", 0),
        "ps-0": ("ps", 0),
        **{f"{worker_job}-{i}": ("worker", i) for i in range(3)},
        "evaluator-0": ("evaluator", 0),
    }
    assert clusters["chief-0"].role == "coordinator" and clusters["evaluator-0"].role == "evaluator"


def test_a_label_that_changes_with_every_restart_is_not_supported_locally(tmp_path):
    objects = render(overlay("jobset", "sync"))
    jobset = next(o for o in objects if o["kind"] == "JobSet")
    container = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    container["env"].append(
        {
            "name": "ATTEMPT",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"}},
        }
    )
    problems = Problems()
    local_run.plan(Planner(manifests.parse(objects, "x"), tmp_path, problems))
    assert any(e.startswith("not supported locally: env[ATTEMPT].valueFrom.fieldRef") for e in problems.errors)


@pytest.mark.parametrize(
    "change, says",
    [
        (
            lambda s: s.update(startupPolicy={"startupPolicyOrder": "InOrder"}),
            "not supported locally: spec.startupPolicy",
        ),
        (lambda s: s.update(coordinator={"replicatedJob": "worker"}), "not supported locally: spec.coordinator"),
        (lambda s: s["failurePolicy"]["rules"].append({"name": "r", "action": "RestartJob"}), "action RestartJob"),
        (lambda s: s["replicatedJobs"][0]["template"]["spec"].update(backoffLimitPerIndex=1), "backoffLimitPerIndex"),
        (
            lambda s: s["replicatedJobs"][0]["template"]["spec"]["template"]["spec"].update(restartPolicy="OnFailure"),
            "podFailurePolicy needs the pod's restartPolicy Never",
        ),
        (lambda s: s.update(network={"enableDNSHostnames": False}), "network.enableDNSHostnames is false"),
        (lambda s: s.update(suspend=True), "spec.suspend: true"),
    ],
)
def test_what_run_local_does_not_emulate_of_a_jobset_stops_it(change, says):
    objects = render(overlay("jobset", "sync"))
    jobset = next(o for o in objects if o["kind"] == "JobSet")
    change(jobset["spec"])
    with pytest.raises(ManifestError, match="JobSet multi-worker cannot run") as error:
        manifests.parse(objects, "x")
    assert says in str(error.value)


def test_a_pod_its_tf_config_does_not_list_stops_the_run_naming_the_pod(tmp_path):
    # A Job scaled by hand, past the count its TF_CONFIG gives: on a cluster the third worker would wait for a group
    # that never names it.
    objects = render(overlay("jobset", "sync"))
    jobset = next(o for o in objects if o["kind"] == "JobSet")
    jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["parallelism"] = 3
    jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["completions"] = 3
    with pytest.raises(ManifestError) as refused:
        local_run.plan(Planner(manifests.parse(objects, "jobset"), tmp_path, Problems()))
    assert "pod multi-worker-worker-0-2.multi-worker has no address in TF_CONFIG's cluster" in str(refused.value)
