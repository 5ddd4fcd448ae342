"""k8s/: one base and an overlay per engine and strategy, each rendered by the real renderer. Every overlay renders,
runs the same trainer pod (written once in k8s/base/trainer-pod.yaml), reads the settings through one ConfigMap,
and make picks the overlay from ENGINE and STRATEGY. A TRAINER_* line added to settings.env reaches every engine's
trainer pods and the data Job, as the kubelet would resolve their variables."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess

import kubernetes_validate
import pytest

import engines_here
from scripts.common import manifest
from scripts.common import settings as project_settings
from scripts.localrun import manifests as local_manifests
from scripts.localrun.engine_modules import local_run
from scripts.localrun.envvars import Problems
from scripts.localrun.podplan import Planner, settings_of

ROOT = pathlib.Path(__file__).resolve().parents[2]
SETTINGS = project_settings.load()
K8S_VERSION = re.search(r":v(\d+\.\d+\.\d+)", SETTINGS["K3S_IMAGE"]).group(1)
OVERLAYS = [(engine, strategy) for engine in manifest.ENGINES for strategy in manifest.STRATEGIES]
ENGINE_KIND = {"tfjob": "TFJob", "jobset": "JobSet", "trainjob": "TrainJob"}
# The shared pieces of the trainer's pod (k8s/base/trainer-pod.yaml), identical in every engine's templates.
SHARED_CONTAINER = ("image", "imagePullPolicy", "envFrom", "resources", "volumeMounts")
SHARED_POD = ("securityContext", "volumes")


@pytest.fixture(scope="module")
def rendered(rendered_overlays) -> dict[tuple[str, str], list[dict]]:
    return rendered_overlays


def test_the_overlays_are_exactly_one_per_engine_and_strategy():
    for engine in manifest.ENGINES:
        overlays = sorted(p.parent.name for p in (ROOT / "k8s" / "engines" / engine).glob("*sync/kustomization.yaml"))
        assert set(overlays) >= set(manifest.STRATEGIES), (engine, overlays)
    assert not (ROOT / "k8s" / "overlays").exists() and not (ROOT / "k8s-async").exists()


@pytest.mark.parametrize("engine, strategy", OVERLAYS)
def test_each_overlay_renders_its_engine_with_the_base(rendered, engine, strategy):
    objects = rendered[engine, strategy]
    assert manifest.engine_of(objects) == engine
    kinds = sorted(obj["kind"] for obj in objects)
    engine_kinds = {"tfjob": ["TFJob"], "jobset": ["JobSet"], "trainjob": ["TrainJob", "TrainingRuntime"]}[engine]
    base = ["ConfigMap", "Deployment", "Job", *["NetworkPolicy"] * 3, "PersistentVolumeClaim", "Service", "Service"]
    assert kinds == sorted(base + engine_kinds)
    assert all(obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "tf-multiworker-trainer" for obj in objects)
    # Every pod template, the engine's included, is a valid core PodTemplateSpec (strict schema).
    for obj in objects:
        for template in manifest.pod_templates(obj):
            pod_template = {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": template}
            kubernetes_validate.validate(pod_template, K8S_VERSION, strict=True)


def test_every_engine_runs_the_same_trainer_pod(rendered):
    pods = {(engine, strategy): manifest.trainer_templates(objects) for (engine, strategy), objects in rendered.items()}
    first = pods["tfjob", "sync"][0]
    for key, templates in pods.items():
        assert len(templates) == (1 if key[1] == "sync" else 4), key
        for template in templates:
            container = manifest.trainer_of(template)
            assert container is template["spec"]["containers"][0]
            for field in SHARED_CONTAINER:
                if field == "resources" and template is not templates[0] and key[1] == "async":
                    continue  # the async ps and evaluator ask for less
                assert container[field] == manifest.trainer_of(first)[field], (key, field)
            for field in SHARED_POD:
                assert template["spec"][field] == first["spec"][field], (key, field)
            assert {"name": "status", "containerPort": int(SETTINGS["TRAINER_STATUS_PORT"])} in container["ports"]
            assert container["envFrom"] == [{"configMapRef": {"name": f"{SETTINGS['JOB_NAME']}-settings"}}]


@pytest.mark.parametrize("engine", [engine for (engine,) in engines_here.present(("jobset",), ("trainjob",))])
def test_the_status_service_selects_the_chiefs_pod(rendered, engine):
    for strategy, chief_job in (("sync", "node" if engine == "trainjob" else "worker"), ("async", "chief")):
        service = manifest.the_one(rendered[engine, strategy], "Service", component="training")
        assert service["spec"]["selector"] == {
            "jobset.sigs.k8s.io/jobset-name": SETTINGS["JOB_NAME"],
            "jobset.sigs.k8s.io/replicatedjob-name": chief_job,
            "jobset.sigs.k8s.io/job-index": "0",
            "batch.kubernetes.io/job-completion-index": "0",
        }
        assert service["metadata"]["name"] == f"{SETTINGS['JOB_NAME']}-status"


@engines_here.needs("trainjob")
def test_the_trainjob_runtime_is_plain_ml_with_the_names_trainer_v2_requires(rendered):
    for strategy in manifest.STRATEGIES:
        objects = rendered["trainjob", strategy]
        trainjob = manifest.the_one(objects, "TrainJob")
        runtime = engines_here.part("trainjob", "local_run").runtime_of(objects)
        assert trainjob["spec"]["runtimeRef"] == {
            "apiGroup": "trainer.kubeflow.org",
            "kind": "TrainingRuntime",
            "name": runtime["metadata"]["name"],
        }
        assert trainjob["spec"]["trainer"]["numNodes"] == int(SETTINGS["WORKERS"])
        assert runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "tensorflow"
        assert runtime["spec"]["mlPolicy"] == {"numNodes": int(SETTINGS["WORKERS"])}  # plainML: numNodes only
        jobs = runtime["spec"]["template"]["spec"]["replicatedJobs"]
        ancestor = {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
        trainers = [j for j in jobs if j["template"].get("metadata", {}).get("labels", {}) == ancestor]
        assert [j["name"] for j in trainers] == ["node"]
        assert {c["name"] for j in jobs for c in j["template"]["spec"]["template"]["spec"]["containers"]} == {"node"}


def overlay_pods_env(k8s: pathlib.Path, engine: str, strategy: str, tmp_path: pathlib.Path) -> dict[str, dict]:
    """What the kubelet would give each trainer pod and the data Job of an overlay of the k8s/ tree `k8s`, by
    run-local's planner (the same resolution rules: envFrom, then env)."""
    objects = manifest.render(k8s / "engines" / engine / strategy)
    parsed = local_manifests.parse(objects, engine)
    problems = Problems()
    planner = Planner(parsed, tmp_path / f"{engine}-{strategy}", problems)
    pods = local_run(parsed.kind).plan(planner)[0]
    plans = {f"{engine}-{strategy} {plan.name}": plan for _, plan in pods}
    plans.update({f"{engine}-{strategy} {plan.name}": plan for plan in planner.preparation_jobs()})
    assert not problems.errors, problems.errors
    return plans


