"""Follows a submitted TFJob: conditions as they change, the chief's log lines, the outcome,
and on failure the events and the last log lines of every replica."""

from __future__ import annotations

import json
import time
from typing import Any, Callable

from scripts.common.manifest import TFJOB_CONTAINER

FINISHED = ("Succeeded", "Failed")


def sortable_timestamp(stamp: str) -> str:
    """Kubelet log timestamps (RFC 3339, trailing zeros trimmed) made comparable as strings."""
    base, _, fraction = stamp.rstrip("Z").partition(".")
    return f"{base}.{fraction.ljust(9, '0')}"


class JobFollower:
    """Reads one TFJob through the Kubeflow SDK and its pods through the Kubernetes API."""

    def __init__(self, training_client, core_api, name: str, namespace: str,
                 out: Callable[[str], None] = print):
        self.training = training_client
        self.core = core_api
        self.name = name
        self.namespace = namespace
        self.out = out
        self._shown_conditions: set[tuple] = set()
        self._last_log_stamp = ""

    def conditions(self) -> list[Any]:
        job = self.training.get_job(self.name, namespace=self.namespace)
        return list((job.status and job.status.conditions) or [])

    def finished_state(self, conditions: list[Any]) -> str | None:
        for condition in conditions:
            if condition.type in FINISHED and condition.status == "True":
                return condition.type
        return None

    def follow(self, timeout_s: float = 0, poll_s: float = 5.0) -> str:
        """Prints progress until the job finishes; returns Succeeded, Failed or Timeout (timeout_s > 0)."""
        started = time.monotonic()
        while True:
            conditions = self.conditions()
            self._print_new_conditions(conditions)
            self._print_chief_logs(poll_s)
            state = self.finished_state(conditions)
            if state:
                return state
            if timeout_s and time.monotonic() - started > timeout_s:
                return "Timeout"
            time.sleep(poll_s)

    def _print_new_conditions(self, conditions: list[Any]) -> None:
        for condition in conditions:
            key = (condition.type, condition.status, condition.reason, str(condition.last_transition_time))
            if key in self._shown_conditions or condition.status != "True":
                continue
            self._shown_conditions.add(key)
            self.out(f"[{self.name}] {condition.type}: {condition.message or condition.reason}")

    def pods(self, chief_only: bool = False) -> list[Any]:
        selector = f"training.kubeflow.org/job-name={self.name}"
        if chief_only:
            selector += ",training.kubeflow.org/job-role=master"
        pods = self.core.list_namespaced_pod(self.namespace, label_selector=selector).items
        return sorted(pods, key=lambda pod: pod.metadata.name)

    def _print_chief_logs(self, poll_s: float) -> None:
        for pod in self.pods(chief_only=True):
            if pod.status.phase == "Pending":
                continue
            try:
                text = self._log(pod.metadata.name, timestamps=True, since_seconds=int(max(60, 4 * poll_s)))
            except Exception:  # the pod may be between restarts; the next poll reads it
                continue
            for line in text.splitlines():
                stamp, _, message = line.partition(" ")
                key = sortable_timestamp(stamp)
                if key > self._last_log_stamp:
                    self._last_log_stamp = key
                    self.out(f"[chief] {message}")

    def _log(self, pod_name: str, **options) -> str:
        # Raw bytes: the client would otherwise parse a log that happens to be JSON.
        response = self.core.read_namespaced_pod_log(
            pod_name, self.namespace, container=TFJOB_CONTAINER, _preload_content=False, **options)
        return response.data.decode("utf-8", errors="replace")

    def events(self, pods: list[Any]) -> list[str]:
        """Warning and normal events of the job and its pods, oldest first."""
        names = [self.name] + [pod.metadata.name for pod in pods]
        found = []
        for object_name in names:
            listed = self.core.list_namespaced_event(
                self.namespace, field_selector=f"involvedObject.name={object_name}").items
            for event in listed:
                when = event.last_timestamp or event.event_time or event.metadata.creation_timestamp
                found.append((str(when), f"{when} {event.type} {object_name} {event.reason}: {event.message}"))
        return [text for _, text in sorted(found)]

    def failure_report(self, tail_lines: int = 30) -> None:
        """What a user needs to see after a failure: events, then each replica's last lines."""
        pods = self.pods()
        self.out(f"--- events of {self.name} and its pods ---")
        for line in self.events(pods):
            self.out(line)
        for pod in pods:
            exit_codes = [str(status.state.terminated.exit_code) for status in (pod.status.container_statuses or [])
                          if status.state and status.state.terminated]
            self.out(f"--- {pod.metadata.name} ({pod.status.phase}, exit code {', '.join(exit_codes) or 'none'}), "
                     f"last {tail_lines} log lines ---")
            try:
                self.out(self._log(pod.metadata.name, tail_lines=tail_lines).rstrip())
            except Exception as error:
                self.out(f"(no logs: {error})")

    def chief_status(self, service: str, port_name: str = "status") -> dict[str, Any] | None:
        """The chief's /status JSON through the API server's service proxy; None if unreachable."""
        try:
            response = self.core.connect_get_namespaced_service_proxy_with_path(
                f"{service}:{port_name}", self.namespace, "status", _preload_content=False)
            return json.loads(response.data)
        except Exception:  # not running yet, or finished: the caller says so
            return None
