"""make submit's order on reruns and its following through API errors.

No cluster runs here: a local HTTP server plays the API server's answers (TFJobs, pods, services, logs) and
the real Kubeflow SDK (TrainingClient) and kubernetes client (CoreV1Api) talk to it, so requests and answers go
through the SDK's and the client's own models and error wrapping. The fake deletes the way the API server's
garbage collector does: Foreground keeps the TFJob until its pods and services are gone, Background (the
default for custom resources) removes the TFJob at once and its pods later. Time is a fake clock.
"""

from __future__ import annotations

import socket
import subprocess
import threading

import pytest
import yaml

import fake_api_server
from fake_api_server import DROP, FakeClock
from k8s.engines.tfjob.cluster import TFJobEngine
from scripts.cluster import job_follower, submit
from scripts.cluster import steps as cluster_steps
from scripts.common import job_engine
from scripts.common import settings as project_settings

SETTINGS = project_settings.load()
NAME, NAMESPACE = SETTINGS["JOB_NAME"], SETTINGS["NAMESPACE"]
JOB_PATH = f"/apis/kubeflow.org/v1/namespaces/{NAMESPACE}/tfjobs/{NAME}"
JOBS_PATH = f"/apis/kubeflow.org/v1/namespaces/{NAMESPACE}/tfjobs"
PODS_PATH, SERVICES_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods", f"/api/v1/namespaces/{NAMESPACE}/services"


def tfjob(state: str) -> dict:
    conditions = [
        {"type": "Created", "status": "True", "reason": "TFJobCreated"},
        {"type": "Running", "status": "False" if state != "Running" else "True", "reason": "TFJobRunning"},
    ]
    if state != "Running":
        conditions.append({"type": state, "status": "True", "reason": f"TFJob{state}", "message": f"job {state}"})
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": NAME, "namespace": NAMESPACE},
        "spec": {"runPolicy": {}, "tfReplicaSpecs": {"Worker": {"replicas": 2}}},
        "status": {"conditions": conditions},
    }


def status(code: int, reason: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason}


class FakeAPIServer:
    """The API server's answers for one TFJob. `failures[path]` answers (status codes or DROP) come first, one per
    request; `runs_for` GETs of a created job see it Running, then Succeeded."""

    def __init__(self, job: dict | None = None, pods_gone_after: float = 2, runs_for: int = 2):
        self.job = job
        self.pods = [f"{NAME}-worker-0", f"{NAME}-worker-1"] if job else []
        self.services = list(self.pods)
        self.pods_gone_after = pods_gone_after  # pod listings after a delete until the garbage collector is done
        self.runs_for = runs_for
        self.deleting = False
        self.failures: dict[str, list] = {}
        self.log: list[tuple[str, str]] = []
        self.delete_bodies: list[dict | None] = []
        self.at_create: dict | None = None
        self.pod_status: dict[str, dict] = {}  # a pod's status other than Running, by name
        self.lock = threading.Lock()

    def answer(self, method: str, path: str, body: dict | None) -> tuple[int, object] | str:
        with self.lock:
            self.log.append((method, path))
            queued = self.failures.get(path) or []
            if queued:
                failure = queued.pop(0)
                return failure if failure == DROP else (failure, status(failure, "Failure"))
            if path == JOB_PATH and method == "GET":
                return self._get_job()
            if path == JOB_PATH and method == "DELETE":
                self.delete_bodies.append(body)
                if self.job is None:
                    return 404, status(404, "NotFound")
                self.deleting = True
                if (body or {}).get("propagationPolicy") != "Foreground":
                    job, self.job = self.job, None  # Background: the TFJob goes now, its pods later
                    return 200, job
                self.job["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                return 200, self.job
            if path == JOBS_PATH and method == "POST":
                if self.job is not None:
                    return 409, status(409, "AlreadyExists")
                self.at_create = {"pods": list(self.pods), "services": list(self.services)}
                self.job, self.deleting = {**body, "status": {"conditions": []}}, False
                self.pods = self.services = [f"{NAME}-worker-0"]
                return 201, body
            if path in (PODS_PATH, SERVICES_PATH):
                return fake_api_server.list_pods_or_services(self, path, PODS_PATH, self.pod)
            if path.startswith(PODS_PATH + "/") and path.endswith("/log"):
                return 200, "2026-01-01T00:00:00Z step 1\n"
            return 404, status(404, "NotFound")

    def pod(self, name: str) -> dict:
        return {"metadata": {"name": name}, "status": self.pod_status.get(name, {"phase": "Running"})}

    def _get_job(self) -> tuple[int, object]:
        if self.job is None:
            return 404, status(404, "NotFound")
        if self.deleting and not self.pods and not self.services:
            self.job = None  # Foreground: the TFJob goes once its dependents are gone
            return 404, status(404, "NotFound")
        if not self.deleting and not self.job["status"]["conditions"]:  # a job this test created
            self.runs_for -= 1
            if self.runs_for < 0:
                return 200, {**self.job, "status": tfjob("Succeeded")["status"]}
            return 200, {**self.job, "status": tfjob("Running")["status"]}
        return 200, self.job


def serve(api: FakeAPIServer):
    return fake_api_server.serve(lambda method, path, query, body: api.answer(method, path, body))


def follower_at(port: int, clock: FakeClock, lines: list[str]) -> job_follower.JobFollower:
    import kubernetes.client
    from kubeflow.training import TrainingClient

    configuration = kubernetes.client.Configuration(host=f"http://127.0.0.1:{port}")
    training = TrainingClient(client_configuration=configuration, job_kind="TFJob", namespace=NAMESPACE)
    core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))
    engine = TFJobEngine(training, NAME, NAMESPACE)
    return job_follower.JobFollower(engine, core, out=lines.append, sleep=clock.sleep, clock=clock, retry_budget_s=120)


