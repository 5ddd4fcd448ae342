"""make submit under JobSet and TrainJob, against a local fake of the API server behind the real clients.

As tests/tools/test_submit_api.py does for the TFJob: no cluster runs here; a local HTTP server plays the API
server's answers and the real clients talk to it, through their own models and error wrapping: the Kubernetes
client's CustomObjectsApi for the JobSet, the kubeflow SDK's TrainerClient (its train() reads the runtime and posts
the TrainJob) for the TrainJob, CoreV1Api for pods, services and logs. The fake deletes as the garbage collector does
(Foreground keeps the job until its pods and services are gone, Background removes it at once) and reports the
conditions each controller writes: JobSet `Completed`/`Failed` (api/jobset/v1alpha2/jobset_types.go at v0.12.0),
TrainJob `Complete`/`Failed` (pkg/apis/trainer/v1alpha1/trainjob_types.go at v2.3.0). Time is a fake clock.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import threading

import pytest
import yaml

import crd_schemas
import engines_here
import fake_api_server
from fake_api_server import DROP, FakeClock
from scripts.cluster import job_follower, submit
from scripts.cluster import steps as cluster_steps
from scripts.common import job_engine
from scripts.common import manifest as tfjob_manifest
from scripts.common import settings as project_settings

SETTINGS = project_settings.load()
NAMESPACE = SETTINGS["NAMESPACE"]
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "engines"
# The objects every kustomization renders beside the job, which submit applies first.
VOLUME = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": SETTINGS["VOLUME_CLAIM"]}}
STATUS_SERVICE = {
    "apiVersion": "v1",
    "kind": "Service",
    "metadata": {"name": f"{SETTINGS['JOB_NAME']}-status", "labels": {"app.kubernetes.io/component": "training"}},
}


def rendered(fixture: str) -> list[dict]:
    objects = [doc for doc in yaml.safe_load_all((FIXTURES / fixture).read_text()) if doc]
    return [VOLUME, STATUS_SERVICE, *objects]


# The optional engines' kinds this checkout holds (a fork may have deleted their folders, k8s/engines/).
KINDS = {
    "JobSet": {
        "fixture": "jobset-async.yaml",
        "collection": f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{NAMESPACE}/jobsets",
        "done": "Completed",
    },
    "TrainJob": {
        "fixture": "trainjob-sync.yaml",
        "collection": f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NAMESPACE}/trainjobs",
        "done": "Complete",
    },
}
KINDS = {kind: facts for kind, facts in KINDS.items() if kind in tfjob_manifest.ENGINE_KINDS}
PODS_PATH, SERVICES_PATH = f"/api/v1/namespaces/{NAMESPACE}/pods", f"/api/v1/namespaces/{NAMESPACE}/services"
EVENTS_PATH = f"/api/v1/namespaces/{NAMESPACE}/events"
RUNTIMES_PATH = f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{NAMESPACE}/trainingruntimes"
TRAINER_CONFIGMAP = "/api/v1/namespaces/kubeflow-system/configmaps/kubeflow-trainer-public"


def status(code: int, reason: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason}


def condition(kind: str, state: str) -> list[dict]:
    """The conditions of a job that is Running (none that ends it), done, or Failed, with every field a
    metav1.Condition requires (the trainer-api model refuses one without)."""
    kind_type = {"Running": "Suspended", "done": KINDS[kind]["done"]}.get(state, "Failed")
    return [
        {
            "type": kind_type,
            "status": "False" if state == "Running" else "True",
            "reason": f"{kind}{state}",
            "message": f"{kind} {state}",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
    ]


class FakeAPIServer:
    """The API server's answers for one JobSet or TrainJob (and, for the TrainJob, its runtime). `failures[path]`
    answers come first, one per request; a job this test created is Running for `runs_for` GETs, then ends `ends`."""

    def __init__(self, kind: str, job: dict | None = None, runs_for: int = 2, ends: str = "done", pods_gone_after=2):
        self.kind = kind
        self.name = SETTINGS["JOB_NAME"]
        self.job_path = f"{KINDS[kind]['collection']}/{self.name}"
        self.job = job
        self.runs_for, self.ends = runs_for, ends
        self.pods = [f"{self.name}-chief-0-0", f"{self.name}-worker-0-1"] if job else []
        self.services = [self.name] if job else []
        self.pods_gone_after = pods_gone_after
        self.deleting = False
        self.runtime: dict | None = None
        self.failures: dict[str, list] = {}
        self.log: list[tuple[str, str, str]] = []
        self.created: dict | None = None
        self.delete_bodies: list[dict | None] = []
        self.at_create: dict | None = None
        self.lock = threading.Lock()

    def answer(self, method: str, path: str, query: str, body) -> tuple[int, object] | str:
        with self.lock:
            self.log.append((method, path, query))
            queued = self.failures.get(path) or []
            if queued:
                failure = queued.pop(0)
                if failure == DROP or isinstance(failure, tuple):  # a dropped connection, or (code, body) as given
                    return failure
                return failure, status(failure, "Failure")
            if path == self.job_path and method == "GET":
                return self._get_job()
            if path == self.job_path and method == "DELETE":
                self.delete_bodies.append(body)
                if self.job is None:
                    return 404, status(404, "NotFound")
                self.deleting = True
                if (body or {}).get("propagationPolicy") != "Foreground":
                    job, self.job = self.job, None
                    return 200, job
                self.job["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
                return 200, self.job
            if path == KINDS[self.kind]["collection"] and method == "POST":
                if self.job is not None:
                    return 409, status(409, "AlreadyExists")
                self.at_create = {"pods": list(self.pods), "services": list(self.services)}
                self.created = body
                stored = {**body, "metadata": {**body["metadata"], "namespace": NAMESPACE}}
                stored["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"
                self.job, self.deleting = {**stored, "status": {"conditions": []}}, False
                self.pods, self.services = [f"{self.name}-chief-0-0"], [self.name]
                return 201, stored
            if path == f"{RUNTIMES_PATH}/{(self.runtime or {}).get('metadata', {}).get('name')}" and method == "GET":
                return 200, self.runtime
            if path == TRAINER_CONFIGMAP:
                return 200, {"kind": "ConfigMap", "data": {"kubeflow_trainer_version": "v2.3.0"}}
            if path in (PODS_PATH, SERVICES_PATH):
                return fake_api_server.list_pods_or_services(self, path, PODS_PATH, self._pod)
            if path == EVENTS_PATH:
                return 200, {"kind": "List", "apiVersion": "v1", "metadata": {}, "items": []}
            if path.startswith(PODS_PATH + "/") and path.endswith("/log"):
                return 200, "2026-01-01T00:00:00Z step 1\n"
            return 404, status(404, "NotFound")

    def _pod(self, name: str) -> dict:
        # The labels JobSet and Indexed Jobs set, and a `node` container: what the SDK reads of a TrainJob's pods.
        return {
            "metadata": {
                "name": name,
                "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {
                    engines_here.part("jobset", "cluster").JOBSET_NAME_LABEL: self.name,
                    engines_here.part("jobset", "cluster").REPLICATED_JOB_LABEL: "node",
                    engines_here.part("jobset", "cluster").COMPLETION_INDEX_LABEL: "0",
                },
            },
            "spec": {"containers": [{"name": "node", "image": "img:1"}]},
            "status": {"phase": "Running"},
        }

    def _get_job(self) -> tuple[int, object]:
        if self.job is None:
            return 404, status(404, "NotFound")
        if self.deleting and not self.pods and not self.services:
            self.job = None
            return 404, status(404, "NotFound")
        if not self.deleting and not self.job["status"]["conditions"]:  # a job this test created
            self.runs_for -= 1
            state = "Running" if self.runs_for >= 0 else self.ends
            return 200, {**self.job, "status": {"conditions": condition(self.kind, state)}}
        return 200, self.job


def serve(api: FakeAPIServer):
    return fake_api_server.serve(api.answer)


def engine_at(port: int, objects: list[dict]) -> job_engine.Engine:
    """The engine submit builds, its real client pointed at the fake."""
    import kubernetes.client

    configuration = kubernetes.client.Configuration(host=f"http://127.0.0.1:{port}")
    kind = job_engine.engine_kind(objects)
    if kind == "JobSet":
        custom = kubernetes.client.CustomObjectsApi(kubernetes.client.ApiClient(configuration))
        return engines_here.part("jobset", "cluster").JobSetEngine.of(
            custom, tfjob_manifest.the_one(objects, "JobSet"), NAMESPACE
        )
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient

    client = TrainerClient(KubernetesBackendConfig(namespace=NAMESPACE, client_configuration=configuration))
    return engines_here.part("trainjob", "cluster").TrainJobEngine.of(client, objects, NAMESPACE)


def follower_at(port: int, objects: list[dict], clock: FakeClock, lines: list[str]) -> job_follower.JobFollower:
    import kubernetes.client

    configuration = kubernetes.client.Configuration(host=f"http://127.0.0.1:{port}")
    core = kubernetes.client.CoreV1Api(kubernetes.client.ApiClient(configuration))
    return job_follower.JobFollower(
        engine_at(port, objects), core, out=lines.append, sleep=clock.sleep, clock=clock, retry_budget_s=120
    )


@pytest.fixture(params=sorted(KINDS))
def cluster(request, monkeypatch):
    """submit against a fake API server for one engine; kubectl, k3d and the container tool are recorded, not run."""
    kind = request.param

    class Cluster:
        objects = rendered(KINDS[kind]["fixture"])
        job = next(obj for obj in objects if obj["kind"] == kind)
        api = FakeAPIServer(kind)
        clock = FakeClock()
        lines: list[str] = []
        commands: list[tuple[list[str], str | None]] = []

    Cluster.kind = kind

    def run(command, stdin=None, check=True, quiet=False):
        Cluster.commands.append((command, stdin))
        if command[:2] == ["kubectl", "apply"]:  # what a server-side apply of the runtime leaves on the server
            for doc in yaml.safe_load_all(stdin or ""):
                if doc and doc.get("kind") == "TrainingRuntime":
                    Cluster.api.runtime = doc
        stdout = {"kubectl config get-contexts": f"k3d-{SETTINGS['CLUSTER_NAME']}\n"}
        return subprocess.CompletedProcess(command, 0, stdout=stdout.get(" ".join(command[:3]), ""), stderr="")

    servers = []

    def follower(objects, namespace):
        servers.append(serve(Cluster.api))
        return follower_at(servers[-1].server_port, objects, Cluster.clock, Cluster.lines)

    monkeypatch.setattr(cluster_steps, "run", run)
    # The claim's check against the cluster: tests/tools/test_volume_claim.py.
    monkeypatch.setattr(cluster_steps, "check_volume_claim", lambda objects, namespace: None)
    monkeypatch.setattr(submit, "follower", follower)
    monkeypatch.setattr(submit, "container_tool", lambda: "docker")
    monkeypatch.setattr(tfjob_manifest, "render", lambda *args, **kwargs: Cluster.objects)
    yield Cluster
    for server in servers:
        server.shutdown()


def submit_args(**overrides) -> argparse.Namespace:
    values = {"namespace": NAMESPACE, "image": "img:1", "dataset": "synthetic", "tensorboard": False, "timeout": 0}
    return argparse.Namespace(**{**values, "workers": 2, **overrides})


def cluster_changes(commands) -> list[str]:
    return [" ".join(c[:3]) for c, _ in commands if c[:2] in (["k3d", "image"], ["kubectl", "apply"])]


def existing(cluster, state: str) -> dict:
    job = json.loads(json.dumps(cluster.job))
    job["metadata"]["namespace"] = NAMESPACE
    return {**job, "status": {"conditions": condition(cluster.kind, state)}}


def test_a_running_job_is_refused_before_the_image_import_or_any_apply(cluster):
    cluster.api = FakeAPIServer(cluster.kind, job=existing(cluster, "Running"))
    with pytest.raises(cluster_steps.StepError, match=f"{cluster.kind} {SETTINGS['JOB_NAME']} is still running"):
        submit.submit(cluster.objects, submit_args())
    assert cluster_changes(cluster.commands) == []
    assert cluster.api.created is None and cluster.api.delete_bodies == []


def test_a_finished_job_goes_in_the_foreground_and_the_new_one_comes_after_its_pods_and_service(cluster, capsys):
    cluster.api = FakeAPIServer(cluster.kind, job=existing(cluster, "done"), pods_gone_after=3)
    assert submit.submit(cluster.objects, submit_args()) == submit.EXIT_SUCCEEDED
    out = capsys.readouterr().out
    (body,) = cluster.api.delete_bodies
    assert body["propagationPolicy"] == "Foreground"
    assert cluster.api.at_create == {"pods": [], "services": []}
    assert f"deleting the succeeded {cluster.kind} {SETTINGS['JOB_NAME']}" in out
    assert f"{cluster.kind} {SETTINGS['JOB_NAME']} succeeded" in out
    # The headless service is looked up by its name (the subdomain), the chief by JobSet's and Kubernetes' labels.
    queries = [query for method, path, query in cluster.api.log if path in (SERVICES_PATH, PODS_PATH)]
    assert f"fieldSelector=metadata.name={SETTINGS['JOB_NAME']}" in queries
    chief = [q for q in queries if engines_here.part("jobset", "cluster").COMPLETION_INDEX_LABEL in q]
    assert chief and all(f"{engines_here.part('jobset', 'cluster').JOB_INDEX_LABEL}=0" in q for q in chief)
    assert "[chief] step 1" in cluster.lines


def test_the_created_job_is_the_rendered_one(cluster):
    cluster.api = FakeAPIServer(cluster.kind)
    assert submit.submit(cluster.objects, submit_args()) == submit.EXIT_SUCCEEDED
    sent = cluster.api.created
    if cluster.kind == "JobSet":
        assert sent == cluster.job
    else:
        # The SDK's body and the rendered TrainJob (with the runtime's image, which CustomTrainerContainer must carry)
        # are stored alike once the API server applies the CRD's defaults; submit --dry-run prints the latter.
        runtime = engines_here.part("trainjob", "local_run").runtime_of(cluster.objects)
        expected = engines_here.part("trainjob", "cluster").sdk_request_body(cluster.job, runtime)
        assert crd_schemas.with_defaults(sent) == crd_schemas.with_defaults(expected)
        assert sent["spec"]["trainer"]["image"] == engines_here.part("trainjob", "cluster").runtime_trainer_image(
            runtime
        )
        dry = submit.request_body(cluster.objects, NAMESPACE)
        assert dry == {
            **engines_here.part("trainjob", "cluster").sdk_request_body(cluster.job, runtime),
            "metadata": {**sent["metadata"], "namespace": NAMESPACE},
        }
    crd_schemas.validate(sent)


@engines_here.needs("trainjob")
@pytest.mark.parametrize("cluster", ["TrainJob"], indirect=True)
def test_a_trainjobs_runtime_is_applied_before_the_trainjob_is_created(cluster):
    cluster.api = FakeAPIServer(cluster.kind)
    submit.submit(cluster.objects, submit_args())
    applied = [yaml.safe_load_all(stdin) for command, stdin in cluster.commands if command[:2] == ["kubectl", "apply"]]
    kinds = [doc["kind"] for docs in applied for doc in docs if doc]
    assert "TrainingRuntime" in kinds
    # The SDK read the runtime from the server (it refuses a runtime it cannot find) before posting the TrainJob.
    reads = [i for i, (m, path, _) in enumerate(cluster.api.log) if path.startswith(RUNTIMES_PATH)]
    post = next(i for i, (m, path, _) in enumerate(cluster.api.log) if m == "POST")
    assert reads and reads[0] < post


def webhook_denial(message: str) -> tuple[int, dict]:
    """What the API server answers when Trainer's validating webhook refuses a TrainJob (controller-runtime's
    admission.Denied: 403 Forbidden, the field errors in the message)."""
    name = "validator.trainjob.trainer.kubeflow.org"
    body = {**status(403, "Forbidden"), "message": f'admission webhook "{name}" denied the request: {message}'}
    return 403, body


# Trainer v2.3.0's refusal of a TrainJob whose runtime its controller's cache has not seen (ValidateObjects), as
# NVIDIA/aicr#1669 quotes it from a cluster.
RUNTIME = f"{SETTINGS['JOB_NAME']}-tensorflow"
REF = f'{{"name":"{RUNTIME}","apiGroup":"trainer.kubeflow.org","kind":"TrainingRuntime"}}'
NOT_CACHED = webhook_denial(
    f'spec.runtimeRef: Invalid value: {REF}: TrainingRuntime.trainer.kubeflow.org "{RUNTIME}" not found: specified'
    " trainingRuntime must be created before the TrainJob is created"
)


def trainjob_engine_at(api: FakeAPIServer, clock: FakeClock):
    server = serve(api)
    objects = rendered(KINDS["TrainJob"]["fixture"])
    api.runtime = engines_here.part("trainjob", "local_run").runtime_of(objects)
    engine = engine_at(server.server_port, objects)
    engine.sleep, engine.clock = clock.sleep, clock
    return server, engine, objects


# The same refusal of a ClusterTrainingRuntime (pkg/runtime/core/clustertrainingruntime.go at v2.3.0).
CLUSTER_NOT_CACHED = webhook_denial(
    f'spec.runtimeRef: Invalid value: {REF}: ClusterTrainingRuntime.trainer.kubeflow.org "{RUNTIME}" not found:'
    " specified clusterTrainingRuntime must be created before the TrainJob is created"
)


@engines_here.needs("trainjob")
@pytest.mark.parametrize("refusal", [NOT_CACHED, CLUSTER_NOT_CACHED], ids=["TrainingRuntime", "ClusterTrainingRuntime"])
def test_a_trainjob_refused_while_trainers_cache_lacks_its_runtime_is_created_once_the_cache_has_it(refusal, capsys):
    api, clock = FakeAPIServer("TrainJob"), FakeClock()
    collection = KINDS["TrainJob"]["collection"]
    api.failures = {collection: [refusal, refusal]}
    server, engine, objects = trainjob_engine_at(api, clock)
    try:
        engine.create(objects)
    finally:
        server.shutdown()
    assert [method for method, path, _ in api.log if path == collection] == ["POST"] * 3
    assert api.created["metadata"]["name"] == SETTINGS["JOB_NAME"]
    # Said once, so the wait is not a silent minute.
    assert capsys.readouterr().out.count(f"Trainer's webhook has not seen runtime {RUNTIME} yet") == 1


@engines_here.needs("trainjob")
def test_a_runtime_trainers_cache_never_sees_ends_the_wait_with_the_webhooks_refusal():
    cluster_part = engines_here.part("trainjob", "cluster")
    api, clock = FakeAPIServer("TrainJob"), FakeClock()
    collection = KINDS["TrainJob"]["collection"]
    api.failures = {collection: [NOT_CACHED] * 1000}
    server, engine, objects = trainjob_engine_at(api, clock)
    try:
        with pytest.raises(RuntimeError) as refused:
            engine.create(objects)
    finally:
        server.shutdown()
    assert cluster_part.RUNTIME_CACHE_WAIT_S <= clock.now < cluster_part.RUNTIME_CACHE_WAIT_S + 2
    assert cluster_part.RUNTIME_NOT_CACHED in submit.with_cause(refused.value).lower()
    assert api.created is None


def test_a_job_a_webhook_refuses_ends_submit_with_exit_3_and_the_webhooks_reason_after_one_try(cluster, capsys):
    cluster.api = FakeAPIServer(cluster.kind)
    collection = KINDS[cluster.kind]["collection"]
    cluster.api.failures = {collection: [webhook_denial("spec.replicatedJobs: Invalid value: 0: must be positive")]}
    assert submit.main(["--image", "img:1", "--dataset", "synthetic"]) == submit.EXIT_CLUSTER
    err = capsys.readouterr().err
    assert [method for method, path, _ in cluster.api.log if path == collection] == ["POST"], err
    # Before, a TrainJob's ended on the SDK's bare "Failed to create TrainJob: <namespace>/<name>".
    assert f"creating {cluster.kind} {SETTINGS['JOB_NAME']} failed: HTTP 403 Forbidden" in err
    assert "spec.replicatedJobs: Invalid value: 0: must be positive" in err


def test_a_job_whose_create_meets_an_unreachable_webhook_is_created_on_a_later_try(cluster):
    cluster.api = FakeAPIServer(cluster.kind)
    collection = KINDS[cluster.kind]["collection"]
    unreachable = {
        **status(500, "InternalError"),
        "message": 'Internal error occurred: failed calling webhook "validator.example": failed to call webhook: '
        'Post "https://webhook-service.system.svc:443/validate": context deadline exceeded',
    }
    cluster.api.failures = {collection: [(500, unreachable), DROP]}
    assert submit.submit(cluster.objects, submit_args()) == submit.EXIT_SUCCEEDED
    assert [method for method, path, _ in cluster.api.log if path == collection] == ["POST"] * 3
    assert any("failed (HTTP 500 Internal Server Error" in line for line in cluster.lines)


def test_a_job_of_the_same_name_made_by_someone_else_before_the_first_try_is_refused_not_taken(cluster, capsys):
    cluster.api = FakeAPIServer(cluster.kind)
    collection = KINDS[cluster.kind]["collection"]
    cluster.api.failures = {collection: [409]}  # created between submit's check of the name and its create
    assert submit.main(["--image", "img:1", "--dataset", "synthetic"]) == submit.EXIT_CLUSTER
    assert [method for method, path, _ in cluster.api.log if path == collection] == ["POST"]
    assert f"creating {cluster.kind} {SETTINGS['JOB_NAME']} failed: HTTP 409" in capsys.readouterr().err


def test_a_create_that_stored_the_job_but_timed_out_is_not_refused_by_its_own_409_on_the_next_try(cluster):
    class StoredThenTimedOut(FakeAPIServer):
        def answer(self, method, path, query, body):
            answer = super().answer(method, path, query, body)
            if method == "POST" and path == KINDS[self.kind]["collection"] and self.created and not self.timed_out:
                self.timed_out = True
                return 504, status(504, "Timeout")
            return answer

    cluster.api = StoredThenTimedOut(cluster.kind)
    cluster.api.timed_out = False
    assert submit.submit(cluster.objects, submit_args()) == submit.EXIT_SUCCEEDED
    collection = KINDS[cluster.kind]["collection"]
    assert [method for method, path, _ in cluster.api.log if path == collection] == ["POST"] * 2


def test_a_failed_job_ends_submit_with_exit_1_and_the_replicas_last_lines(cluster, capsys):
    cluster.api = FakeAPIServer(cluster.kind, ends="Failed")
    assert submit.submit(cluster.objects, submit_args()) == submit.EXIT_FAILED
    captured = capsys.readouterr()
    assert f"{cluster.kind} {SETTINGS['JOB_NAME']} failed" in captured.err
    assert any(line.startswith(f"--- {SETTINGS['JOB_NAME']}-chief-0-0 (Running") for line in cluster.lines)


def test_make_delete_deletes_in_the_foreground(cluster, capsys):
    cluster.api = FakeAPIServer(cluster.kind, job=existing(cluster, "Running"))
    assert submit.main(["--delete"]) == submit.EXIT_SUCCEEDED
    (body,) = cluster.api.delete_bodies
    assert body["propagationPolicy"] == "Foreground"
    assert f"deleting {cluster.kind} {SETTINGS['JOB_NAME']}" in capsys.readouterr().out


def test_make_status_names_a_missing_job_by_its_kind(cluster, capsys):
    cluster.api = FakeAPIServer(cluster.kind)
    assert submit.main(["--status"]) == submit.EXIT_FAILED
    assert f"no {cluster.kind} {SETTINGS['JOB_NAME']} in namespace {NAMESPACE}" in capsys.readouterr().out


def test_following_rides_out_5xx_429_and_dropped_connections_until_the_job_ends(cluster):
    api = FakeAPIServer(cluster.kind, job=existing(cluster, "Running"), runs_for=3)
    api.job["status"]["conditions"] = []  # as if this run created it
    api.failures = {api.job_path: [503, 429, DROP, DROP, DROP, DROP, 500, 502, 504], PODS_PATH: [503, DROP]}
    server, clock, lines = serve(api), FakeClock(), []
    try:
        assert follower_at(server.server_port, cluster.objects, clock, lines).follow(poll_s=5) == "Succeeded"
    finally:
        server.shutdown()
    retried = [line for line in lines if "retrying" in line]
    assert any("HTTP 503" in line for line in retried) and any("HTTP 429" in line for line in retried)
    assert api.failures == {api.job_path: [], PODS_PATH: []}


@engines_here.needs("trainjob")
@pytest.mark.parametrize("state, sdk_status", [("Running", "Created"), ("done", "Complete"), ("Failed", "Failed")])
def test_the_trainjob_state_is_the_one_the_sdk_reads(state, sdk_status):
    objects = rendered(KINDS["TrainJob"]["fixture"])
    trainjob = next(obj for obj in objects if obj["kind"] == "TrainJob")
    api = FakeAPIServer("TrainJob")
    api.runtime = next(obj for obj in objects if obj["kind"] == "TrainingRuntime")
    api.job = {
        **trainjob,
        "metadata": {**trainjob["metadata"], "namespace": NAMESPACE, "creationTimestamp": "2026-01-01T00:00:00Z"},
    }
    api.job["status"] = {"conditions": condition("TrainJob", state)}
    server = serve(api)
    try:
        watcher = follower_at(server.server_port, objects, FakeClock(), [])
        ours = watcher.current_state()
        theirs = watcher.engine.trainer.get_job(SETTINGS["JOB_NAME"]).status
    finally:
        server.shutdown()
    # The SDK says Created (or Running once every node pod runs) until Complete or Failed is True; we say Running.
    assert theirs == sdk_status
    assert ours == {"Created": "Running", "Complete": "Succeeded", "Failed": "Failed"}[theirs]


@engines_here.needs("jobset")
@pytest.mark.parametrize("target", ["status", "delete"])
def test_make_status_and_delete_look_for_the_job_of_the_engine_asked_for(target):
    # They render the same overlay as make submit, so they ask the engine's API for the right kind of job.
    root = pathlib.Path(__file__).resolve().parents[2]
    plan = subprocess.run(
        ["make", "-n", target, "ENGINE=jobset", "STRATEGY=async"], cwd=root, capture_output=True, text=True, check=True
    ).stdout
    assert f"-m scripts.cluster.submit --{target} --kustomize k8s/engines/jobset/async" in plan


@pytest.mark.parametrize(
    "overlay", [o for o in ("jobset/sync", "trainjob/async", "tfjob/sync") if o.split("/")[0] in tfjob_manifest.ENGINES]
)
def test_a_bad_setting_that_reaches_the_pod_through_its_config_map_is_refused_before_the_cluster(overlay, monkeypatch):
    root = pathlib.Path(__file__).resolve().parents[2]
    objects = tfjob_manifest.render(root / "k8s" / "engines" / overlay)
    (settings,) = [obj for obj in objects if obj["kind"] == "ConfigMap" and "TRAINER_DATASET" in obj.get("data", {})]
    settings["data"]["TRAINER_EPOCHS"] = "three"
    monkeypatch.setattr(tfjob_manifest, "render", lambda *args, **kwargs: objects)
    args = submit.parse_args(["--image", "img:1", "--kustomize", str(root / "k8s" / "engines" / overlay)])
    with pytest.raises(tfjob_manifest.ManifestError, match="TRAINER_EPOCHS: expected int, got 'three'"):
        submit.build_objects(args)
    settings["data"]["TRAINER_EPOCHS"] = "3"
    assert job_engine.engine_kind(submit.build_objects(args)) == job_engine.engine_kind(objects)
    # A misspelt name: before, the trainer ignored it and trained for its default number of epochs.
    settings["data"]["TRAINER_EPOCHZ"] = "3"
    with pytest.raises(tfjob_manifest.ManifestError, match=r"TRAINER_EPOCHZ \(did you mean TRAINER_EPOCHS\?\)"):
        submit.build_objects(args)


@pytest.mark.parametrize("cluster", sorted(KINDS), indirect=True)
def test_make_status_says_what_the_engine_does_once_a_lost_nodes_pods_are_freed(cluster):
    engine = submit.follower(cluster.objects, NAMESPACE).engine
    advice = submit.lost_node_advice("node-2", "NodeStatusUnknown", ["pod-0"], engine)
    assert "kubectl taint nodes node-2 node.kubernetes.io/out-of-service=nodeshutdown:NoExecute" in advice
    assert f"The {cluster.kind} then restarts its group on the nodes that remain" in advice, advice
