"""The JobSet controller's (and Kubernetes' Job controller's) decisions about a JobSet, as a pure state machine.

Sources: kubernetes-sigs/jobset v0.12.0, pkg/controllers/failure_policy.go (rules: first match wins, no match is
RestartJobSet, maxRestarts), success_policy.go and jobset_controller.go executeSuccessPolicy (operator All/Any over
targetReplicatedJobs), jobset_controller.go reconcile (a finished JobSet deletes its active Jobs);
pkg/constants/constants.go (reasons, messages). Kubernetes' Job controller (pkg/controller/job): an Indexed Job
completes when every index has succeeded; a failed pod fails its Job through the first matching podFailurePolicy
rule (FailJob: reason PodFailurePolicy; Ignore: the pod is replaced, not counted) or once its failures pass
backoffLimit (reason BackoffLimitExceeded); activeDeadlineSeconds fails it with reason DeadlineExceeded.

A replica here is one pod of one Job: rtype is the replicated job's name, index the pod's place in it
(job index x pods per job + completion index).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from scripts.localrun.operator_rules import Condition, KubeletBackoff, Outcome, Replica

# pkg/constants/constants.go at v0.12.0.
FAILED_JOBS = ("FailedJobs", "jobset failed due to one or more job failures")
FAIL_JOBSET_ACTION = ("FailJobSetFailurePolicyAction", "applying FailJobSet failure policy action")
REACHED_MAX_RESTARTS = ("ReachedMaxRestarts", "jobset failed due to reaching max number of restarts")
ALL_JOBS_COMPLETED = ("AllJobsCompleted", "jobset completed successfully")
RESTART_JOBSET_ACTION = "applying RestartJobSet failure policy action"
RESTART_IGNORING_MAX_ACTION = "applying RestartJobSetAndIgnoreMaxRestarts failure policy action"
# The failure policy actions run-local emulates; RestartJob and RestartJobAndIgnoreMaxRestarts sit behind a
# feature gate (RestartJob) that is off by default at v0.12.0.
ACTIONS = ("FailJobSet", "RestartJobSet", "RestartJobSetAndIgnoreMaxRestarts")
# Kubernetes' Job failure reasons and messages (batch/v1 JobReasonBackoffLimitExceeded and friends).
BACKOFF_LIMIT_EXCEEDED = ("BackoffLimitExceeded", "Job has reached the specified backoff limit")
DEADLINE_EXCEEDED = ("DeadlineExceeded", "Job was active longer than specified deadline")
POD_FAILURE_POLICY = "PodFailurePolicy"
POD_FAILURE_ACTIONS = ("FailJob", "Ignore", "Count")


@dataclasses.dataclass
class JobState:
    """One child Job of the current attempt: its pods (replica names) and the failures it has counted."""

    name: str  # <jobset>-<replicatedJob>-<jobIndex>
    replicated_job: str
    pods: list[str]
    backoff_limit: int
    pod_failure_rules: list[Mapping[str, Any]]
    failures: int = 0
    failed: tuple[str, str] | None = None  # (reason, message) once the Job has failed
    succeeded: bool = False


def job_backoff_limit(job_spec: Mapping[str, Any]) -> int:
    """Kubernetes' default backoffLimit is 6."""
    return int(job_spec.get("backoffLimit", 6))


def _exit_code_rule_matches(rule: Mapping[str, Any], container: str, exit_code: int) -> bool:
    on_codes = rule.get("onExitCodes")
    if not on_codes or (on_codes.get("containerName") not in (None, container)):
        return False
    values = {int(v) for v in on_codes.get("values") or []}
    if on_codes.get("operator") == "In":
        return exit_code in values
    return exit_code not in values  # NotIn; a container that exited 0 never failed the pod