@pytest.fixture
def cluster(monkeypatch):
    """submit.main against a fake API server; kubectl, k3d and the container tool are recorded, not run."""

    class Cluster:
        api = FakeAPIServer()
        clock = FakeClock()
        lines: list[str] = []
        commands: list[list[str]] = []

    def run(command, stdin=None, check=True, quiet=False):
        Cluster.commands.append(command)
        stdout = {
            "kubectl config get-contexts": f"k3d-{SETTINGS['CLUSTER_NAME']}\n",
            "kubectl get job": "Complete\n",
        }  # the data Job's conditions
        return subprocess.CompletedProcess(command, 0, stdout=stdout.get(" ".join(command[:3]), ""), stderr="")

    servers = []

    def follower(objects, namespace):
        assert job_engine.engine_kind(objects) == "TFJob"
        servers.append(serve(Cluster.api))
        return follower_at(servers[-1].server_port, Cluster.clock, Cluster.lines)

    monkeypatch.setattr(cluster_steps, "run", run)
    # The claim's check against the cluster: tests/tools/test_volume_claim.py.
    monkeypatch.setattr(cluster_steps, "check_volume_claim", lambda objects, namespace: None)
    monkeypatch.setattr(submit, "follower", follower)
    monkeypatch.setattr(submit, "container_tool", lambda: "docker")
    yield Cluster
    for server in servers:
        server.shutdown()


def cluster_changes(commands: list[list[str]]) -> list[str]:
    """The commands that change the cluster: the image import, applies, the data Job's delete and create."""
    return [
        " ".join(c[:3])
        for c in commands
        if c[:2] in (["k3d", "image"], ["kubectl", "apply"], ["kubectl", "delete"], ["kubectl", "create"])
    ]


def test_a_running_job_is_refused_before_the_image_import_or_the_data_job(cluster, capsys):
    cluster.api.job = tfjob("Running")
    code = submit.main(["--image", "img:1", "--dataset", "mnist"])
    assert code == submit.EXIT_CLUSTER
    assert f"TFJob {NAME} is still running" in capsys.readouterr().err
    assert cluster_changes(cluster.commands) == []
    assert ("POST", JOBS_PATH) not in cluster.api.log and cluster.api.delete_bodies == []


def test_a_tfjob_whose_create_meets_a_5xx_is_created_on_a_later_try_and_a_403_ends_submit_naming_it(cluster, capsys):
    cluster.api.failures = {JOBS_PATH: [500, DROP]}
    assert submit.main(["--image", "img:1", "--dataset", "synthetic"]) == submit.EXIT_SUCCEEDED
    assert [method for method, path in cluster.api.log if path == JOBS_PATH] == ["POST"] * 3
    cluster.api = FakeAPIServer()
    cluster.api.failures = {JOBS_PATH: [403]}
    assert submit.main(["--image", "img:1", "--dataset", "synthetic"]) == submit.EXIT_CLUSTER
    # Before, the SDK's "Failed to create TFJob ... Error: (403)" went out with the whole response dump after it.
    assert f"error: creating TFJob {NAME} failed: HTTP 403 Forbidden\n" in capsys.readouterr().err


