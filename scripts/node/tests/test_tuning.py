"""make tune-cluster on the local node's real Katib (make cluster-up KATIB=1: its controller, webhooks, DB manager,
PostgreSQL, goptuna suggestion and StdOut collector, built from the pinned module), with TFJob and TrainJob trials.

Everything runs in a namespace of its own that enforces Pod Security "restricted", so the real admission sees every
pod Katib makes there: the suggestion's, and each trial's with the collector its webhook injects. The best trial's
model is published on the volume and fetched.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from scripts.node.tests.node import (
    ROOT,
    SETTINGS,
    kubectl,
    make,
    make_environment,
    model_dir_on_node,
    project_image,
    volume_on_node,
)

pytestmark = pytest.mark.cluster

NAMESPACE = f"tuning-{os.getpid()}"  # this run's own, as the pipeline's
JOB = "e2e-tune"
SHORT = ["DATASET=synthetic", "EPOCHS=1", "ARGS=--train-examples 2048 --test-examples 512"]
WHERE = [f"NAMESPACE={NAMESPACE}", f"JOB_NAME={JOB}"]
# Two rates around the default (1e-3), each trial a two-worker job; TPE's first trials are its random start.
SEARCH = """
trials: 2
parallel: 1
sampler: tpe
seed: 0
parameters:
  learning-rate: {type: float, min: 1.0e-3, max: 3.0e-3, log: true}
"""
DIVERGES = """
trials: 1
sampler: random
prune: false
parameters:
  learning-rate: {type: categorical, values: [1.0e+30]}
