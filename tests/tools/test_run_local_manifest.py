"""How run-local reads a pod template: env and its references, volumes, commands, ports and overrides."""

import math
import os
import pathlib
import subprocess
import sys

import pytest
import yaml

from k8s.engines.tfjob.local_run import plan as plan_tfjob
from scripts.common.manifest import IMAGE_ENTRYPOINT, customize, render
from scripts.localrun import manifests, run_local
from scripts.localrun.envvars import EnvResolver, Problems, expand
from scripts.localrun.podplan import Planner, without_init

ROOT = pathlib.Path(__file__).resolve().parents[2]


def tfjob(container=None, replicas=2, volumes=True, **spec):
    container = container or {"name": "tensorflow", "image": "img"}
    pod = {"containers": [container]}
    if volumes:
        pod["volumes"] = [{"name": "data", "persistentVolumeClaim": {"claimName": "vol"}}]
        container.setdefault("volumeMounts", [{"name": "data", "mountPath": "/mnt/training"}])
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": {"name": "demo"},
        "spec": {
            **spec,
            "tfReplicaSpecs": {
                "Worker": {"replicas": replicas, "restartPolicy": "ExitCode", "template": {"spec": pod}}
            },
        },
    }


def parsed(*docs):
    return manifests.parse(manifests.load_text(yaml.safe_dump_all(docs), "test"), "test")


def config_map(name, **data):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def test_expansion_follows_kubernetes_rules():
    assert expand("$(A)/x", {"A": "a"}) == "a/x"
    assert expand("$(MISSING)", {}) == "$(MISSING)"
    assert expand("$$(A) costs $5", {"A": "a"}) == "$(A) costs $5"


def test_env_from_config_map_then_env_entries_win_and_expand():
    resolver = EnvResolver({"cm": config_map("cm", A="1", B="2")})
    container = {
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "P_"}, {"configMapRef": {"name": "cm"}}],
        "env": [{"name": "A", "value": "override"}, {"name": "C", "value": "$(B)-$(P_A)"}],
    }
    problems = Problems()
    env = resolver.resolve(container, {"containers": [container]}, "w", problems)
    assert env == {"P_A": "1", "P_B": "2", "A": "override", "B": "2", "C": "2-1"}
    assert problems.errors == [] and problems.notes == []