def test_a_finished_job_goes_in_the_foreground_and_the_new_one_comes_after_its_pods_and_services(cluster, capsys):
    cluster.api = FakeAPIServer(job=tfjob("Succeeded"), pods_gone_after=3)
    code = submit.main(["--image", "img:1", "--dataset", "mnist"])
    out = capsys.readouterr().out
    assert code == submit.EXIT_SUCCEEDED, out
    (body,) = cluster.api.delete_bodies
    assert body["propagationPolicy"] == "Foreground"
    assert cluster.api.at_create == {"pods": [], "services": []}
    # The data Job and the image come before the old job is deleted; the old job's logs stay until then.
    assert cluster_changes(cluster.commands)[0] == "k3d image import"
    assert f"deleting the succeeded TFJob {NAME}" in out and f"created TFJob {NAME}" in out


def config_map_refs(value: object) -> set[str]:
    """The names of every ConfigMap an object's pods take their environment from (envFrom and valueFrom)."""
    if isinstance(value, dict):
        own = {value["configMapRef"]["name"]} if "configMapRef" in value else set()
        return own.union(*(config_map_refs(item) for item in value.values()))
    if isinstance(value, list):
        return set().union(*(config_map_refs(item) for item in value))
    return set()


def test_every_config_map_the_job_s_pods_read_is_applied_before_the_job(cluster, monkeypatch, capsys):
    # A real kubelet refuses to start a container whose envFrom ConfigMap does not exist (CreateContainerConfigError):
    # the local node showed submit never applied the settings ConfigMap.
    applied: list[dict] = []
    recorded = cluster_steps.run

    def run(command, stdin=None, check=True, quiet=False):
        if command[:2] == ["kubectl", "apply"] and stdin:
            applied.extend(obj for obj in yaml.safe_load_all(stdin) if obj)
        return recorded(command, stdin=stdin, check=check, quiet=quiet)

    monkeypatch.setattr(cluster_steps, "run", run)
    # The claim's check against the cluster: tests/tools/test_volume_claim.py.
    monkeypatch.setattr(cluster_steps, "check_volume_claim", lambda objects, namespace: None)
    assert submit.main(["--image", "img:1", "--dataset", "synthetic"]) == submit.EXIT_SUCCEEDED, capsys.readouterr()
    wanted = config_map_refs(cluster.api.job)
    assert wanted, "the TFJob's pods read no ConfigMap: the test looks in the wrong place"
    assert wanted <= {obj["metadata"]["name"] for obj in applied if obj["kind"] == "ConfigMap"}


@pytest.mark.parametrize("policy", ["Foreground", "Background"])
def test_what_make_delete_left_terminating_is_waited_for_before_the_new_job(cluster, capsys, policy):
    cluster.api = FakeAPIServer(job=tfjob("Running"), pods_gone_after=2)
    cluster.api.answer("DELETE", JOB_PATH, {"propagationPolicy": policy})  # make delete, just before
    cluster.api.delete_bodies.clear()
    code = submit.main(["--image", "img:1", "--dataset", "synthetic"])
    out = capsys.readouterr().out
    assert code == submit.EXIT_SUCCEEDED, out
    assert f"waiting for what is left of an earlier TFJob {NAME} to go: pod/{NAME}-worker-0" in out
    assert cluster.api.at_create == {"pods": [], "services": []} and cluster.api.delete_bodies == []


def test_make_delete_deletes_in_the_foreground(cluster, capsys):
    cluster.api = FakeAPIServer(job=tfjob("Running"))
    assert submit.main(["--delete"]) == submit.EXIT_SUCCEEDED
    (body,) = cluster.api.delete_bodies
    assert body["propagationPolicy"] == "Foreground"


def test_an_earlier_job_whose_pods_do_not_go_stops_submit_before_creating_with_a_clear_message(
    cluster, capsys, monkeypatch
):
    monkeypatch.setattr(submit, "OLD_JOB_GONE_S", 20.0)
    cluster.api = FakeAPIServer(job=tfjob("Failed"), pods_gone_after=float("inf"))
    code = submit.main(["--image", "img:1", "--dataset", "synthetic"])
    err = capsys.readouterr().err
    assert code == submit.EXIT_CLUSTER
    assert f"the earlier TFJob {NAME} is not gone after {submit.OLD_JOB_GONE_S:.0f} s" in err
    assert f"pod/{NAME}-worker-0" in err and f"service/{NAME}-worker-1" in err and f"tfjob/{NAME}" in err
    assert ("POST", JOBS_PATH) not in cluster.api.log
    assert submit.OLD_JOB_GONE_S <= cluster.clock.now <= submit.OLD_JOB_GONE_S + submit.OLD_JOB_POLL_S


