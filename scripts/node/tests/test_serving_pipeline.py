"""The pipeline and the served model on the local node's real controllers (make cluster-up SERVE=1): Argo Workflows
runs make submit-pipeline's Workflow (the data Job, three variants as engine jobs in parallel, the selection pod, the
InferenceService), and KServe's controller serves the selected model from the volume.

Everything runs in a namespace of its own labelled Pod Security "restricted", so the real admission sees every pod
of the pipeline (Argo's executor pods and the predictor included). The clients are the project's (httpx, gRPC) and
KServe's own, from the node through `kubectl port-forward` to the predictor's Service (on either node); the answers
are checked against the published SavedModel called in this process.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading

import httpx
import numpy as np
import pytest
import tensorflow as tf
from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig

from scripts.node.tests.node import (
    KUBECTL,
    ROOT,
    SETTINGS,
    connects,
    fetch_model,
    kubectl,
    make,
    make_environment,
    model_dir_on_node,
    project_image,
    volume_on_node,
    wait_until,
)

pytestmark = pytest.mark.cluster

# A name of this run's own (a deleted namespace can stay Terminating on the node while Kueue is installed).
NAMESPACE = f"pipeline-{os.getpid()}"
JOB = "e2e-pipe"
MODELS = ["cnn", "dropout", "batch_norm"]
SHORT = ["DATASET=synthetic", "EPOCHS=1", "ARGS=--train-examples 1024 --test-examples 256"]
WHERE = [f"NAMESPACE={NAMESPACE}", f"JOB_NAME={JOB}"]
REST_PORT, GRPC_PORT = int(SETTINGS["SERVE_PORT"]), int(SETTINGS["SERVE_GRPC_PORT"])


def published(job: str = JOB) -> pathlib.Path:
    """A pipeline's base path on the node: SELECTION_ROOT/JOB/serving, selection.json beside it."""
    return volume_on_node(NAMESPACE) / SETTINGS["SELECTION_ROOT"] / job / "serving"


def predictor_pods(jsonpath: str) -> str:
    """A field of the predictor's pods, as kubectl's jsonpath prints it."""
    selector = f"serving.kserve.io/inferenceservice={JOB}"
    return kubectl("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", f"jsonpath={jsonpath}").stdout


def images(count: int = 8) -> np.ndarray:
    """Synthetic test images, each different, as the served signature takes them (uint8, NHWC)."""
    return np.random.default_rng(7).integers(0, 256, (count, 28, 28, 1), dtype=np.uint8)


def in_process(version_dir: pathlib.Path, batch: np.ndarray) -> dict[str, np.ndarray]:
    signature = tf.saved_model.load(str(version_dir)).signatures["serve"]
    return {name: tensor.numpy() for name, tensor in signature(images=tf.constant(batch)).items()}


@pytest.fixture(scope="module")
def namespace():
    kubectl("create", "namespace", NAMESPACE)
    kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
    kubectl("wait", "-n", NAMESPACE, "--for=create", "serviceaccount/default", "--timeout=60s")
    yield NAMESPACE
    kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


@pytest.fixture(scope="module")
def pipeline(namespace):
    """make submit-pipeline with the training operator, to Succeeded; its output."""
    submitted = make("submit-pipeline", "ENGINE=tfjob", *WHERE, *SHORT, timeout=1800)
    return submitted.stdout


def test_the_workflow_runs_every_step_to_succeeded_and_publishes_the_selected_variant(pipeline):
    assert re.search(r"^Workflow \S+: Succeeded in \d+ s$", pipeline, re.M), pipeline[-3000:]
    for model in MODELS:
        assert f"train-{JOB}-{model.replace('_', '-')}: Succeeded" in pipeline, pipeline[-3000:]
    assert "select: Succeeded" in pipeline and "inference-service: Succeeded" in pipeline, pipeline[-3000:]
    selection = json.loads((published().parent / "selection.json").read_text())
    variants = {f"{SETTINGS['MODEL_ROOT']}/{JOB}-{model.replace('_', '-')}" for model in MODELS}
    assert selection["winner"] in variants and len(selection["candidates"]) == len(MODELS), selection
    assert sorted(path.name for path in published().iterdir() if path.name.isdigit()) == ["1"]


def test_make_fetch_model_brings_back_the_published_model(pipeline, tmp_path):
    # Before: it copied only MODEL_ROOT/JOB_NAME, which a pipeline never trains (its variants are JOB_NAME-<model>).
    model_dir = fetch_model(tmp_path, JOB, NAMESPACE)
    assert not model_dir.exists()
    fetched = tmp_path / "published"
    assert json.loads((fetched / "selection.json").read_text()) == json.loads(
        (published().parent / "selection.json").read_text()
    )
    assert (fetched / "serving" / "1" / "saved_model.pb").read_bytes() == (
        published() / "1" / "saved_model.pb"
    ).read_bytes()