"""
COLLECTOR = "metrics-logger-and-collector"  # the container Katib's webhook injects (pkg/webhook/v1beta1/pod)


@pytest.fixture(scope="module")
def namespace():
    kubectl("create", "namespace", NAMESPACE)
    kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=restricted")
    kubectl("wait", "-n", NAMESPACE, "--for=create", "serviceaccount/default", "--timeout=60s")
    yield NAMESPACE
    kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)


def search_space(tmp_path_factory: pytest.TempPathFactory, text: str) -> pathlib.Path:
    path = tmp_path_factory.mktemp("space") / "space.yaml"
    path.write_text(text)
    return path


def tune(engine: str, study: str, space: pathlib.Path, check: bool = True) -> str:
    done = make(
        "tune-cluster",
        f"ENGINE={engine}",
        f"STUDY={study}",
        f"SEARCH_SPACE={space}",
        *WHERE,
        *SHORT,
        check=check,
        timeout=1500,
    )
    return done.stdout + done.stderr


def experiment(study: str) -> dict:
    return json.loads(kubectl("get", "experiment", study, "-n", NAMESPACE, "-o", "json").stdout)


def best_trial(output: str) -> str:
    found = re.search(r"^tune-cluster: best: trial (\S+) ", output, re.M)
    assert found, output[-3000:]
    return found.group(1)


def pods_of(label: str, job: str) -> list[dict]:
    return json.loads(kubectl("get", "pods", "-n", NAMESPACE, "-l", f"{label}={job}", "-o", "json").stdout)["items"]


def container_status(pod: dict, name: str) -> dict:
    return next(status for status in pod["status"]["containerStatuses"] if status["name"] == name)


@pytest.fixture(scope="module")
def tfjob_search(namespace, tmp_path_factory):
    space = search_space(tmp_path_factory, SEARCH)
    return space, tune("tfjob", "tune-tf", space)


def test_the_tfjob_experiment_succeeds_and_katib_read_the_chiefs_objective(tfjob_search):
    _, output = tfjob_search
    assert re.search(r"^tune-cluster: created Experiment tune-tf: 2 trials, 1 at once, tpe$", output, re.M), output
    assert (
        len(
            re.findall(
                r"^tune-cluster: trial tune-tf-\S+ \(learning-rate=\S+\): succeeded, test_accuracy", output, re.M
            )
        )
        == 2
    ), output[-3000:]
    record = experiment("tune-tf")
    conditions = {c["type"]: c["status"] for c in record["status"]["conditions"]}
    assert conditions.get("Succeeded") == "True", record["status"]
    best = best_trial(output)
    assert record["status"]["currentOptimalTrial"]["bestTrialName"] == best
    # The collector's value is the chief's own: the test_accuracy its metrics.json holds on the volume.
    (observed,) = record["status"]["currentOptimalTrial"]["observation"]["metrics"]
    metrics = json.loads((model_dir_on_node(best, NAMESPACE) / "metrics.json").read_text())
    assert float(observed["latest"]) == pytest.approx(metrics["test_accuracy"], abs=1e-4)


def test_katib_keeps_every_field_tune_cluster_sends(tfjob_search):
    """Katib's webhook rewrites the Experiment from its Go types, dropping a field it does not know without an
    error; each one the command sends is still there (a misspelt `retainRun` for `retain` was lost so)."""
    space, _ = tfjob_search
    command = [
        sys.executable,
        "-m",
        "scripts.tune.cluster",
        "--search-space",
        str(space),
        "--study",
        "tune-tf",
        "--kustomize",
        "k8s/engines/tfjob/sync",
        "--image",
        project_image(),
        "--dataset",
        "synthetic",
        "--epochs",
        "1",
        "--dry-run",
    ]
    dry_run = subprocess.run(
        command,
        cwd=ROOT,
        env={**make_environment(), "NAMESPACE": NAMESPACE, "JOB_NAME": JOB},
        capture_output=True,
        text=True,
        check=True,
    )
    sent = json.loads(dry_run.stdout)
    stored = experiment("tune-tf")

    def paths(node, prefix=()):
        if isinstance(node, dict):
            for key, value in node.items():
                yield from paths(value, (*prefix, key))
        else:
            yield prefix

    def at(node, path):
        for key in path:
            node = node[key]
        return node

    missing = []
    for path in paths(sent["spec"]):
        try:
            at(stored["spec"], path)
        except (KeyError, TypeError):
            missing.append("/".join(path))
    assert not missing, missing


def test_each_trial_pod_has_the_injected_collector_and_the_restricted_admission_passed_it(tfjob_search):
    _, output = tfjob_search
    best = best_trial(output)
    chief = next(p for p in pods_of("training.kubeflow.org/job-name", best) if p["metadata"]["name"].endswith("-0"))
    names = [c["name"] for c in chief["spec"]["containers"]]
    assert COLLECTOR in names, names
    collector = next(c for c in chief["spec"]["containers"] if c["name"] == COLLECTOR)
    # katib-config's injectSecurityContext: the trainer's own, so the restricted namespace admitted the pod.
    assert collector["securityContext"] == chief["spec"]["containers"][0]["securityContext"]
    assert container_status(chief, COLLECTOR)["state"]["terminated"]["exitCode"] == 0

    # The same pod with the collector as Katib injects it by default (no security context): the real admission
    # refuses it, naming the container and each field a cluster operator would otherwise have to allow.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "collector-check", "namespace": NAMESPACE},
        "spec": {key: value for key, value in chief["spec"].items() if key not in ("nodeName",)},
    }
    for container in pod["spec"]["containers"]:
        if container["name"] == COLLECTOR:
            container.pop("securityContext")
    refused = kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(pod), check=False)
    assert refused.returncode != 0
    assert 'violates PodSecurity "restricted:latest"' in refused.stderr, refused.stderr
    for rule in (
        f'allowPrivilegeEscalation != false (container "{COLLECTOR}"',
        f'container "{COLLECTOR}" must set',
        "unrestricted capabilities",
    ):
        assert rule in refused.stderr, refused.stderr


def test_the_best_trials_model_is_published_and_fetched(tfjob_search):
    # Serving what is published there is the pipeline's test (test_serving_pipeline.py): the same base path.
    _, output = tfjob_search
    best = best_trial(output)
    published = volume_on_node(NAMESPACE) / SETTINGS["SELECTION_ROOT"] / JOB / "serving"
    selection = json.loads((published.parent / "selection.json").read_text())
    assert selection["winner"] == f"{SETTINGS['MODEL_ROOT']}/{best}", selection
    assert (published / "1" / "saved_model.pb").is_file()
    fetched = json.loads((ROOT / "artifacts" / "model" / "metrics.json").read_text())
    assert (
        fetched["weights_sha256"]
        == json.loads((model_dir_on_node(best, NAMESPACE) / "metrics.json").read_text())["weights_sha256"]
    )


def test_the_same_command_again_follows_the_experiment_instead_of_starting_another(tfjob_search):
    """What Ctrl-C or a lost terminal leaves: the Experiment in the cluster, which the same command follows to its
    end and publishes; its trials are not run again."""
    space, first = tfjob_search
    again = tune("tfjob", "tune-tf", space)
    assert "Experiment tune-tf exists: following it" in again and "created Experiment" not in again, again[-3000:]
    assert best_trial(again) == best_trial(first)
    assert len(experiment("tune-tf")["status"].get("succeededTrialList", [])) == 2


def test_a_diverging_trial_fails_with_the_trainers_exit_4_reason_and_nothing_is_published(namespace, tmp_path_factory):
    output = tune("tfjob", "tune-diverges", search_space(tmp_path_factory, DIVERGES), check=False)
    assert re.search(r"\(learning-rate=1e\+30\): failed: .*exit 4: error: training diverged", output), output[-3000:]
    assert "no trial succeeded, so nothing is published" in output, output[-3000:]
    # Each replica that diverged says why in its termination message (the chief's output went to Katib's
    # collector), whichever of them the engine deleted while it still ran (cleanPodPolicy Running).
    (trial,) = re.findall(r"trial (tune-diverges-\w+) \(learning-rate=1e\+30\): failed", output)
    ended = [
        container_status(pod, pod["spec"]["containers"][0]["name"])["state"].get("terminated") or {}
        for pod in pods_of("training.kubeflow.org/job-name", trial)
    ]
    diverged = [end["message"] for end in ended if end.get("exitCode") == 4]
    assert diverged and all(message.startswith("error: training diverged") for message in diverged), ended


def test_the_trainjob_experiment_succeeds_and_its_collector_exits(namespace, tmp_path_factory, tfjob_search):
    """Katib #2614/#2616: the collector never exits when other processes stay in a TrainJob trial's pod. The trainer's
    pod holds none (tini, sh and the trainer end together), so the trial ends Succeeded and the collector exits 0."""
    space = search_space(tmp_path_factory, SEARCH.replace("trials: 2", "trials: 1"))
    output = tune("trainjob", "tune-tj", space)
    best = best_trial(output)
    (chief,) = [
        p
        for p in pods_of("jobset.sigs.k8s.io/jobset-name", best)
        if p["metadata"]["labels"].get("batch.kubernetes.io/job-completion-index") == "0"
    ]
    assert container_status(chief, COLLECTOR)["state"]["terminated"]["exitCode"] == 0
    assert container_status(chief, "node")["state"]["terminated"]["exitCode"] == 0
    assert f"published trial {best}'s model on the volume" in output


def test_a_privileged_pod_is_still_refused_in_the_tuning_namespace(namespace):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "privileged", "namespace": NAMESPACE},
        "spec": {
            "containers": [
                {"name": "c", "image": "docker.io/library/busybox:latest", "securityContext": {"privileged": True}}
            ]
        },
    }
    refused = kubectl("create", "--dry-run=server", "-f", "-", stdin=json.dumps(pod), check=False)
    assert refused.returncode != 0 and "privileged" in refused.stderr, refused.stderr