def test_following_rides_out_5xx_429_and_dropped_connections_until_the_job_ends():
    api = FakeAPIServer(job={**tfjob("Running"), "status": {"conditions": []}}, runs_for=3)
    api.failures = {
        JOB_PATH: [503, 429, DROP, DROP, DROP, DROP, 500, 502, 504],
        PODS_PATH: [503, DROP, DROP, DROP, DROP],
    }
    server, clock, lines = serve(api), FakeClock(), []
    try:
        state = follower_at(server.server_port, clock, lines).follow(poll_s=5)
    finally:
        server.shutdown()
    assert state == "Succeeded"
    retried = [line for line in lines if "retrying" in line]
    assert any("HTTP 503" in line for line in retried) and any("HTTP 429" in line for line in retried)
    assert any("MaxRetryError" in line or "ProtocolError" in line for line in retried)
    assert [line for line in lines if "[chief]" in line] == ["[chief] step 1"]
    assert api.failures == {JOB_PATH: [], PODS_PATH: []}


def test_a_pod_that_cannot_be_scheduled_is_named_once_with_the_scheduler_s_reason_and_the_setting_to_lower():
    api = FakeAPIServer(job={**tfjob("Running"), "status": {"conditions": []}}, runs_for=3)
    message = "0/1 nodes are available: 1 Insufficient cpu."
    api.pod_status = {
        f"{NAME}-worker-1": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}],
        }
    }
    server, clock, lines = serve(api), FakeClock(), []
    try:
        assert follower_at(server.server_port, clock, lines).follow(poll_s=5) == "Succeeded"
    finally:
        server.shutdown()
    unschedulable = [line for line in lines if "cannot be scheduled" in line]
    assert len(unschedulable) == 1, lines
    assert f"pod {NAME}-worker-1 cannot be scheduled: {message}" in unschedulable[0]
    assert "WORKER_CPU_REQUEST" in unschedulable[0]


def test_an_api_server_gone_for_longer_than_the_budget_ends_following_saying_the_job_may_run_on(cluster, capsys):
    cluster.api = FakeAPIServer()
    cluster.api.failures = {JOB_PATH: [404, 404] + [503] * 1000}  # none yet, then unreachable after the create
    code = submit.main(["--image", "img:1", "--dataset", "synthetic"])
    captured = capsys.readouterr()
    assert code == submit.EXIT_STILL_RUNNING
    assert f"reading TFJob {NAME} kept failing for" in captured.err and "HTTP 503" in captured.err
    assert f"TFJob {NAME} may still be running" in captured.out
    assert ("POST", JOBS_PATH) in cluster.api.log
    # Backed off, doubling to at most LONGEST_RETRY_S, for the budget and not much longer.
    assert cluster.clock.sleeps[:3] == [1, 2, 4] and max(cluster.clock.sleeps) == job_follower.LONGEST_RETRY_S
    assert 120 <= cluster.clock.now <= 120 + job_follower.LONGEST_RETRY_S


def test_connection_refused_is_transient_and_forbidden_is_not():
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]
    clock, lines = FakeClock(), []
    with pytest.raises(job_follower.LostContact, match="kept failing for .* s: MaxRetryError"):
        follower_at(closed_port, clock, lines).follow()
    assert clock.now >= 120

    api = FakeAPIServer(job=tfjob("Running"))
    api.failures = {JOB_PATH: [403]}
    server, clock = serve(api), FakeClock()
    try:
        with pytest.raises(job_follower.LostContact, match=f"reading TFJob {NAME} failed: HTTP 403"):
            follower_at(server.server_port, clock, []).follow()
    finally:
        server.shutdown()
    assert clock.sleeps == []


def test_make_status_says_a_tfjob_fails_once_a_lost_nodes_pods_are_freed_and_make_submit_resumes_it():
    advice = submit.lost_node_advice("node-2", "NodeStatusUnknown", ["pod-0"], TFJobEngine(None, NAME, NAMESPACE))
    assert "The TFJob then fails: make submit again resumes from the last checkpoint" in advice, advice