def listening(forward: subprocess.Popen, log: pathlib.Path, count: int) -> list[str] | None:
    """The local ports kubectl port-forward listens on, in the order asked, once it listens on all COUNT."""
    assert forward.poll() is None, f"kubectl port-forward exited: {log.read_text()}"
    ports = re.findall(r"^Forwarding from 127\.0\.0\.1:(\d+) ->", log.read_text(), re.M)
    return ports if len(ports) == count else None


@pytest.fixture(scope="module")
def predictor(pipeline, tmp_path_factory):
    """The InferenceService Ready (the Workflow applied it; make serve-cluster applies it again and waits), reached as
    make serve-cluster tells a user to: `kubectl port-forward` to its Service, which the predictor's kubelet opens
    inside the pod, on either node. The Service's own address answers only on the predictor's node: from another node
    the connection comes from that node's address, which the serving policy refuses."""
    served = make("serve-cluster", *WHERE, timeout=900)
    assert f"InferenceService {JOB} is Ready" in served.stdout, served.stdout[-3000:]
    assert f"kubectl port-forward -n {NAMESPACE} service/{JOB}-predictor" in served.stdout, served.stdout[-3000:]
    service = json.loads(kubectl("get", "service", "-n", NAMESPACE, f"{JOB}-predictor", "-o", "json").stdout)
    ports = {port["name"]: port["port"] for port in service["spec"]["ports"]}
    # kubectl prints a line per connection: to a file, so a full pipe never stalls the forward.
    log = tmp_path_factory.mktemp("port-forward") / "kubectl.log"
    with log.open("w") as out:
        forward = subprocess.Popen(
            [*KUBECTL, "port-forward", "-n", NAMESPACE, f"service/{JOB}-predictor",
             f":{ports.get('http', 80)}", f":{ports['grpc']}"],
            stdout=out, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
    try:
        local = wait_until("kubectl port-forward to listen", lambda: listening(forward, log, count=2), 60, poll_s=0.5)
        yield f"http://127.0.0.1:{local[0]}", f"127.0.0.1:{local[1]}"
    finally:
        forward.terminate()
        forward.wait(timeout=30)


def v1_predict(rest: str, batch: np.ndarray, client: httpx.Client | None = None) -> httpx.Response:
    body = {"instances": batch.tolist()}
    return (client or httpx).post(f"{rest}/v1/models/{JOB}:predict", json=body, timeout=60)


def test_the_project_client_and_kserves_get_the_in_process_answers_over_v1_v2_and_grpc(predictor):
    rest, grpc_target = predictor
    batch = images()
    expected = in_process(published() / "1", batch)

    rows = v1_predict(rest, batch)
    assert rows.status_code == 200, rows.text
    predictions = rows.json()["predictions"]
    assert [row["class_id"] for row in predictions] == expected["class_id"].tolist()
    np.testing.assert_allclose([row["probabilities"] for row in predictions], expected["probabilities"], rtol=1e-5)

    async def kserve_clients():
        v1 = InferenceRESTClient(RESTConfig(protocol="v1"))
        v1_answer = await v1.infer(rest, {"instances": batch.tolist()}, model_name=JOB)
        v2 = InferenceRESTClient(RESTConfig(protocol="v2"))
        tensor = InferInput("images", list(batch.shape), "UINT8")
        tensor.set_data_from_numpy(batch)
        v2_answer = await v2.infer(rest, InferRequest(model_name=JOB, infer_inputs=[tensor]), model_name=JOB)
        grpc_client = InferenceGRPCClient(grpc_target, timeout=60)
        tensor = InferInput("images", list(batch.shape), "UINT8")
        tensor.set_data_from_numpy(batch, binary_data=True)
        grpc_answer = await grpc_client.infer(InferRequest(model_name=JOB, infer_inputs=[tensor]))
        await grpc_client.close()
        return v1_answer, v2_answer, grpc_answer

    v1_answer, v2_answer, grpc_answer = asyncio.run(kserve_clients())
    assert [row["class_id"] for row in v1_answer["predictions"]] == expected["class_id"].tolist()
    for answer in (v2_answer, grpc_answer):
        outputs = {output.name: output.as_numpy() for output in answer.outputs}
        assert outputs["class_id"].tolist() == expected["class_id"].tolist()
        np.testing.assert_allclose(outputs["probabilities"], expected["probabilities"], rtol=1e-5)


# In the predictor: the server's command line and the threads of TensorFlow's inter-op pool (named tf_Compute). The
# server is `python -m trainer.serving ...` (tini, its parent, has the same words after its own flags).
THREADS_SEEN = r"""
import pathlib
commands = {p: (p / "cmdline").read_bytes().split(b"\0") for p in pathlib.Path("/proc").glob("[0-9]*")}
(server,) = [p for p, parts in commands.items() if parts[1:3] == [b"-m", b"trainer.serving"]]
print(" ".join(part.decode() for part in commands[server]))
print(sum((task / "comm").read_text().strip() == "tf_Compute" for task in (server / "task").iterdir()))
"""


def test_the_predictor_sizes_tensorflows_pools_to_its_cpu_limit(predictor):
    rest, _ = predictor
    assert v1_predict(rest, images(1)).status_code == 200
    pod = predictor_pods("{.items[0].metadata.name}")
    limit = predictor_pods("{.items[0].spec.containers[?(@.name=='kserve-container')].resources.limits.cpu}")
    in_pod = ["exec", "-n", NAMESPACE, pod, "-c", "kserve-container", "--"]
    seen = kubectl(*in_pod, "python", "-c", THREADS_SEEN, check=False)
    assert seen.returncode == 0, seen.stderr
    command, pool = seen.stdout.strip().splitlines()
    assert f" --threads {limit} " in command, command  # the kubelet wrote the limit into the args
    assert int(pool) == int(limit), seen.stdout


def test_a_bad_request_gets_a_4xx_and_the_server_goes_on(predictor):
    rest, grpc_target = predictor
    wrong_shape = httpx.post(f"{rest}/v1/models/{JOB}:predict", json={"instances": [[1, 2, 3]]}, timeout=60)
    assert 400 <= wrong_shape.status_code < 500, wrong_shape.text
    not_json = httpx.post(f"{rest}/v1/models/{JOB}:predict", content=b"{not json", timeout=60)
    assert 400 <= not_json.status_code < 500, not_json.text
    assert v1_predict(rest, images(2)).status_code == 200


def test_a_new_version_on_the_volume_is_served_without_a_restart_or_a_failed_request(predictor):
    rest, _ = predictor
    pods_before = predictor_pods("{.items[*].metadata.uid}").split()
    answers: list[int] = []
    stop = threading.Event()

    def load() -> None:  # a bounded load: one client, sequential requests, until the swap is seen or 300 s
        with httpx.Client() as client:
            for _ in range(3000):
                if stop.is_set():
                    return
                answers.append(v1_predict(rest, images(1), client).status_code)

    client = threading.Thread(target=load)
    client.start()
    try:
        base = published()
        partial = base / ".2.partial"
        shutil.copytree(base / "1", partial)
        shutil.chown(partial, 1000, 1000)
        os.replace(partial, base / "2")
        wait_until(
            "the server to serve version 2",
            lambda: httpx.get(f"{rest}/v2/models/{JOB}", timeout=30).json().get("versions", [None])[0] == "2",
            300,
        )
        answered_after = len(answers)
        wait_until("requests after the swap", lambda: len(answers) > answered_after + 20, 120, poll_s=0.5)
    finally:
        stop.set()
        client.join(timeout=120)
    assert answers and set(answers) == {200}, f"{len(answers)} requests, statuses {sorted(set(answers))}"
    pods_after = predictor_pods("{.items[*].metadata.uid}").split()
    assert pods_after == pods_before, "the predictor pod was replaced"


def probe_pod(name: str, namespace: str) -> None:
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "runAsUser": 1000,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "probe",
                    "image": project_image(),
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["sleep", "3600"],
                    "securityContext": restricted,
                }
            ],
        },
    }
    kubectl("apply", "-f", "-", stdin=json.dumps(pod))
    kubectl("wait", "-n", namespace, "--for=condition=Ready", f"pod/{name}", "--timeout=180s")