def test_value_from_a_config_map_key_and_the_containers_resources():
    resolver = EnvResolver({"cm": config_map("cm", DIR="/mnt/training/data")})
    container = {
        "name": "tensorflow",
        "resources": {"requests": {"cpu": "500m", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}},
        "env": [
            {"name": "DIR", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "DIR"}}},
            {"name": "THREADS", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1"}}},
            {"name": "REQUESTED", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu"}}},
            {"name": "MILLICORES", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
            {"name": "MIB", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
            {"name": "SIDECAR", "valueFrom": {"resourceFieldRef": {"containerName": "side", "resource": "limits.cpu"}}},
        ],
    }
    side = {"name": "side", "resources": {"limits": {"cpu": "3"}}}
    problems = Problems()
    env = resolver.resolve(container, {"containers": [container, side]}, "w", problems)
    # The downward API rounds up: half a CPU requested reads as 1 with divisor 1, 500 with divisor 1m.
    assert env == {
        "DIR": "/mnt/training/data",
        "THREADS": "2",
        "REQUESTED": "1",
        "MILLICORES": "500",
        "MIB": "4096",
        "SIDECAR": "3",
    }
    assert problems.errors == []


@pytest.mark.parametrize(
    "limits, ref, expected",
    [
        ({"cpu": "1500m"}, {"resource": "limits.cpu", "divisor": "1"}, "2"),
        ({"cpu": "0.1"}, {"resource": "limits.cpu"}, "1"),
        ({"cpu": "1500m"}, {"resource": "limits.cpu", "divisor": "1m"}, "1500"),
        ({"memory": "1G"}, {"resource": "limits.memory", "divisor": "1Mi"}, "954"),
        ({"memory": "1000Ki"}, {"resource": "limits.memory", "divisor": "1Mi"}, "1"),
    ],
)
def test_resource_fields_are_rounded_up_to_the_divisor_as_the_kubelet_does(limits, ref, expected):
    # kubernetes pkg/api/v1/resource/helpers.go: convertResourceCPUToString and convertResourceMemoryToString
    # return math.Ceil(value / divisor) (CPU in millicores, memory in bytes).
    container = {
        "name": "tensorflow",
        "resources": {"limits": limits},
        "env": [{"name": "V", "valueFrom": {"resourceFieldRef": ref}}],
    }
    problems = Problems()
    assert EnvResolver({}).resolve(container, {"containers": [container]}, "w", problems) == {"V": expected}
    assert problems.errors == []


def test_each_replica_of_the_project_gets_the_threads_the_kubelet_would_give_its_pod(tmp_path):
    project = manifests.parse(render(), "k8s")
    problems = Problems()
    replicas = plan_tfjob(Planner(project, tmp_path, problems))[0]
    assert problems.errors == [] and len(replicas) >= 2
    (job,) = [obj for obj in render() if obj["kind"] == "TFJob"]
    limit = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"]
    assert [plan.env["TRAINER_THREADS"] for _, plan in replicas] == [str(math.ceil(float(limit)))] * len(replicas)


def test_an_unset_cpu_limit_reads_as_this_machines_cores():
    container = {
        "name": "tensorflow",
        "env": [{"name": "N", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}}],
    }
    env = EnvResolver({}).resolve(container, {"containers": [container]}, "w", Problems())
    assert env == {"N": str(os.cpu_count())}


def test_unresolvable_references_are_reported_not_dropped():
    resolver = EnvResolver({"settings-5fk8h2m9tc": config_map("settings-5fk8h2m9tc", A="1"), "cm": config_map("cm")})
    container = {
        "envFrom": [{"configMapRef": {"name": "settings"}}],
        "env": [
            {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "B"}}},
            {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "gone", "key": "C", "optional": True}}},
        ],
    }
    problems = Problems()
    env = resolver.resolve(container, {"containers": [container]}, "TFJob demo Worker 1", problems)
    assert env == {}
    assert len(problems.errors) == 2
    assert "no ConfigMap named 'settings'" in problems.errors[0] and "settings-5fk8h2m9tc" in problems.errors[0]
    assert "nameReference" in problems.errors[0]
    assert "has no key 'B'" in problems.errors[1]
    assert any("'gone'" in note and "optional" in note for note in problems.notes)