def test_one_line_in_trainer_env_adds_a_trainer_setting_to_every_engines_pods_and_the_data_job(tmp_path):
    k8s = tmp_path / "k8s"
    shutil.copytree(ROOT / "k8s", k8s)
    with (k8s / "base" / "trainer.env").open("a") as settings:
        settings.write("TRAINER_PER_WORKER_BATCH_SIZE=96\n")
    seen = {}
    for engine, strategy in OVERLAYS:
        for name, plan in overlay_pods_env(k8s, engine, strategy, tmp_path).items():
            seen[name] = plan.env.get("TRAINER_PER_WORKER_BATCH_SIZE")
            if "prepare-data" not in name:
                assert settings_of(plan).per_worker_batch_size == 96, name  # the trainer's own parser reads it
    # Every pod of every overlay: per engine, sync 2 workers + the data Job, async 5 tasks + the data Job.
    assert len(seen) == len(manifest.ENGINES) * (3 + 6), sorted(seen)
    assert set(seen.values()) == {"96"}, {name: value for name, value in seen.items() if value != "96"}
    assert any("prepare-data" in name for name in seen)
    # Without the line, nothing sets it: the value came from that one line.
    plain = overlay_pods_env(ROOT / "k8s", manifest.ENGINES[-1], "sync", tmp_path / "plain")
    assert {plan.env.get("TRAINER_PER_WORKER_BATCH_SIZE") for plan in plain.values()} == {None}


@pytest.mark.parametrize("target", ["run-local", "submit"])
@pytest.mark.parametrize(
    "engine, strategy", engines_here.present(("jobset", "sync"), ("trainjob", "async"), ("tfjob", "async"))
)
def test_make_picks_the_overlay_from_engine_and_strategy(target, engine, strategy):
    dry = subprocess.run(
        ["make", "-n", target, f"ENGINE={engine}", f"STRATEGY={strategy}"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert f"--kustomize k8s/engines/{engine}/{strategy} " in dry.stdout, dry.stdout + dry.stderr


@pytest.mark.parametrize("target", ["run-local", "submit", "k3d-up"])
def test_make_refuses_an_unknown_engine_naming_the_choices(target):
    typo = subprocess.run(
        ["make", "-n", target, "ENGINE=jobsets"], capture_output=True, text=True, cwd=ROOT, timeout=60
    )
    assert typo.returncode != 0
    assert f"ENGINE=jobsets is not an engine: use one of {' '.join(manifest.ENGINES)} (" in typo.stderr
    assert "k3d-up.sh" not in typo.stdout


def test_make_k3d_up_passes_the_engine_to_the_install_script():
    engine = manifest.ENGINES[-1]
    dry = subprocess.run(["make", "-n", "k3d-up", f"ENGINE={engine}"], capture_output=True, text=True, cwd=ROOT)
    assert f"ENGINE={engine} scripts/cluster/k3d-up.sh" in dry.stdout, dry.stdout + dry.stderr


def test_an_environment_override_reaches_every_overlay(monkeypatch):
    # make exports its settings; run-local and submit render a copy of k8s/ whose base/settings.env holds them.
    monkeypatch.setenv("JOB_NAME", "mine")
    for engine, strategy in engines_here.present(("tfjob", "async"), ("jobset", "async"), ("trainjob", "sync")):
        objects = manifest.render(manifest.overlay(engine, strategy))
        assert manifest.the_one(objects, ENGINE_KIND[engine])["metadata"]["name"] == "mine"
        assert manifest.the_one(objects, "ConfigMap")["data"]["JOB_NAME"] == "mine"
