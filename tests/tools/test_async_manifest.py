"""k8s/engines/tfjob/async, the TFJob shape for asynchronous training: the same offline checks as tfjob-sync's
(schemas, SDK model, webhook rules, the operator's TF_CONFIG for every replica), submit's and make's selection of
it, and a real run of it under run-local."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import kubernetes_validate
import pytest

from k8s.engines.tfjob import admission as tfjob_admission
from k8s.engines.tfjob import cluster as tfjob_cluster
from local_runner import job_model_dir
from multiworker import python_prints
from scripts.common import manifest as tfjob_manifest
from scripts.common import settings as project_settings
from scripts.common.tfconfig import operator_address, tf_config
from trainer.artifacts.layout import ModelDir
from trainer.context import parse_config
from trainer.distribution.cluster import parse_tf_config

ROOT = pathlib.Path(__file__).resolve().parents[2]
ASYNC_DIR = ROOT / "k8s" / "engines" / "tfjob" / "async"
SETTINGS = project_settings.load()
K8S_VERSION = SETTINGS["K3S_IMAGE"].split(":v", 1)[1].split("-", 1)[0]


@pytest.fixture(scope="module")
def tfjob() -> dict:
    return tfjob_manifest.the_one(tfjob_manifest.render(ASYNC_DIR), "TFJob")


def replicas(tfjob: dict) -> dict[str, dict]:
    return tfjob["spec"]["tfReplicaSpecs"]


def test_chief_ps_workers_and_an_evaluator_that_restart_by_exit_code(tfjob):
    counts = {name: spec["replicas"] for name, spec in replicas(tfjob).items()}
    assert counts == {"Chief": 1, "PS": 1, "Worker": int(SETTINGS["WORKERS"]), "Evaluator": 1}
    assert {spec["restartPolicy"] for spec in replicas(tfjob).values()} == {"ExitCode"}
    # The default success policy: the chief (the coordinator) finishing ends the job.
    assert "successPolicy" not in tfjob["spec"] and tfjob["spec"]["runPolicy"]["cleanPodPolicy"] == "Running"


def test_every_replica_is_a_valid_pod_template_with_resources(tfjob):
    for spec in replicas(tfjob).values():
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": spec["template"]},
            K8S_VERSION,
            strict=True,
        )
        container = tfjob_admission.tensorflow_container(spec["template"])
        assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]
        assert {port["name"] for port in container["ports"]} >= {"tfjob-port"}


def test_the_sdk_model_and_the_webhook_accept_it(tfjob):
    assert tfjob_cluster.sdk_request_body(tfjob_cluster.to_tfjob(tfjob)) == tfjob
    assert tfjob_admission.webhook_problems(tfjob) == []


def test_the_operators_tf_config_gives_every_replica_its_role(tfjob):
    counts = {name: spec["replicas"] for name, spec in replicas(tfjob).items()}
    address = operator_address(tfjob["metadata"]["name"], "default", int(SETTINGS["TFJOB_PORT"]))
    expected = {"Chief": "coordinator", "PS": "server", "Worker": "server", "Evaluator": "evaluator"}
    for rtype, count in counts.items():
        # Plain values only: TRAINER_THREADS comes from the container's own CPU limit (resourceFieldRef).
        env = {
            entry["name"]: entry["value"]
            for entry in tfjob_admission.tensorflow_container(replicas(tfjob)[rtype]["template"])["env"]
            if "value" in entry
        }
        config = parse_config([], env)
        for index in range(count):
            cluster = parse_tf_config(tf_config(counts, rtype, index, address), config.strategy)
            assert cluster.is_async and cluster.role == expected[rtype]
        assert config.eval_in_loop == (rtype != "Chief")  # the evaluator does the chief's per-epoch test pass


def test_submit_dry_run_selects_the_async_kustomization():
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.cluster.submit",
            "--dry-run",
            "--kustomize",
            str(ASYNC_DIR),
            "--image",
            "img:1",
            "--dataset",
            "synthetic",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    body = json.loads(result.stdout)
    assert sorted(body["spec"]["tfReplicaSpecs"]) == ["Chief", "Evaluator", "PS", "Worker"]
    assert {spec["template"]["spec"]["containers"][0]["image"] for spec in body["spec"]["tfReplicaSpecs"].values()} == {
        "img:1"
    }


@pytest.mark.parametrize("target", ["run-local", "submit"])
def test_make_strategy_async_selects_the_overlay_and_a_typo_is_refused(target):
    dry = subprocess.run(["make", "-n", target, "STRATEGY=async"], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "--kustomize k8s/engines/tfjob/async " in dry.stdout, dry.stdout + dry.stderr
    default = subprocess.run(["make", "-n", target], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert "--kustomize k8s/engines/tfjob/sync " in default.stdout
    typo = subprocess.run(
        ["make", "-n", target, "STRATEGY=asnyc"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert typo.returncode != 0 and "STRATEGY=asnyc is not a strategy: use sync or async" in typo.stderr


@pytest.mark.slow
def test_run_local_of_the_async_shape_succeeds_with_the_model_in_the_job_directory(tmp_path):
    job_dir = tmp_path / "job"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "scripts.localrun.run_local",
            "--kustomize",
            str(ASYNC_DIR),
            "--dataset",
            "synthetic",
            "--epochs",
            "1",
            "--job-dir",
            str(job_dir),
            "--",
            "--train-examples",
            "2048",
            "--test-examples",
            "512",
            "--threads",
            "1",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=400,
    )
    assert result.returncode == 0, result.stdout[-5000:]
    status = json.loads((job_dir / "run-local" / "multi-worker.status.json").read_text())
    assert status["state"] == "Succeeded"
    assert status["replicas"]["chief-0"]["exit_codes"] == [0]
    model_dir = ModelDir(str(job_model_dir(job_dir).resolve()))
    assert [str(p) for p in job_dir.resolve().rglob("model.keras")] == [model_dir.keras_model]
    assert json.loads(pathlib.Path(model_dir.metrics).read_text())["strategy"] == "async"


def test_an_environment_override_reaches_the_async_shape_too():
    # Before: the overlay has no settings.env of its own, so JOB_NAME from the environment was ignored there.
    code = (
        "import pathlib; from scripts.common import manifest; "
        "job = manifest.the_one(manifest.render(pathlib.Path('k8s/engines/tfjob/async')), 'TFJob'); "
        "print(job['metadata']['name'])"
    )
    assert python_prints(code, {**os.environ, "JOB_NAME": "mine"}) == "mine"