UNSUPPORTED = [
    (
        "env[T].valueFrom.secretKeyRef",
        lambda c, pod: c.setdefault("env", []).append(
            {"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "T"}}}
        ),
    ),
    (
        "env[P].valueFrom.fieldRef.fieldPath=spec.nodeName",
        lambda c, pod: c.setdefault("env", []).append(
            {"name": "P", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
        ),
    ),
    ("envFrom[0].secretRef", lambda c, pod: c.setdefault("envFrom", []).append({"secretRef": {"name": "s"}})),
    (
        "env[E].valueFrom.resourceFieldRef.resource=limits.ephemeral-storage",
        lambda c, pod: c.setdefault("env", []).append(
            {"name": "E", "valueFrom": {"resourceFieldRef": {"resource": "limits.ephemeral-storage"}}}
        ),
    ),
    ("volumes[host].hostPath", lambda c, pod: pod["volumes"].append({"name": "host", "hostPath": {"path": "/"}})),
    ("volumes[conf].configMap", lambda c, pod: pod["volumes"].append({"name": "conf", "configMap": {"name": "cm"}})),
    ("volumeMounts[data].subPath", lambda c, pod: c["volumeMounts"][0].update(subPath="model")),
]


@pytest.mark.parametrize("field, change", UNSUPPORTED, ids=[field for field, _ in UNSUPPORTED])
def test_what_run_local_does_not_emulate_is_refused_naming_the_field(tmp_path, field, change):
    job = tfjob()
    pod = job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]
    change(pod["containers"][0], pod)
    problems = Problems()
    plan_tfjob(Planner(parsed(job), tmp_path, problems))
    assert f"not supported locally: {field} (in TFJob demo Worker 0)" in problems.errors


def test_the_runner_stops_with_one_line_and_exit_2_before_starting_anything(tmp_path, capsys):
    job = tfjob()
    job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["volumes"].append(
        {"name": "tmp", "hostPath": {"path": "/"}}
    )
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(job))
    assert run_local.main(["--manifest", str(manifest), "--job-dir", str(tmp_path / "job")]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert "run-local: error: not supported locally: volumes[tmp].hostPath (in TFJob demo Worker 0)" in lines
    assert not (tmp_path / "job" / "run-local" / "logs").exists()


def test_volume_paths_in_env_args_and_flags_map_to_the_job_directory(tmp_path):
    container = {
        "name": "tensorflow",
        "image": "img",
        "command": ["python", "-m", "trainer"],
        "args": ["--model-dir=/mnt/training/model", "--data-dir", "$(DATA)", "--other=/mnt/trainingX"],
        "env": [{"name": "DATA", "value": "/mnt/training/data"}, {"name": "LIST", "value": "/mnt/training/a:/x"}],
    }
    planner = Planner(parsed(tfjob(container)), tmp_path / "job", Problems())
    (_, plan), _ = plan_tfjob(planner)[0]
    local = str((tmp_path / "job").resolve())
    assert plan.argv == [
        sys.executable,
        "-m",
        "trainer",
        f"--model-dir={local}/model",
        "--data-dir",
        f"{local}/data",
        "--other=/mnt/trainingX",
    ]
    assert plan.env["DATA"] == f"{local}/data" and plan.env["LIST"] == f"{local}/a:/x"
    assert plan.env["HOSTNAME"] == "demo-worker-0"


def test_without_a_command_the_image_entrypoint_runs_and_tini_is_dropped(tmp_path):
    container = {"name": "tensorflow", "image": "img", "args": ["--epochs", "1"]}
    (_, plan), _ = plan_tfjob(Planner(parsed(tfjob(container)), tmp_path, Problems()))[0]
    assert plan.argv == [sys.executable, "-m", "trainer", "--epochs", "1"]
    assert without_init(["/usr/bin/tini", "-g", "--", "python", "x.py"]) == ["python", "x.py"]


def test_the_image_entrypoint_is_the_dockerfiles():
    lines = [line for line in (ROOT / "Dockerfile").read_text().splitlines() if line.startswith("ENTRYPOINT")]
    assert yaml.safe_load(lines[-1].removeprefix("ENTRYPOINT").strip()) == list(IMAGE_ENTRYPOINT)


def test_named_ports_get_free_loopback_ports_and_only_tensorflow_gets_tf_config(tmp_path):
    container = {
        "name": "tensorflow",
        "image": "img",
        "ports": [{"name": "tfjob-port", "containerPort": 2222}, {"name": "status", "containerPort": 8080}],
        "env": [{"name": "TRAINER_STATUS_PORT", "value": "8080"}],
    }
    job = tfjob(container)
    job["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"].append({"name": "sidecar", "image": "x"})
    problems = Problems()
    (_, first), (_, second) = plan_tfjob(Planner(parsed(job), tmp_path, problems))[0]
    assert first.ports["status"][0] == 8080 and first.env["TRAINER_STATUS_PORT"] == str(first.ports["status"][1])
    assert first.ports["status"][1] != second.ports["status"][1]
    assert first.env["TRAINER_STATUS_HOST"] == "127.0.0.1"
    assert '"task":{"type":"worker","index":1}' in second.env["TF_CONFIG"]
    assert any("'sidecar' is not run locally" in note for note in problems.notes)


def test_a_single_replica_gets_no_tf_config_even_if_the_shell_has_one(tmp_path, monkeypatch):
    monkeypatch.setenv("TF_CONFIG", '{"stale": true}')
    monkeypatch.setenv("TRAINER_EPOCHS", "99")
    ((_, plan),) = plan_tfjob(Planner(parsed(tfjob(replicas=1)), tmp_path, Problems()))[0]
    assert "TF_CONFIG" not in plan.env and "TRAINER_EPOCHS" not in plan.env


def test_overrides_scale_workers_and_set_dataset_epochs_and_flags_without_editing_yaml():
    container = {
        "name": "tensorflow",
        "image": "img",
        "args": ["--dataset=mnist"],
        "env": [{"name": "TRAINER_EPOCHS", "value": "5"}],
    }
    prep = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "demo-prepare-data"},
        "spec": {"template": {"spec": {"containers": [{"name": "p", "image": "img", "args": ["--dataset", "mnist"]}]}}},
    }
    objects = customize(
        [tfjob(container), prep], workers=3, dataset="synthetic", epochs=1, trainer_args=["--seed", "7"]
    )
    result = manifests.parse(objects, "test")
    worker = result.job["spec"]["tfReplicaSpecs"]["Worker"]
    tf_container = worker["template"]["spec"]["containers"][0]
    assert worker["replicas"] == 3
    assert tf_container["args"] == ["--dataset=synthetic", "--seed", "7"]
    assert {"name": "TRAINER_EPOCHS", "value": "1"} in tf_container["env"]
    assert {"name": "TRAINER_DATASET", "value": "synthetic"} in tf_container["env"]
    # The data preparation reads the trainer's flags, so it gets the same ones (the files it checks).
    prep_args = result.jobs[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert prep_args == ["--dataset", "synthetic", "--seed", "7"]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda j: j["metadata"].update(name="Demo_1"), "DNS-1035"),
        (
            lambda j: j["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].update(name="main"),
            "no container named 'tensorflow'",
        ),
        (lambda j: j["spec"]["tfReplicaSpecs"].update(Chief={"replicas": 2}), "at most one Chief"),
        (lambda j: j["spec"]["tfReplicaSpecs"]["Worker"].update(restartPolicy="Sometimes"), "restartPolicy"),
        (lambda j: j["spec"].update(runPolicy={"suspend": True}), "the operator would start no pod"),
    ],
)
def test_jobs_the_operator_webhook_rejects_are_rejected(change, message):
    job = tfjob()
    change(job)
    with pytest.raises(manifests.ManifestError, match=message):
        parsed(job)


