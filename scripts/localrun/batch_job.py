"""A batch Job of one pod (the data preparation) as run-local runs it: the pod is not restarted, and its exit decides
the Job (Succeeded on 0, else Failed), with the condition the job's status file reports."""

from __future__ import annotations

from .operator_rules import Condition, Outcome, Replica


class BatchJobRules:
    """The Job's one pod ("Worker" 0, restartPolicy Never as run-local runs it); its exit ends the Job."""

    kind = "Job"
    clean_pod_policy = "None"  # one pod: nothing else runs once it has ended
    progress_conditions: tuple[str, ...] = ("Running",)  # the job goes on after these
    active_deadline_s: float | None = None

    def __init__(self, name: str, namespace: str):
        self.name, self.namespace = name, namespace
        self.replicas = [Replica("Worker", 0)]

    def cleanup(self, running: str) -> str:
        """Never asked: clean_pod_policy None."""
        return f"the Job has ended: stopping {running}"

    def record_exit(self, replica: Replica, exit_code: int) -> None:
        replica.exit_codes.append(exit_code)
        replica.end(exit_code)

    def on_exit(self, replica: Replica, exit_code: int, finished_at: float) -> Outcome:
        self.record_exit(replica, exit_code)
        where = f"{self.kind} {self.namespace}/{self.name}"
        if exit_code == 0:
            return Outcome(
                condition=Condition("Succeeded", f"{self.kind}Succeeded", f"{where} successfully completed.")
            )
        failed = Condition("Failed", f"{self.kind}Failed", f"{where} has failed because 1 Worker replica(s) failed.")
        return Outcome(condition=failed, note=f"not restarted (restartPolicy {replica.restart_policy})")

    def on_deadline(self, elapsed_s: float) -> Outcome | None:
        return None

    def begin_attempt(self) -> None:
        raise AssertionError("a batch Job's one pod has no group restart")
