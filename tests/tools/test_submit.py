"""scripts/cluster/submit.py without a cluster: what --dry-run prints, that it is byte for byte what the
Kubeflow SDK sends, and that bad input is refused before anything reaches a cluster."""

from __future__ import annotations

import copy
import http.server
import json
import os
import pathlib
import subprocess
import sys
import threading

import pytest
import yaml

from k8s.engines.tfjob import admission as tfjob_admission
from k8s.engines.tfjob import cluster as tfjob_cluster
from scripts.cluster import job_follower
from scripts.cluster import steps as cluster_steps
from scripts.cluster import submit as submit_module
from scripts.common import manifest as tfjob_manifest
from scripts.common import settings as project_settings

ROOT = pathlib.Path(__file__).resolve().parents[2]

SETTINGS = project_settings.load()
IMAGE = f"{SETTINGS['IMAGE_NAME']}:rev123"
OVERLAYS = [(engine, strategy) for engine in tfjob_manifest.ENGINES for strategy in tfjob_manifest.STRATEGIES]


def submit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    # From another directory, with only the package on the path: no path in submit depends on the cwd.
    env = {**(os.environ if env is None else env), "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "scripts.cluster.submit", *args],
        capture_output=True,
        text=True,
        cwd="/",
        env=env,
        timeout=120,
    )


@pytest.fixture(scope="module")
def dry_run() -> dict:
    result = submit(
        "--dry-run",
        "--image",
        IMAGE,
        "--workers",
        "3",
        "--dataset",
        "mnist",
        "--epochs",
        "2",
        "--",
        "--per-worker-batch-size",
        "32",
        "--scale-learning-rate",
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_dry_run_prints_the_rendered_tfjob_with_the_command_line_applied(dry_run):
    rendered = tfjob_manifest.the_one(tfjob_manifest.render(), "TFJob")
    expected = copy.deepcopy(rendered)
    worker = expected["spec"]["tfReplicaSpecs"]["Worker"]
    worker["replicas"] = 3
    container = tfjob_admission.trainer_container(expected)
    container["image"] = IMAGE
    container["args"] = list(container.get("args") or []) + ["--per-worker-batch-size", "32", "--scale-learning-rate"]
    # The settings reach the pod through envFrom; the command line's values are variables after them, so they win.
    container["env"].append({"name": "TRAINER_EPOCHS", "value": "2"})
    container["env"].append({"name": "TRAINER_DATASET", "value": "mnist"})
    expected["metadata"]["namespace"] = SETTINGS["NAMESPACE"]  # where create_job would post it
    assert dry_run == expected


def test_dry_run_object_is_a_valid_sdk_tfjob_the_operator_accepts(dry_run):
    model = tfjob_cluster.to_tfjob(dry_run)
    assert model.kind == "TFJob" and model.spec.tf_replica_specs["Worker"].replicas == 3
    assert tfjob_admission.webhook_problems(dry_run) == []


class RecordingAPI(http.server.BaseHTTPRequestHandler):
    """Records the one request the SDK makes and answers 201 with its body, as an API server does."""

    requests: list[tuple[str, str, dict]] = []

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        RecordingAPI.requests.append(("POST", self.path, body))
        payload = json.dumps(body).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args):
        pass


def test_dry_run_output_is_exactly_the_body_training_client_create_job_sends(dry_run):
    import kubernetes.client
    from kubeflow.training import TrainingClient

    server = http.server.HTTPServer(("127.0.0.1", 0), RecordingAPI)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        configuration = kubernetes.client.Configuration(host=f"http://127.0.0.1:{server.server_port}")
        client = TrainingClient(client_configuration=configuration, job_kind="TFJob", namespace=SETTINGS["NAMESPACE"])
        client.create_job(job=tfjob_cluster.to_tfjob(dry_run), namespace=SETTINGS["NAMESPACE"])
    finally:
        server.shutdown()
    ((method, path, body),) = RecordingAPI.requests
    assert (method, path) == ("POST", f"/apis/kubeflow.org/v1/namespaces/{SETTINGS['NAMESPACE']}/tfjobs")
    assert body == dry_run


def test_a_misspelt_trainer_flag_is_refused_before_any_cluster_call():
    result = submit("--dry-run", "--image", IMAGE, "--", "--per-worker-batch-sise", "32")
    assert result.returncode == 2
    assert "--per-worker-batch-sise" in result.stderr and result.stdout == ""


def test_a_bad_trainer_value_is_refused_with_the_trainers_message():
    result = submit("--dry-run", "--image", IMAGE, "--", "--epochs", "0")
    assert result.returncode == 2
    assert "--epochs must be at least 1" in result.stderr