def test_the_projects_kustomization_renders_to_a_runnable_tfjob(tmp_path):
    project = manifests.parse(render(), "k8s")
    problems = Problems()
    planner = Planner(project, tmp_path, problems)
    replicas = plan_tfjob(planner)[0]
    assert problems.errors == []
    assert [plan.name for _, plan in replicas] == [f"worker-{i}" for i in range(len(replicas))]
    assert all(plan.argv[:3] == [sys.executable, "-m", "trainer"] for _, plan in replicas)
    assert all(plan.env["TRAINER_MODEL_DIR"].startswith(str(tmp_path.resolve())) for _, plan in replicas)
    (prepare,) = planner.preparation_jobs()
    assert prepare.argv[:3] == [sys.executable, "-m", "trainer.data"]
    assert prepare.env["TRAINER_DATA_DIR"] == replicas[0][1].env["TRAINER_DATA_DIR"]


def test_command_expansion_sees_only_the_containers_variables(tmp_path, monkeypatch):
    monkeypatch.setenv("FROM_MY_SHELL", "leak")
    container = {
        "name": "tensorflow",
        "image": "img",
        "args": ["$(FROM_MY_SHELL)", "$(OWN)"],
        "env": [{"name": "OWN", "value": "mine"}],
    }
    (_, plan), _ = plan_tfjob(Planner(parsed(tfjob(container)), tmp_path, Problems()))[0]
    assert plan.argv[-2:] == ["$(FROM_MY_SHELL)", "mine"]


