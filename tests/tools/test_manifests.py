"""The TFJob overlay (k8s/engines/tfjob/sync), rendered by the real renderer and checked against the real schemas,
the Kubeflow SDK's TFJob model, the training operator's webhook rules, the settings and the
trainer's exit codes. No cluster is involved: these are the checks that can run offline."""

from __future__ import annotations

import copy
import json
import pathlib
import re
import subprocess

import kubernetes_validate
import pytest

from k8s.engines.tfjob import admission as tfjob_admission
from k8s.engines.tfjob import cluster as tfjob_cluster
from scripts.common import manifest as tfjob_manifest
from scripts.common import settings as project_settings
from scripts.localrun.envvars import EnvResolver, PodMeta, Problems, expand

ROOT = pathlib.Path(__file__).resolve().parents[2]
SETTINGS = project_settings.load()
# Validate against the Kubernetes version the k3d cluster runs (K3S_IMAGE in k8s/base/settings.env).
K8S_VERSION = re.search(r":v(\d+\.\d+\.\d+)", SETTINGS["K3S_IMAGE"]).group(1)


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    return tfjob_manifest.render()


@pytest.fixture(scope="module")
def tfjob(rendered) -> dict:
    return tfjob_manifest.the_one(rendered, "TFJob")


def component(objects: list[dict], kind: str, name: str) -> dict:
    return tfjob_manifest.the_one(objects, kind, component=name)


def pod_env(objects: list[dict], container: dict, pod_spec: dict | None = None) -> dict[str, str]:
    """The container's variables as the kubelet resolves them (envFrom the settings ConfigMap, then env), by
    run-local's resolver."""
    config_maps = {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == "ConfigMap"}
    problems = Problems()
    pod = PodMeta(name="pod", namespace=SETTINGS["NAMESPACE"])
    env = EnvResolver(config_maps).resolve(container, pod_spec or {"containers": [container]}, "test", problems, pod)
    assert not problems.errors, problems.errors
    return env


def validate_core_object(obj: dict) -> None:
    kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def as_pod_template(template: dict) -> dict:
    """A PodTemplateSpec wrapped in the core PodTemplate kind, so the schema validator can find it."""
    return {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "tfjob-worker"}, "template": template}