def test_the_predictor_admits_its_namespace_on_the_serving_ports_and_no_other_namespace(predictor):
    other = f"pipeline-other-{os.getpid()}"
    kubectl("create", "namespace", other)
    kubectl("wait", "-n", other, "--for=create", "serviceaccount/default", "--timeout=60s")
    try:
        probe_pod("serving-client", NAMESPACE)
        probe_pod("serving-stranger", other)
        pod_ip = predictor_pods("{.items[0].status.podIP}")
        for port in (REST_PORT, GRPC_PORT):
            assert connects("serving-client", NAMESPACE, pod_ip, port), port
        wait_until(
            "the policy controller to refuse another namespace's pod",
            lambda: not connects("serving-stranger", other, pod_ip, REST_PORT),
            90,
        )
        assert not connects("serving-stranger", other, pod_ip, GRPC_PORT)
    finally:
        kubectl("delete", "pod", "-n", NAMESPACE, "serving-client", "--wait=false", check=False)
        kubectl("delete", "namespace", other, "--wait=false", check=False)


def test_a_pod_that_breaks_restricted_is_refused_in_the_pipeline_s_namespace(namespace):
    root = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "as-root", "namespace": namespace},
        "spec": {"containers": [{"name": "c", "image": project_image(), "securityContext": {"runAsUser": 0}}]},
    }
    refused = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(root), check=False)
    assert refused.returncode != 0 and 'violates PodSecurity "restricted:latest"' in refused.stderr, refused.stderr