def test_submit_and_run_local_apply_the_command_line_to_a_chief_replica_alike(tmp_path, monkeypatch):
    """A fork that adds a Chief: its trainer gets the same epochs, dataset and flags from both paths."""
    submit = pytest.importorskip("scripts.cluster.submit", reason="the cluster room is not part of this project")

    job = tfjob({"name": "tensorflow", "image": "img", "args": ["--epochs", "5"]})
    job["spec"]["tfReplicaSpecs"]["Chief"] = {
        "replicas": 1,
        "restartPolicy": "ExitCode",
        "template": {"spec": {"containers": [{"name": "tensorflow", "image": "img"}]}},
    }
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(job))
    monkeypatch.setattr(submit.tfjob_manifest, "render", lambda k8s_dir=None: [job])
    command_line = ["--workers", "3", "--dataset", "synthetic", "--epochs", "2", "--", "--seed", "7"]

    objects = submit.build_objects(submit.parse_args(["--image", "img", *command_line]))
    submitted = submit.tfjob_manifest.the_one(objects, "TFJob")
    local = run_local.load(run_local.parse_args(["--manifest", str(manifest), *command_line])).job

    assert submitted["spec"] == local["spec"]
    chief = submitted["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"][0]
    assert chief["args"] == ["--seed", "7"]
    assert {"name": "TRAINER_EPOCHS", "value": "2"} in chief["env"]
    assert {"name": "TRAINER_DATASET", "value": "synthetic"} in chief["env"]
    worker = submitted["spec"]["tfReplicaSpecs"]["Worker"]
    assert worker["replicas"] == 3
    assert worker["template"]["spec"]["containers"][0]["args"] == ["--epochs", "2", "--seed", "7"]


def test_each_pod_gets_its_own_empty_scratch_dir_where_its_temporary_files_and_home_go(tmp_path):
    # The pods' root filesystem is read-only: TMPDIR and HOME point at the scratch emptyDir mounted at /tmp, and
    # run-local gives each pod a fresh local directory for it, which a process here then writes into.
    project = manifests.parse(render(), "k8s")
    stale = tmp_path / "run-local" / "pods" / f"{project.name}-worker-0" / "scratch" / "left-by-an-earlier-run"
    stale.parent.mkdir(parents=True)
    stale.write_text("x")
    plans = [plan for _, plan in plan_tfjob(Planner(project, tmp_path, Problems()))[0]]
    scratch = [tmp_path.resolve() / "run-local" / "pods" / plan.pod_name / "scratch" for plan in plans]
    assert [plan.env["TMPDIR"] for plan in plans] == [str(path) for path in scratch]
    assert [plan.env["HOME"] for plan in plans] == [str(path) for path in scratch]
    assert len(set(scratch)) == len(plans) and all(path.is_dir() and not any(path.iterdir()) for path in scratch)
    written = subprocess.run(
        [sys.executable, "-c", "import os, tempfile; print(tempfile.gettempdir(), os.path.expanduser('~'))"],
        env=plans[0].env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert written == [str(scratch[0])] * 2


def test_tfjob_pods_read_their_name_namespace_uid_and_operator_labels_through_the_downward_api(tmp_path):
    field = lambda name, path: {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}  # noqa: E731
    container = {
        "name": "tensorflow",
        "image": "img",
        "env": [
            field("POD", "metadata.name"),
            field("NS", "metadata.namespace"),
            field("UID", "metadata.uid"),
            field("ROLE", "metadata.labels['training.kubeflow.org/job-role']"),
        ],
    }
    problems = Problems()
    plans = [plan for _, plan in plan_tfjob(Planner(parsed(tfjob(container)), tmp_path, problems))[0]]
    assert problems.errors == []
    assert [(plan.env["POD"], plan.env["NS"], plan.env["ROLE"]) for plan in plans] == [
        ("demo-worker-0", "default", "master"),
        ("demo-worker-1", "default", ""),
    ]
    assert len({plan.env["UID"] for plan in plans}) == 2