def image_entrypoint() -> list[str]:
    """The Dockerfile's ENTRYPOINT (exec form)."""
    match = re.search(r"^ENTRYPOINT (\[.*\])$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    return json.loads(match.group(1))


def image_user() -> tuple[int, int]:
    uid, gid = re.search(r"^USER (\d+):(\d+)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE).groups()
    return int(uid), int(gid)


def test_the_tfjob_runs_the_trainer_through_the_images_entrypoint(rendered):
    entrypoint = image_entrypoint()
    assert entrypoint[-3:] == ["python", "-m", "trainer"]
    # The other pods override the command, so they name the same init (tini) the ENTRYPOINT uses.
    for obj in rendered:
        if obj["kind"] in ("Job", "Deployment"):
            command = obj["spec"]["template"]["spec"]["containers"][0]["command"]
            assert command[: len(entrypoint) - 2] == entrypoint[:-2], command


def test_every_pod_runs_as_the_images_user(rendered):
    uid, gid = image_user()
    for obj in rendered:
        for template in tfjob_manifest.pod_templates(obj):
            context = template["spec"]["securityContext"]
            assert (context["runAsUser"], context["runAsGroup"], context["runAsNonRoot"]) == (uid, gid, True)


def test_renders_every_object_and_no_settings_configmap(rendered):
    kinds = sorted(obj["kind"] for obj in rendered)
    assert kinds == ["ConfigMap", "Deployment", "Job", *["NetworkPolicy"] * 3, "PersistentVolumeClaim", "Service"] + [
        "Service",
        "TFJob",
    ]
    # The one ConfigMap is the pods' environment: the trainer's variables and the four settings the manifests expand,
    # no pin and no tool's setting; the replacements' source stays out.
    settings = tfjob_manifest.the_one(rendered, "ConfigMap")
    assert settings["metadata"]["name"] == f"{SETTINGS['JOB_NAME']}-settings"
    expanded = {key: SETTINGS[key] for key in ("JOB_NAME", "MODEL_ROOT", "WORKERS", "TFJOB_PORT")}
    assert settings["data"] == {**project_settings.load_file(project_settings.TRAINER_FILE), **expanded}


def test_every_core_object_is_valid_against_the_kubernetes_schemas_strictly(rendered):
    core = [obj for obj in rendered if obj["kind"] != "TFJob"]
    assert len(core) == 9
    for obj in core:
        validate_core_object(obj)


def test_the_tfjob_pod_template_is_a_valid_pod_template_strictly(tfjob):
    for replica in tfjob["spec"]["tfReplicaSpecs"].values():
        validate_core_object(as_pod_template(replica["template"]))


def test_strict_validation_rejects_a_misspelt_field(tfjob):
    template = copy.deepcopy(tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"])
    template["spec"]["containers"][0]["volumeMounts"][0]["mountPth"] = "/typo"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate_core_object(as_pod_template(template))


def test_tfjob_deserializes_into_the_sdk_model_without_losing_a_field(tfjob):
    model = tfjob_cluster.to_tfjob(tfjob)
    assert type(model).__name__ == "KubeflowOrgV1TFJob"
    assert tfjob_cluster.sdk_request_body(model) == tfjob


def test_tfjob_passes_the_operator_webhook_rules(tfjob):
    assert tfjob_admission.webhook_problems(tfjob) == []


@pytest.mark.parametrize(
    "breakage, complaint",
    [
        (lambda job: job["metadata"].update(name="Multi_Worker"), "DNS-1035"),
        (lambda job: job["metadata"].update(name="9lives"), "DNS-1035"),
        (
            lambda job: job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].update(name="tf"),
            "container named 'tensorflow'",
        ),
        (
            lambda job: job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].update(image=""),
            "image is required",
        ),
        (
            lambda job: job["spec"]["tfReplicaSpecs"].update(
                Chief=copy.deepcopy(job["spec"]["tfReplicaSpecs"]["Worker"]),
                Master=copy.deepcopy(job["spec"]["tfReplicaSpecs"]["Worker"]),
            ),
            "more than 1 Chief or Master",
        ),
    ],
)
def test_webhook_rules_reject_what_the_operator_rejects(tfjob, breakage, complaint):
    broken = copy.deepcopy(tfjob)
    breakage(broken)
    problems = tfjob_admission.webhook_problems(broken)
    assert any(complaint in problem for problem in problems), problems


def test_tfjob_takes_its_names_ports_and_counts_from_settings(rendered, tfjob):
    assert tfjob["apiVersion"] == "kubeflow.org/v1"
    assert tfjob["metadata"]["name"] == SETTINGS["JOB_NAME"]
    worker = tfjob["spec"]["tfReplicaSpecs"]["Worker"]
    assert list(tfjob["spec"]["tfReplicaSpecs"]) == ["Worker"]
    assert worker["replicas"] == int(SETTINGS["WORKERS"])
    container = tfjob_admission.trainer_container(tfjob)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"tfjob-port": int(SETTINGS["TFJOB_PORT"]), "status": int(SETTINGS["TRAINER_STATUS_PORT"])}
    assert container["image"] == SETTINGS["IMAGE_NAME"]
    assert "command" not in container, "the image's ENTRYPOINT runs the trainer; see the Dockerfile test"
    trainer_settings = {key: SETTINGS[key] for key in SETTINGS if key.startswith("TRAINER_")}
    assert trainer_settings.items() <= pod_env(rendered, container, worker["template"]["spec"]).items()
    claims = [v["persistentVolumeClaim"] for v in worker["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert [claim["claimName"] for claim in claims] == [SETTINGS["VOLUME_CLAIM"]]


def test_every_pod_mounts_the_claim_where_the_trainer_paths_point(rendered):
    mount = SETTINGS["MOUNT_PATH"].rstrip("/") + "/"
    assert SETTINGS["TRAINER_DATA_DIR"].startswith(mount) and SETTINGS["MODEL_ROOT"].startswith(mount)
    pods = [t for obj in rendered for t in tfjob_manifest.pod_templates(obj)]
    assert len(pods) == 3
    for template in pods:
        volumes = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in template["spec"]["volumes"]}
        for container in template["spec"]["containers"]:
            mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
            # The volume, and the pod's own scratch emptyDir where its read-only root needs a writable /tmp.
            assert mounts == {"training-volume": SETTINGS["MOUNT_PATH"], "scratch": "/tmp"}
            assert volumes == {"training-volume": SETTINGS["VOLUME_CLAIM"], "scratch": None}
            for key, value in pod_env(rendered, container, template["spec"]).items():
                if key.startswith("TRAINER_") and key.endswith("_DIR") and value:  # empty: the trainer's default
                    assert value.startswith(mount), (key, value)


def test_volume_claim_has_the_configured_name_and_size(rendered):
    claim = tfjob_manifest.the_one(rendered, "PersistentVolumeClaim")
    assert claim["metadata"]["name"] == SETTINGS["VOLUME_CLAIM"]
    assert claim["spec"]["resources"]["requests"]["storage"] == SETTINGS["VOLUME_SIZE"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]


def test_data_preparation_job_prepares_the_dataset_the_trainer_reads(rendered, tfjob):
    job = component(rendered, "Job", "prepare-data")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == [*image_entrypoint()[:-1], "trainer.data"]
    assert not container.get("args")  # its dataset and data dir are the settings the trainer reads, below
    trainer = tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    trainer_env = pod_env(rendered, tfjob_admission.trainer_container(tfjob), trainer)
    data_env = pod_env(rendered, container, job["spec"]["template"]["spec"])
    for key in DATA_SETTINGS:
        assert trainer_env.get(key) == data_env.get(key), key


# What says which data there is: the data Job checks exactly what the trainer will read.
DATA_SETTINGS = (
    "TRAINER_MODULE",
    "TRAINER_DATASET",
    "TRAINER_DATA_DIR",
    "TRAINER_TRAIN_FILES",
    "TRAINER_TEST_FILES",
    "TRAINER_IMAGE_SHAPE",
    "TRAINER_NUM_CLASSES",
    "TRAINER_IMAGE_FEATURE",
    "TRAINER_LABEL_FEATURE",
    "TRAINER_ON_CORRUPT_RECORD",
)


def test_a_users_files_in_the_settings_reach_the_trainer_and_the_data_job_alike(monkeypatch):
    # As `TRAINER_TRAIN_FILES=... make submit` exports it: the environment overrides settings.env.
    files = {
        "TRAINER_DATASET": "tfrecord",
        "TRAINER_TRAIN_FILES": "/mnt/training/data/mine/train-*",
        "TRAINER_TEST_FILES": "/mnt/training/data/mine/test-*",
        "TRAINER_IMAGE_SHAPE": "64x64x3",
        "TRAINER_NUM_CLASSES": "5",
    }
    for key, value in files.items():
        monkeypatch.setenv(key, value)
    objects = tfjob_manifest.render()
    job = component(objects, "Job", "prepare-data")
    data_env = pod_env(objects, job["spec"]["template"]["spec"]["containers"][0])
    trainer_env = pod_env(objects, tfjob_admission.trainer_container(tfjob_manifest.the_one(objects, "TFJob")))
    assert {key: data_env[key] for key in files} == {key: trainer_env[key] for key in files} == files


def test_a_fork_module_alone_names_the_dataset_of_the_trainer_and_the_data_job(monkeypatch):
    # As `make submit TRAINER_MODULE=...` with no DATASET=: the module's one dataset, not the trainer's default, for
    # both (the settings once carried TRAINER_DATASET=fashion_mnist, which every pod read as the user's choice).
    monkeypatch.setenv("TRAINER_MODULE", "examples.regression")
    objects = tfjob_manifest.render()
    data = component(objects, "Job", "prepare-data")["spec"]["template"]["spec"]["containers"][0]
    trainer = tfjob_admission.trainer_container(tfjob_manifest.the_one(objects, "TFJob"))
    for container in (data, trainer):
        config = tfjob_manifest.trainer_config(container.get("args") or [], pod_env(objects, container))
        assert (config.module, config.dataset) == ("examples.regression", "linear_features"), container["name"]


def test_status_service_reaches_the_chief_of_this_job(rendered, tfjob):
    service = component(rendered, "Service", "training")
    assert service["spec"]["selector"] == {
        "training.kubeflow.org/job-name": SETTINGS["JOB_NAME"],
        "training.kubeflow.org/job-role": "master",
    }
    (port,) = service["spec"]["ports"]
    assert port["port"] == int(SETTINGS["TRAINER_STATUS_PORT"])
    names = {p["name"] for p in tfjob_admission.trainer_container(tfjob)["ports"]}
    assert port["targetPort"] in names


def test_tensorboard_reads_this_jobs_model_directory_on_the_volume(rendered, tfjob):
    deployment = component(rendered, "Deployment", "tensorboard")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = pod_env(rendered, container, deployment["spec"]["template"]["spec"])
    trainer = tfjob["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    model_dir = pod_env(rendered, tfjob_admission.trainer_container(tfjob), trainer)["TRAINER_MODEL_DIR"]
    assert model_dir == f"{SETTINGS['MODEL_ROOT']}/{SETTINGS['JOB_NAME']}"
    assert f"--logdir={model_dir}" in [expand(arg, env) for arg in container["args"]]
    assert container["volumeMounts"][0]["readOnly"] is True
    service = component(rendered, "Service", "tensorboard")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    # Only this job's TensorBoard: another job's in the namespace carries another instance label.
    assert service["spec"]["selector"]["app.kubernetes.io/instance"] == SETTINGS["JOB_NAME"]


def test_run_policy_matches_the_trainer_exit_codes(tfjob):
    from trainer.base.errors import ExitCode

    worker = tfjob["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["restartPolicy"] == "ExitCode"
    # The operator (v1.9) recreates a pod that exited >= 128 and fails the job on 1-127.
    codes = {code.name: code.value for code in ExitCode}
    assert codes.pop("OK") == 0
    assert 1 <= codes.pop("BAD_CONFIG") <= 127
    assert 1 <= codes.pop("VOLUME_FULL") <= 127  # a full volume does not heal by restarting: permanent
    assert 1 <= codes.pop("DIVERGED") <= 127  # non-finite training: the same data would do it again
    assert codes and all(128 <= value <= 255 for value in codes.values()), codes
    policy = tfjob["spec"]["runPolicy"]
    # Running: a failed job's running pods are deleted (v1.9.4 common/job.go); finished pods and logs stay.
    assert policy["cleanPodPolicy"] == "Running"
    assert policy["backoffLimit"] >= 1 and policy["activeDeadlineSeconds"] > 0
    assert policy["ttlSecondsAfterFinished"] >= 86400
    assert tfjob["spec"]["successPolicy"] == "AllWorkers"


def test_the_trainers_threads_are_the_pods_cpu_limit(tfjob):
    # TensorFlow would size its pools to the node's cores and be throttled to the limit; the kubelet writes
    # the limit (whole CPUs, rounded up) into TRAINER_THREADS, which the trainer's --threads reads.
    container = tfjob_admission.trainer_container(tfjob)
    (threads,) = [entry for entry in container["env"] if entry["name"] == "TRAINER_THREADS"]
    assert threads == {
        "name": "TRAINER_THREADS",
        "valueFrom": {
            # No containerName: in a container's env the downward API reads that container's own limit.
            "resourceFieldRef": {"resource": "limits.cpu", "divisor": "1"}
        },
    }
    assert "cpu" in container["resources"]["limits"]
    from trainer.context import parse_config

    assert parse_config([], {"TRAINER_THREADS": "2"}).threads == 2


def test_every_container_has_resource_requests_and_a_memory_limit(rendered):
    for obj in rendered:
        for template in tfjob_manifest.pod_templates(obj):
            for container in template["spec"]["containers"]:
                assert {"cpu", "memory"} <= set(container["resources"]["requests"]), container["name"]
                assert "memory" in container["resources"]["limits"], container["name"]


def test_the_makefile_builds_the_image_name_the_manifests_run(tfjob):
    # make -n prints the submit command without running it; the tag is whatever IMAGE_TAG says.
    plan = subprocess.run(
        ["make", "-n", "submit", "IMAGE_TAG=rev123"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    submitted = re.search(r"-m scripts\.cluster\.submit --kustomize \S+ --image (\S+)", plan).group(1)
    assert submitted == f"{SETTINGS['IMAGE_NAME']}:rev123"
    assert submitted.rsplit(":", 1)[0] == tfjob_admission.trainer_container(tfjob)["image"]