# A task whose exported signature is wrong for the dropout variant alone: serve() inverts the images there, so the
# trainer's export check fails for that variant and passes for the others.
SKEWED_TASK = """
from trainer.task import register
from trainer.tasks.image_classification import ImageClassification


@register("skew_dropout")
class SkewDropout(ImageClassification):
    def serve(self, model, images):
        return super().serve(model, 255 - images if self.options.model == "dropout" else images)
"""


def test_with_kubeflow_trainer_a_refused_model_and_a_failed_export_check_fail_their_steps_and_the_rest_is_published(
    namespace, tmp_path
):
    """One Workflow on TrainJob (the other engine) with three variants: an unknown model, refused at start (exit 2),
    fails its step at once; the dropout variant trains but fails the export check (exit 2, nothing published); the
    cnn variant is selected and published."""
    # The project's image with the task in its modules/ folder, as a fork adds its own (docs/fork.md).
    module = tmp_path / "skew_dropout.py"
    module.write_text(SKEWED_TASK)
    image = f"{project_image()}-skew"
    container = subprocess.run(["buildah", "from", project_image()], capture_output=True, text=True, check=True)
    working = container.stdout.strip()
    subprocess.run(["buildah", "copy", working, str(module), "/opt/project/modules/skew_dropout.py"], check=True)
    subprocess.run(["buildah", "commit", "--rm", working, image], capture_output=True, check=True)
    environment = {**make_environment(), "NAMESPACE": NAMESPACE, "JOB_NAME": "e2e-skew"}
    imported = subprocess.run([sys.executable, "-m", "scripts.cluster.import_image", image], cwd=ROOT,
                              env=environment, capture_output=True, text=True)  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    task = ["--task-module", "modules.skew_dropout", "--task", "skew_dropout"]
    submitted = subprocess.run(
        [sys.executable, "-m", "scripts.pipeline.submit", "workflow", "--engine", "trainjob", "--image", image,
         "--models", "cnn", "dropout", "no_such_model", "--dataset", "synthetic", "--epochs", "1",
         "--", "--train-examples", "1024", "--test-examples", "256", *task],
        cwd=ROOT, env=environment, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    output = submitted.stdout[-3000:] + submitted.stderr[-3000:]
    assert submitted.returncode == 0, output
    assert "train-e2e-skew-cnn: Succeeded" in submitted.stdout, output
    # The trainer refuses the unknown model (exit 2) and the JobSet's failure policy fails the TrainJob at once, so
    # Argo fails the step then, not at the step's deadline.
    assert "train-e2e-skew-no-such-model: Failed" in submitted.stdout, output
    # The dropout variant's export check failed its run (exit 2, nothing published), and so its step.
    assert "train-e2e-skew-dropout: Failed" in submitted.stdout, output
    assert "select: Succeeded" in submitted.stdout, output
    dropout, cnn = (model_dir_on_node(f"e2e-skew-{model}", NAMESPACE) for model in ("dropout", "cnn"))
    status = json.loads((dropout / "status.json").read_text())
    assert status["state"] == "failed" and status["exit_code"] == 2, status
    assert not (dropout / "metrics.json").exists()
    assert json.loads((cnn / "metrics.json").read_text())["export_check"]["passed"] is True
    selection = json.loads((published("e2e-skew").parent / "selection.json").read_text())
    refused = {candidate["model_dir"]: candidate["refused"] for candidate in selection["candidates"]}
    for model in ("dropout", "no-such-model"):
        assert refused[f"{SETTINGS['MODEL_ROOT']}/e2e-skew-{model}"], selection
    assert selection["winner"] == f"{SETTINGS['MODEL_ROOT']}/e2e-skew-cnn", selection
