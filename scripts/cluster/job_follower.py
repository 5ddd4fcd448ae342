"""Follows a submitted job (TFJob, JobSet or TrainJob, through its engine): conditions as they change, the chief's
log lines, the outcome, and on failure the events and the last log lines of every replica."""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from typing import Any

from scripts.common.job_engine import Engine, JobView, api_message

FINISHED = ("Succeeded", "Failed")
# How long one API call may keep failing transiently before following gives up, and the back-off between tries.
RETRY_BUDGET_S, FIRST_RETRY_S, LONGEST_RETRY_S = 300.0, 1.0, 30.0


class LostContact(Exception):
    """An API call failed for good (not transient, or transient for longer than the budget); the job may run on."""


def _chain(error: BaseException):
    """The error and what caused it: the SDK wraps the client's ApiException in RuntimeError/TimeoutError."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def api_status(error: BaseException) -> int | None:
    """The HTTP status of the API server's answer behind an error, None if no answer came."""
    from kubernetes.client.exceptions import ApiException

    return next((cause.status for cause in _chain(error) if isinstance(cause, ApiException) and cause.status), None)


def transient_reason(error: BaseException) -> str | None:
    """Why a failed call is worth repeating: HTTP 5xx or 429, a connection error or a timeout. None otherwise
    (401/403/404/409 and other answers, TLS and configuration errors are not transient)."""
    import urllib3.exceptions

    status = api_status(error)
    if status is not None:
        return describe(error) if status == 429 or status >= 500 else None
    causes = list(_chain(error))
    if any(isinstance(cause, urllib3.exceptions.SSLError) for cause in causes):
        return None
    for cause in causes:
        if isinstance(cause, urllib3.exceptions.MaxRetryError) and isinstance(
            cause.reason, urllib3.exceptions.SSLError
        ):
            return None
        if isinstance(
            cause,
            (
                ConnectionError,
                TimeoutError,
                urllib3.exceptions.ProtocolError,
                urllib3.exceptions.MaxRetryError,
                urllib3.exceptions.TimeoutError,
            ),
        ):
            return describe(cause)
    return None


def api_errors() -> tuple[type[BaseException], ...]:
    """What a call through the Kubernetes client raises when the server answers an error or cannot be reached."""
    import urllib3.exceptions
    from kubernetes.client.exceptions import ApiException

    return ApiException, urllib3.exceptions.HTTPError, OSError


def describe(error: BaseException) -> str:
    """One line: the server's status and message when it answered, else the error's first line."""
    from kubernetes.client.exceptions import ApiException

    for cause in _chain(error):
        if isinstance(cause, ApiException) and cause.status:
            message = api_message(cause)
            return f"HTTP {cause.status} {cause.reason or ''}".rstrip() + (f": {message}" if message else "")
    return f"{type(error).__name__}: " + (str(error).splitlines() or [""])[0]


def sortable_timestamp(stamp: str) -> str:
    """Kubelet log timestamps (RFC 3339, trailing zeros trimmed) made comparable as strings."""
    base, _, fraction = stamp.rstrip("Z").partition(".")
    return f"{base}.{fraction.ljust(9, '0')}"