class JobSetRules:
    """The JobSet's state across attempts; on_exit maps a pod's exit to what Kubernetes and JobSet do next."""

    kind = "JobSet"
    clean_pod_policy = "Running"  # a finished JobSet deletes its active Jobs, and so their running pods
    progress_conditions = ("RestartingJobSet", "Running")  # the job goes on after these

    def cleanup(self, running: str) -> str:
        """What the finished JobSet does to the pods still running."""
        return f"a finished JobSet deletes its active Jobs: stopping {running}"

    def __init__(
        self,
        name: str,
        namespace: str,
        spec: Mapping[str, Any],
        replicas: Sequence[Replica],
        jobs: Sequence[JobState],
        pods: Mapping[str, tuple[str, str]],
    ):
        self.name, self.namespace = name, namespace
        self.replicas = list(replicas)
        self.jobs = {job.name: job for job in jobs}
        self._job_of = {pod: job for job in jobs for pod in job.pods}
        self._pods = dict(pods)  # replica name -> (its trainer container's name, its pod's name)
        self._by_name = {r.name: r for r in self.replicas}
        failure = spec.get("failurePolicy")
        self.failure_policy: Mapping[str, Any] | None = failure
        self.max_restarts = int((failure or {}).get("maxRestarts", 0))
        self.restarts = 0
        self.restarts_counted = 0
        success = spec.get("successPolicy") or {}
        self.success_operator = success.get("operator", "All")
        self.success_targets = list(success.get("targetReplicatedJobs") or [])
        self.replicated_job_replicas = {
            rjob["name"]: int(rjob.get("replicas", 1)) for rjob in spec.get("replicatedJobs") or []
        }
        # activeDeadlineSeconds per Job (from its replicated job): the shortest fails first.
        deadlines = {
            rjob["name"]: float(rjob["template"]["spec"]["activeDeadlineSeconds"])
            for rjob in spec.get("replicatedJobs") or []
            if "activeDeadlineSeconds" in rjob["template"]["spec"]
        }
        timed = sorted((deadlines[job.replicated_job], job.name) for job in jobs if job.replicated_job in deadlines)
        self.active_deadline_s: float | None = timed[0][0] if timed else None
        self._deadline_job = self.jobs[timed[0][1]] if timed else None

    # Conditions -------------------------------------------------------------------------------
    def _failed(self, reason_message: tuple[str, str], job: str) -> Condition:
        reason, message = reason_message
        return Condition("Failed", reason, f"{message} (first failed job: {job})")

    def _completed(self) -> Condition:
        return Condition("Completed", *ALL_JOBS_COMPLETED)

    # Attempts ---------------------------------------------------------------------------------
    def begin_attempt(self) -> None:
        """A restart: JobSet deleted every Job and creates them anew, with fresh pods and counts."""
        for job in self.jobs.values():
            job.failures, job.failed, job.succeeded = 0, None, False
        for replica in self.replicas:
            replica.phase, replica.restart_count = "Pending", 0
            replica.backoff = KubeletBackoff()

    # Jobs -------------------------------------------------------------------------------------
    def _pod_failure(self, job: JobState, replica: Replica, exit_code: int) -> tuple[str, str] | None:
        """The Job's failure (reason, message) this failed pod causes, or None when the Job goes on (the pod is
        replaced)."""
        container, pod_name = self._pods[replica.name]
        for index, rule in enumerate(job.pod_failure_rules):
            if _exit_code_rule_matches(rule, container, exit_code):
                action = rule["action"]
                if action == "FailJob":
                    return POD_FAILURE_POLICY, (
                        f"Container {container} for pod {self.namespace}/{pod_name} failed with exit code "
                        f"{exit_code} matching FailJob rule at index {index}"
                    )
                if action == "Ignore":
                    return None
                break  # Count: the default counting below
        job.failures += 1
        if job.failures > job.backoff_limit:
            return BACKOFF_LIMIT_EXCEEDED
        return None

    def _job_done(self, job: JobState) -> bool:
        return all(self._by_name[pod].phase == "Succeeded" for pod in job.pods)

    # Policies ---------------------------------------------------------------------------------
    def _rule_for(self, job: JobState) -> Mapping[str, Any] | None:
        reason, message = job.failed or ("", "")
        for rule in (self.failure_policy or {}).get("rules") or []:
            reasons = rule.get("onJobFailureReasons") or []
            patterns = rule.get("onJobFailureMessagePatterns") or []
            targets = rule.get("targetReplicatedJobs") or []
            if reasons and reason not in reasons:
                continue
            if patterns and not any(re.search(p, message) for p in patterns):
                continue
            if targets and job.replicated_job not in targets:
                continue
            return rule
        return None

    def _on_job_failed(self, job: JobState) -> Outcome:
        """executeFailurePolicy: no policy fails the JobSet; else the first matching rule's action, RestartJobSet
        when none matches."""
        assert job.failed is not None
        note = f"Job {job.name} failed ({job.failed[0]}: {job.failed[1]})"
        if self.failure_policy is None:
            return Outcome(
                condition=self._failed(FAILED_JOBS, job.name), note=note + "; the JobSet has no failurePolicy"
            )
        rule = self._rule_for(job)
        action = rule["action"] if rule is not None else "RestartJobSet"
        which = f"rule {rule.get('name')!r}" if rule is not None else "no rule matched, the default"
        if action == "FailJobSet":
            return Outcome(condition=self._failed(FAIL_JOBSET_ACTION, job.name), note=f"{note}; {which}: FailJobSet")
        counts = action == "RestartJobSet"
        if counts and self.restarts_counted >= self.max_restarts:
            return Outcome(
                condition=self._failed(REACHED_MAX_RESTARTS, job.name),
                note=f"{note}; {which}: RestartJobSet, but maxRestarts ({self.max_restarts}) is reached",
            )
        self.restarts += 1
        self.restarts_counted += counts
        for replica in self.replicas:
            replica.recreations += 1
        message = RESTART_JOBSET_ACTION if counts else RESTART_IGNORING_MAX_ACTION
        bound = f"{self.restarts_counted} of maxRestarts {self.max_restarts}" if counts else "not counted"
        return Outcome(
            restart_group=True,
            condition=Condition("RestartingJobSet", action, f"{message} (first failed job: {job.name})"),
            note=f"{note}; {which}: {action}, restart {self.restarts} ({bound}): every Job is recreated",
        )

    def _success(self) -> Condition | None:
        done = [job for job in self.jobs.values() if job.succeeded]
        matching = [job for job in done if not self.success_targets or job.replicated_job in self.success_targets]
        if self.success_operator == "Any":
            expected = 1
        else:
            expected = sum(
                count
                for rjob, count in self.replicated_job_replicas.items()
                if not self.success_targets or rjob in self.success_targets
            )
        return self._completed() if matching and len(matching) >= expected else None

    # The supervisor's interface -----------------------------------------------------------------
    def record_exit(self, replica: Replica, exit_code: int) -> None:
        replica.exit_codes.append(exit_code)
        replica.phase = "Succeeded" if exit_code == 0 else "Failed"

    def on_exit(self, replica: Replica, exit_code: int, finished_at: float) -> Outcome:
        replica.exit_codes.append(exit_code)
        job = self._job_of[replica.name]
        if exit_code == 0:
            replica.phase = "Succeeded"
            if self._job_done(job):
                job.succeeded = True
                return Outcome(condition=self._success(), note=f"Job {job.name} completed")
            return Outcome()
        replica.phase = "Failed"
        if replica.restart_policy == "OnFailure":
            # The kubelet restarts the container in place; the Job counts each restart as a failure.
            replica.restart_count += 1
            replica.in_place_restarts += 1
            job.failures += 1
            if job.failures > job.backoff_limit:
                job.failed = BACKOFF_LIMIT_EXCEEDED
                return self._on_job_failed(job)
            replica.phase = "Running"
            delay = replica.backoff.delay(finished_at)
            return Outcome(restart_after=delay, note="restarted in place by the kubelet (OnFailure)")
        job.failed = self._pod_failure(job, replica, exit_code)
        if job.failed is None:
            replica.recreations += 1
            return Outcome(
                recreate=True,
                note=f"Job {job.name} replaces the pod ({job.failures} of backoffLimit {job.backoff_limit} failures)",
            )
        return self._on_job_failed(job)

    def on_deadline(self, elapsed_s: float) -> Outcome | None:
        """activeDeadlineSeconds of a Job (the shortest): that Job fails with reason DeadlineExceeded."""
        if self.active_deadline_s is None or elapsed_s < self.active_deadline_s or self._deadline_job is None:
            return None
        self._deadline_job.failed = DEADLINE_EXCEEDED
        return self._on_job_failed(self._deadline_job)

    def past_deadline(self, elapsed_s: float) -> Condition | None:
        outcome = self.on_deadline(elapsed_s)
        return None if outcome is None else outcome.condition
