"""The training operator's (and kubelet's) decisions about a TFJob, as a pure state machine.

Sources (kubeflow/trainer v1.9, pkg/controller.v1): common/pod.go ReconcilePods (restart or fail on an
exit), core/job.go PastBackoffLimit and PastActiveDeadline, common/job.go ReconcileJobs (backoff limit
with a new failure), tensorflow/tfjob_controller.go UpdateJobStatus (success policy, failed replicas).
"""

from __future__ import annotations

from collections.abc import Sequence

from scripts.common.manifest import CHIEF_TYPES
from scripts.localrun.operator_rules import Condition, KubeletBackoff, Outcome, Replica

RETRYABLE_EXIT_CODE = 128  # train_util.IsRetryableExitCode: exit codes >= 128 are retryable under ExitCode
COUNTED_IN_BACKOFF = ("OnFailure", "Always", "ExitCode")
STATUS_ORDER = ("Chief", "Evaluator", "Master", "PS", "Worker")


class TFJobRules:
    """The TFJob's state; on_exit maps a replica's exit to what the kubelet and the training operator do next."""

    kind = "TFJob"
    progress_conditions = ("Restarting", "Running")  # the job goes on after these

    def __init__(
        self,
        name: str,
        namespace: str,
        replicas: Sequence[Replica],
        backoff_limit: int | None,
        active_deadline_s: float | None,
        success_policy: str = "",
        clean_pod_policy: str = "",
    ):
        self.name, self.namespace = name, namespace
        # The TFJob default (tensorflow_defaults.go): None. Running and All delete running pods once finished.
        self.clean_pod_policy = clean_pod_policy or "None"
        self.replicas = list(replicas)
        self.backoff_limit = backoff_limit
        self.active_deadline_s = active_deadline_s
        self.success_policy = success_policy or "Default"
        self.has_chief = any(r.rtype in CHIEF_TYPES for r in self.replicas)

    def cleanup(self, running: str) -> str:
        """What the finished TFJob's cleanPodPolicy does to the replicas still running."""
        return f"cleanPodPolicy {self.clean_pod_policy}: deleting the running replicas {running}"

    def _failed(self, message: str) -> Condition:
        return Condition("Failed", f"{self.kind}Failed", message)

    def _backoff_failed(self) -> Condition:
        return self._failed(f"Job {self.name} has failed because it has reached the specified backoff limit")

    def past_backoff_limit(self) -> bool:
        """Container restarts of running pods, summed over replicas whose policy restarts them."""
        if self.backoff_limit is None:
            return False
        total = sum(
            r.restart_count for r in self.replicas if r.restart_policy in COUNTED_IN_BACKOFF and r.phase == "Running"
        )
        return total > 0 if self.backoff_limit == 0 else total >= self.backoff_limit

    def past_deadline(self, elapsed_s: float) -> Condition | None:
        if self.active_deadline_s is None or elapsed_s < self.active_deadline_s:
            return None
        return self._failed(f"Job {self.name} has failed because it was active longer than specified deadline")

    def on_deadline(self, elapsed_s: float) -> Outcome | None:
        condition = self.past_deadline(elapsed_s)
        return None if condition is None else Outcome(condition=condition)

    def begin_attempt(self) -> None:
        """The operator never restarts a TFJob's replicas as a group."""
        raise AssertionError("a TFJob has no group restart")

    def record_exit(self, replica: Replica, exit_code: int) -> None:
        """An exit after the job's outcome is decided: no rule applies, but the pod still ends, as on a cluster."""
        replica.exit_codes.append(exit_code)
        replica.end(exit_code)

    def on_exit(self, replica: Replica, exit_code: int, finished_at: float) -> Outcome:
        replica.exit_codes.append(exit_code)
        policy = replica.restart_policy
        in_place = policy == "Always" or (policy == "OnFailure" and exit_code != 0)
        if in_place:
            replica.restart_count += 1
            replica.in_place_restarts += 1
            if self.past_backoff_limit():
                return Outcome(condition=self._backoff_failed())
            delay = replica.backoff.delay(finished_at)
            return Outcome(
                restart_after=delay,
                note=f"restarted in place by the kubelet ({policy})"
                + (f" after a {delay:.0f} s crash-loop back-off" if delay else ""),
            )
        if exit_code != 0 and self.backoff_limit == 0:
            replica.end(exit_code)
            return Outcome(condition=self._backoff_failed())
        if policy == "ExitCode" and exit_code >= RETRYABLE_EXIT_CODE:
            replica.recreations += 1
            replica.restart_count = 0
            replica.backoff = KubeletBackoff()
            message = f"{self.kind} {self.name} is restarting because {replica.rtype} replica(s) failed."
            return Outcome(
                recreate=True,
                condition=Condition("Restarting", f"{self.kind}Restarting", message),
                note=f"exit code {exit_code} is retryable (>= {RETRYABLE_EXIT_CODE}): pod recreated",
            )
        replica.end(exit_code)
        note = (
            ""
            if exit_code == 0
            else f"exit code {exit_code} is permanent (1-127) under ExitCode"
            if policy == "ExitCode"
            else f"not restarted (restartPolicy {policy})"
        )
        return Outcome(condition=self.status_condition(), note=note)

    def status_condition(self) -> Condition | None:
        """Succeeded or Failed once the replicas' phases decide it, else None."""
        succeeded_condition = None
        for rtype in STATUS_ORDER:
            group = [r for r in self.replicas if r.rtype == rtype]
            if not group:
                continue
            expected = len(group) - sum(r.phase == "Succeeded" for r in group)
            failed = sum(r.phase == "Failed" for r in group)
            if failed:
                return self._failed(
                    f"{self.kind} {self.namespace}/{self.name} has failed because {failed} {rtype} replica(s) failed."
                )
            if self.has_chief:
                done = rtype in CHIEF_TYPES and expected == 0
            else:
                worker0_done = any(r.index == 0 and r.phase == "Succeeded" for r in group)
                done = rtype == "Worker" and (expected == 0 or (worker0_done and self.success_policy != "AllWorkers"))
            if done:
                succeeded_condition = Condition(
                    "Succeeded",
                    f"{self.kind}Succeeded",
                    f"{self.kind} {self.namespace}/{self.name} successfully completed.",
                )
        return succeeded_condition