class JobFollower:
    """Reads one job through its engine's client and its pods through the Kubernetes API."""

    def __init__(
        self,
        engine: Engine,
        core_api,
        out: Callable[[str], None] = print,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
        retry_budget_s: float = RETRY_BUDGET_S,
    ):
        self.engine = engine
        self.core = core_api
        self.name = engine.name
        self.namespace = engine.namespace
        self.kind = engine.kind
        self.out = out
        self.sleep = sleep
        self.clock = clock
        self.retry_budget_s = retry_budget_s
        self._shown_conditions: set[tuple] = set()
        self._last_log_stamp = ""

    def call(self, what: str, function: Callable[..., Any], *args, **kwargs) -> Any:
        """function(*args, **kwargs), repeated with back-off while it fails transiently (transient_reason), for at
        most retry_budget_s; LostContact when it fails otherwise or for longer."""
        first_failure, delay = None, FIRST_RETRY_S
        while True:
            try:
                return function(*args, **kwargs)
            except Exception as error:
                reason = transient_reason(error)
                if reason is None:
                    raise LostContact(f"{what} failed: {describe(error)}") from error
                now = self.clock()
                first_failure = now if first_failure is None else first_failure
                if now - first_failure >= self.retry_budget_s:
                    raise LostContact(f"{what} kept failing for {now - first_failure:.0f} s: {reason}") from error
                self.out(f"[{self.name}] {what} failed ({reason}); retrying in {delay:.0f} s")
                self.sleep(delay)
                delay = min(2 * delay, LONGEST_RETRY_S)

    def job(self) -> JobView:
        return self.call(f"reading {self.kind} {self.name}", self.engine.read)

    def conditions(self, job: JobView | None = None) -> list[Any]:
        return list((job or self.job()).conditions)

    def current_state(self) -> str | None:
        """None when no job of this name exists, else Deleting (being deleted), Succeeded, Failed or Running
        (not finished yet)."""
        try:
            job = self.job()
        except LostContact as lost:
            if api_status(lost) == 404:
                return None
            raise
        if job.deleting:
            return "Deleting"
        return self.finished_state(job.conditions) or "Running"

    def finished_state(self, conditions: list[Any]) -> str | None:
        return self.engine.finished_state(conditions)

    def delete(self) -> None:
        self.call(f"deleting {self.kind} {self.name}", self.engine.delete)

    def follow(self, timeout_s: float = 0, poll_s: float = 5.0) -> str:
        """Prints progress until the job finishes; returns Succeeded, Failed or Timeout (timeout_s > 0).
        Transient API errors are retried (call); LostContact when the API stays unreachable."""
        started = self.clock()
        while True:
            conditions = self.conditions()
            self._print_new_conditions(conditions)
            self._print_unschedulable()
            self._print_chief_logs(poll_s)
            state = self.finished_state(conditions)
            if state:
                return state
            if timeout_s and self.clock() - started > timeout_s:
                return "Timeout"
            self.sleep(poll_s)

    def _print_new_conditions(self, conditions: list[Any]) -> None:
        for condition in conditions:
            key = (condition.type, condition.status, condition.reason, str(condition.last_transition_time))
            if key in self._shown_conditions or condition.status != "True":
                continue
            self._shown_conditions.add(key)
            self.out(f"[{self.name}] {condition.type}: {condition.message or condition.reason}")

    def _print_unschedulable(self) -> None:
        """Once per pod and reason: a pod the scheduler cannot place, which would otherwise wait in silence."""
        for pod in self.pods():
            for condition in pod.status.conditions or []:
                if (condition.type, condition.status, condition.reason) != ("PodScheduled", "False", "Unschedulable"):
                    continue
                key = ("Unschedulable", pod.metadata.name, condition.message)
                if key in self._shown_conditions:
                    continue
                self._shown_conditions.add(key)
                self.out(
                    f"[{self.name}] pod {pod.metadata.name} cannot be scheduled: {condition.message} It waits until "
                    "the nodes have room: free some, or lower WORKER_CPU_REQUEST (and PS_EVALUATOR_CPU_REQUEST, "
                    "DATA_CPU_REQUEST) in k8s/base/settings.env"
                )

    def pods(self, chief_only: bool = False) -> list[Any]:
        selector = self.engine.chief_selector() if chief_only else self.engine.pod_selector()
        pods = self.call(
            f"listing the pods of {self.name}", self.core.list_namespaced_pod, self.namespace, label_selector=selector
        ).items
        return sorted(pods, key=lambda pod: pod.metadata.name)

    def services(self) -> list[Any]:
        """The services the controller made for this job (not the project's own status Service)."""
        return self.call(
            f"listing the services of {self.name}",
            self.core.list_namespaced_service,
            self.namespace,
            **self.engine.service_query(),
        ).items

    def _print_chief_logs(self, poll_s: float) -> None:
        for pod in self.pods(chief_only=True):
            if pod.status.phase == "Pending":
                continue
            try:
                text = self._log(pod.metadata.name, timestamps=True, since_seconds=int(max(60, 4 * poll_s)))
            except api_errors():  # the pod may be between restarts; the next poll reads it
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
            pod_name, self.namespace, container=self.engine.container, _preload_content=False, **options
        )
        return response.data.decode("utf-8", errors="replace")

    def events(self, pods: list[Any]) -> list[str]:
        """Warning and normal events of the job and its pods, oldest first."""
        names = [self.name] + [pod.metadata.name for pod in pods]
        found = []
        for object_name in names:
            listed = self.core.list_namespaced_event(
                self.namespace, field_selector=f"involvedObject.name={object_name}"
            ).items
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
            exit_codes = [
                str(status.state.terminated.exit_code)
                for status in (pod.status.container_statuses or [])
                if status.state and status.state.terminated
            ]
            self.out(
                f"--- {pod.metadata.name} ({pod.status.phase}, exit code {', '.join(exit_codes) or 'none'}), "
                f"last {tail_lines} log lines ---"
            )
            try:
                self.out(self._log(pod.metadata.name, tail_lines=tail_lines).rstrip())
            except api_errors() as error:
                self.out(f"(no logs: {error})")

    def lost_nodes(self, pods: list[Any]) -> dict[str, str]:
        """The nodes PODS run on that are not Ready, each with its Ready condition; none when nodes cannot be read."""
        lost = {}
        for name in sorted({pod.spec.node_name for pod in pods if pod.spec.node_name}):
            try:
                node = self.core.read_node(name)
            except api_errors():
                return {}  # a namespace's user may not read nodes: nothing to say
            ready = next((c for c in node.status.conditions or [] if c.type == "Ready"), None)
            if ready is None:
                lost[name] = "no Ready condition"
            elif ready.status != "True":
                lost[name] = f"Ready={ready.status} since {ready.last_transition_time}: {ready.message}"
        return lost

    def chief_status(self, port_name: str = "status") -> dict[str, Any] | None:
        """The chief's /status JSON; None while no chief runs or it does not answer yet."""
        try:
            running = [pod for pod in self.pods(chief_only=True) if pod.status.phase == "Running"]
        except LostContact:
            return None
        for pod in running[:1]:
            for container in pod.spec.containers:
                for port in container.ports or []:
                    if port.name == port_name:
                        return pod_status(self.core, self.namespace, pod.metadata.name, port.container_port)
        return None


def pod_status(core: Any, namespace: str, pod: str, port: int, timeout_s: float = 10.0) -> dict[str, Any] | None:
    """GET /status from a pod's port through a port-forward, None if it does not answer with JSON. The pod's kubelet
    connects inside the pod's network: the API server's own route to another node's pods, which a NetworkPolicy
    meets as a stranger, is not taken (the service proxy's is)."""
    from kubernetes.stream import portforward
    from websocket import WebSocketException

    try:
        forward = portforward(core.connect_get_namespaced_pod_portforward, pod, namespace, ports=str(port))
        connection = http.client.HTTPConnection("localhost")
        connection.sock = forward.socket(port)
        connection.sock.settimeout(timeout_s)
        try:
            connection.request("GET", "/status")
            response = connection.getresponse()
            return json.loads(response.read()) if response.status == 200 else None
        finally:
            connection.close()
            forward.close()
    except (*api_errors(), WebSocketException, http.client.HTTPException, ValueError):
        return None  # not running yet, or finished: the caller says so