def test_submitting_needs_an_image_and_at_least_one_worker():
    missing = submit("--dry-run")
    assert missing.returncode == 2 and "--image is required" in missing.stderr
    none = submit("--dry-run", "--image", IMAGE, "--workers", "0")
    assert none.returncode == 2 and "--workers must be at least 1" in none.stderr


def test_without_a_cluster_submit_says_how_to_get_one(tmp_path):
    env = dict(os.environ, KUBECONFIG=str(tmp_path / "no-kubeconfig"))
    result = submit("--image", IMAGE, env=env)
    assert result.returncode == 3
    assert "make k3d-up" in result.stderr


def test_status_without_a_cluster_is_an_error_not_a_traceback(tmp_path):
    env = dict(os.environ, KUBECONFIG=str(tmp_path / "no-kubeconfig"))
    result = submit("--status", env=env)
    assert result.returncode == 3
    assert result.stderr.startswith("error:") and "Traceback" not in result.stderr


def test_log_timestamps_order_correctly_whatever_their_precision():
    stamps = [
        "2025-01-05T22:58:20.1Z",
        "2025-01-05T22:58:20.12Z",
        "2025-01-05T22:58:20Z",
        "2025-01-05T22:58:21.000000001Z",
    ]
    ordered = sorted(stamps, key=job_follower.sortable_timestamp)
    assert ordered == [
        "2025-01-05T22:58:20Z",
        "2025-01-05T22:58:20.1Z",
        "2025-01-05T22:58:20.12Z",
        "2025-01-05T22:58:21.000000001Z",
    ]


class RecordingJob:
    """The follower submit gets, standing in for the engine's client: no earlier job, and creating the job is an
    event in the same list as the kubectl calls, so the order of the two is what the cluster would see."""

    def __init__(self, objects: list[dict], events: list[tuple[str, object]]):
        self.kind = next(obj["kind"] for obj in objects if obj["kind"] in ("TFJob", "JobSet", "TrainJob"))
        self.name, self.namespace, self.events, self.engine = SETTINGS["JOB_NAME"], SETTINGS["NAMESPACE"], events, self

    def current_state(self):
        return None

    def pods(self):
        return []

    def services(self):
        return []

    def clock(self):
        return 0.0

    def call(self, what, function, *args, **kwargs):  # the follower's retries, which nothing here needs
        return function(*args, **kwargs)

    def create(self, objects):
        self.events.append(("create", self.kind))

    def follow(self, timeout_s=0):
        return "Succeeded"


@pytest.mark.parametrize("engine, strategy", OVERLAYS)
def test_make_submit_applies_the_network_policies_with_the_first_objects(
    rendered_overlays, engine, strategy, monkeypatch
):
    objects = rendered_overlays[engine, strategy]
    expected = tfjob_manifest.of_kind(objects, "NetworkPolicy")
    assert {policy["metadata"]["labels"]["app.kubernetes.io/component"] for policy in expected} == {
        "training",
        "prepare-data",
        "tensorboard",
    }
    events: list[tuple[str, object]] = []

    def run(command, stdin=None, check=True, quiet=False):
        events.append((" ".join(command[:2]), [doc for doc in yaml.safe_load_all(stdin or "") if doc]))
        stdout = {"config get-contexts": f"k3d-{SETTINGS['CLUSTER_NAME']}\n", "get job": "Complete\n"}
        return subprocess.CompletedProcess(command, 0, stdout=stdout.get(" ".join(command[1:3]), ""), stderr="")

    monkeypatch.setattr(cluster_steps, "run", run)
    # The claim's check against the cluster: tests/tools/test_volume_claim.py.
    monkeypatch.setattr(cluster_steps, "check_volume_claim", lambda objects, namespace: None)
    monkeypatch.setattr(submit_module, "follower", lambda objects, namespace: RecordingJob(objects, events))
    monkeypatch.setattr(submit_module, "container_tool", lambda: "docker")
    args = submit_module.parse_args(["--image", "img:1", "--dataset", "mnist", "--tensorboard"])
    assert submit_module.submit(objects, args) == submit_module.EXIT_SUCCEEDED
    # What makes pods: the data Job (kubectl create), TensorBoard (a later apply) and the engine's job (create).
    changes = [(what, docs) for what, docs in events if what in ("kubectl apply", "kubectl create", "create")]
    (first_what, first_docs), *later = changes
    assert first_what == "kubectl apply"
    assert [doc for doc in first_docs if doc["kind"] == "NetworkPolicy"] == expected
    assert not {doc["kind"] for doc in first_docs} & {"Job", "Deployment", "TFJob", "JobSet", "TrainJob"}
    assert sorted(what for what, _ in later) == ["create", "kubectl apply", "kubectl create"]
