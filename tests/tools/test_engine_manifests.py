"""The JobSet and TrainJob manifests checked offline as strictly as the TFJob (test_manifests.py): each custom
resource against its CRD's schema at the pinned tag (vendored in fixtures/crds, unknown fields refused), every Job
and pod template against the Kubernetes schemas, the kubeflow-trainer-api models, the kubeflow SDK's reading of the
runtime, and the JobSet and Trainer v2 webhook rules read from their source (each engine's admission.py in
k8s/engines/).

What is checked: the fixtures in fixtures/engines (written from FIELD-NOTES before the overlays existed) and every
JobSet/TrainJob overlay that `kubectl kustomize k8s/engines/<engine>/<strategy>` renders. No cluster is involved.
"""

from __future__ import annotations

import copy
import pathlib
import re
import shutil
import subprocess

import jsonschema
import kubernetes_validate
import pytest
import yaml

import crd_schemas
import engines_here
from k8s.engines.tfjob import cluster as tfjob_cluster
from pod_security import pod_templates
from scripts.common import job_engine
from scripts.common import manifest as tfjob_manifest
from scripts.common import settings as project_settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures" / "engines"
SETTINGS = project_settings.load()
K8S_VERSION = re.search(r":v(\d+\.\d+\.\d+)", SETTINGS["K3S_IMAGE"]).group(1)
CUSTOM_KINDS = ("JobSet", "TrainJob", "TrainingRuntime", "ClusterTrainingRuntime", "TFJob")
OVERLAYS = sorted(
    tfjob_manifest.overlay(engine, strategy).relative_to(ROOT).as_posix()
    for engine in ("jobset", "trainjob")
    if engine in tfjob_manifest.ENGINES
    for strategy in tfjob_manifest.STRATEGIES
)
# The fixtures of the engines this checkout holds (jobset-*.yaml is JobSet's): a fork that deleted one keeps the rest.
SOURCES = sorted(p.name for p in FIXTURES.glob("*.yaml") if p.name.split("-")[0] in tfjob_manifest.ENGINES) + OVERLAYS


def runtime_of(objects):
    """The runtime the manifests' TrainJob names, as Trainer's folder finds it."""
    return engines_here.part("trainjob", "local_run").runtime_of(objects)


def load(source: str) -> list[dict]:
    if source.endswith(".yaml"):
        return [doc for doc in yaml.safe_load_all((FIXTURES / source).read_text()) if doc]
    return tfjob_manifest.render(ROOT / source)


@pytest.fixture(scope="module", params=SOURCES)
def objects(request) -> list[dict]:
    return load(request.param)


def jobset_specs(objects: list[dict]) -> list[tuple[str, dict]]:
    """(name, spec) of every JobSet that would reach JobSet's webhook: a JobSet, or the one a TrainJob makes."""
    specs = [(obj["metadata"]["name"], obj["spec"]) for obj in objects if obj["kind"] == "JobSet"]
    for trainjob in (obj for obj in objects if obj["kind"] == "TrainJob"):
        runtime = runtime_of(objects)
        specs.append(
            (
                trainjob["metadata"]["name"],
                engines_here.part("trainjob", "admission").trainjob_jobset_spec(trainjob, runtime),
            )
        )
    return specs


@engines_here.needs("jobset")  # trainjob builds on it: without it, no source is left
def test_every_source_renders_one_job_of_a_new_engine():
    assert len(SOURCES) >= 2
    for source in SOURCES:
        assert job_engine.engine_kind(load(source)) in ("JobSet", "TrainJob"), source


def test_every_custom_resource_is_valid_against_its_crd_schema_strictly(objects):
    custom = [obj for obj in objects if obj["kind"] in CUSTOM_KINDS]
    assert custom
    for obj in custom:
        crd_schemas.validate(obj)


def test_every_job_and_pod_template_is_a_valid_kubernetes_object_strictly(objects):
    checked = 0
    for name, spec in jobset_specs(objects):
        for rjob in spec["replicatedJobs"]:
            job = {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": f"{name}-{rjob['name']}-0", **(rjob["template"].get("metadata") or {})},
                "spec": rjob["template"]["spec"],
            }
            kubernetes_validate.validate(job, K8S_VERSION, strict=True)
            checked += 1
    assert checked


@pytest.mark.parametrize(
    "kind, path, typo",
    [
        ("JobSet", ("spec", "failurePolicy"), "maxRestart"),
        ("JobSet", ("spec", "network"), "enableDnsHostnames"),
        ("TrainJob", ("spec", "trainer"), "numNode"),
        ("TrainingRuntime", ("spec", "mlPolicy"), "numNode"),
    ],
)
def test_strict_schema_validation_rejects_a_misspelt_field(kind, path, typo):
    objects = load("jobset-async.yaml") + load("trainjob-sync.yaml")
    broken = copy.deepcopy(next(obj for obj in objects if obj["kind"] == kind))
    node = broken
    for key in path:
        node = node.setdefault(key, {})
    node[typo] = 1
    with pytest.raises(jsonschema.ValidationError, match=typo):
        crd_schemas.validate(broken)


def test_strict_schema_validation_rejects_a_duplicate_list_map_key():
    jobset = copy.deepcopy(load("jobset-async.yaml")[0])
    jobset["spec"]["replicatedJobs"].append(copy.deepcopy(jobset["spec"]["replicatedJobs"][0]))
    with pytest.raises(jsonschema.ValidationError, match="duplicate entry"):
        crd_schemas.validate(jobset)


def lost(original, through_model, path: str = "") -> list[str]:
    """Where the model's output drops or changes what the manifest says (defaults it adds, such as a port's
    protocol TCP, are not losses: the API server adds them too)."""
    if isinstance(original, dict) and isinstance(through_model, dict):
        return [p for key in original for p in lost(original[key], through_model.get(key), f"{path}.{key}")]
    if isinstance(original, list) and isinstance(through_model, list) and len(original) == len(through_model):
        return [
            p for i, (a, b) in enumerate(zip(original, through_model, strict=True)) for p in lost(a, b, f"{path}[{i}]")
        ]
    return [] if original == through_model else [path]


def test_the_trainer_api_models_read_every_field(objects):
    from kubeflow_trainer_api import models

    model_of = {
        "TrainJob": models.TrainerV1alpha1TrainJob,
        "TrainingRuntime": models.TrainerV1alpha1TrainingRuntime,
        "ClusterTrainingRuntime": models.TrainerV1alpha1ClusterTrainingRuntime,
    }
    checked = 0
    for obj in objects:
        if obj["kind"] in model_of:
            assert lost(obj, model_of[obj["kind"]].from_dict(obj).to_dict()) == [], obj["kind"]
            checked += 1
        if obj["kind"] == "JobSet":
            assert lost(obj["spec"], models.JobsetV1alpha2JobSetSpec.from_dict(obj["spec"]).to_dict()) == []
            checked += 1
    assert checked


def test_the_model_check_catches_a_field_the_model_does_not_know():
    from kubeflow_trainer_api import models

    trainjob = copy.deepcopy(next(obj for obj in load("trainjob-sync.yaml") if obj["kind"] == "TrainJob"))
    trainjob["spec"]["trainer"]["numNode"] = 3
    assert lost(trainjob, models.TrainerV1alpha1TrainJob.from_dict(trainjob).to_dict()) == [".spec.trainer.numNode"]


def test_the_kubeflow_sdk_reads_the_runtime_as_a_custom_trainer(objects):
    from kubeflow.trainer.backends.kubernetes import utils as sdk_utils
    from kubeflow.trainer.types import types as sdk_types
    from kubeflow_trainer_api import models

    if any(obj["kind"] == "TrainJob" for obj in objects):
        runtime = models.TrainerV1alpha1TrainingRuntime.from_dict(runtime_of(objects))
        trainer = sdk_utils.get_runtime_trainer(
            runtime.metadata.labels[engines_here.part("trainjob", "cluster").FRAMEWORK_LABEL],
            runtime.spec.template.spec.replicated_jobs,
            runtime.spec.ml_policy,
        )
        assert trainer.trainer_type == sdk_types.TrainerType.CUSTOM_TRAINER
        assert trainer.image and trainer.num_nodes >= 1


def test_every_job_passes_the_jobset_and_trainer_webhook_rules(objects):
    for name, spec in jobset_specs(objects):
        assert engines_here.part("jobset", "admission").jobset_problems(name, spec) == [], name
    for trainjob in (obj for obj in objects if obj["kind"] == "TrainJob"):
        assert engines_here.part("trainjob", "admission").trainjob_problems(trainjob, runtime_of(objects)) == []


def rjobs(spec: dict) -> list[dict]:
    return spec["replicatedJobs"]


@pytest.mark.parametrize(
    "name, breakage, complaint",
    [
        ("a" * 45, lambda spec: None, "pod name"),  # multi-worker-evaluator-0-0-abcde is 63
        ("Multi_Worker", lambda spec: None, "DNS-1035"),
        (None, lambda spec: spec["failurePolicy"]["rules"][0].update(name="permanent-error"), "no '-'"),
        (None, lambda spec: spec["failurePolicy"]["rules"].append(dict(spec["failurePolicy"]["rules"][0])), "unique"),
        (None, lambda spec: spec["failurePolicy"]["rules"][0].update(onJobFailureReasons=["OOMKilled"]), "reason"),
        (None, lambda spec: spec["failurePolicy"]["rules"][0].update(action="RestartJob"), "feature gate"),
        (None, lambda spec: spec["failurePolicy"]["rules"][0].update(targetReplicatedJobs=["workers"]), "not exist"),
        (None, lambda spec: spec["successPolicy"].update(targetReplicatedJobs=["workers"]), "does not appear"),
        (None, lambda spec: rjobs(spec).append(copy.deepcopy(rjobs(spec)[0])), "appears twice"),
        (None, lambda spec: rjobs(spec)[0].update(dependsOn=[{"name": "ps", "status": "Ready"}]), "first Replicated"),
        (None, lambda spec: rjobs(spec)[0].update(groupName="Group_1"), "groupName"),
        (None, lambda spec: spec["network"].update(subdomain="multi.worker"), "subdomain"),
        (
            None,
            lambda spec: (
                spec.update(startupPolicy={"startupPolicyOrder": "InOrder"}),
                rjobs(spec)[1].update(dependsOn=[{"name": "chief", "status": "Ready"}]),
            ),
            "mutually exclusive",
        ),
        (None, lambda spec: spec.update(coordinator={"replicatedJob": "leader"}), "coordinator"),
    ],
)
def test_jobset_rules_reject_what_jobsets_webhook_rejects(name, breakage, complaint):
    jobset = load("jobset-async.yaml")[0]
    spec = copy.deepcopy(jobset["spec"])
    breakage(spec)
    problems = engines_here.part("jobset", "admission").jobset_problems(name or jobset["metadata"]["name"], spec)
    assert any(complaint in problem for problem in problems), problems


def trainer_rjob(runtime: dict) -> dict:
    return runtime["spec"]["template"]["spec"]["replicatedJobs"][0]


@pytest.mark.parametrize(
    "breakage, complaint",
    [
        (lambda job, rt: trainer_rjob(rt).update(replicas=2), "always must be 1"),
        (
            lambda job, rt: trainer_rjob(rt)["template"]["spec"]["template"]["spec"]["containers"][0].update(name="tf"),
            "'node'",
        ),
        (lambda job, rt: rt["spec"]["mlPolicy"].update(torch={}, mpi={}), "only one of the policy"),
        (lambda job, rt: rt["metadata"]["labels"].clear(), "trainer.kubeflow.org/framework"),
        (lambda job, rt: job["metadata"].update(name="9lives"), "DNS-1035"),
        (lambda job, rt: job["spec"].update(managedBy="example.com/mine"), "managedBy"),
        (lambda job, rt: job["spec"].update(initializer={"dataset": {"storageUri": "hf://x"}}), "dataset-initializer"),
        (lambda job, rt: job["metadata"].update(name="a" * 50), "pod name"),
        (lambda job, rt: rt["spec"]["template"]["spec"]["failurePolicy"]["rules"][0].update(name="a-b"), "no '-'"),
    ],
)
def test_trainer_rules_reject_what_trainer_v2_rejects(breakage, complaint):
    objects = copy.deepcopy(load("trainjob-sync.yaml"))
    trainjob = next(obj for obj in objects if obj["kind"] == "TrainJob")
    runtime = runtime_of(objects)
    breakage(trainjob, runtime)
    problems = engines_here.part("trainjob", "admission").trainjob_problems(trainjob, runtime)
    assert any(complaint in problem for problem in problems), problems


def test_a_trainjob_whose_runtime_is_not_shipped_is_refused_naming_it():
    objects = load("trainjob-sync.yaml")
    trainjob = next(obj for obj in objects if obj["kind"] == "TrainJob")
    trainjob["spec"]["runtimeRef"]["name"] = "torch-distributed"
    with pytest.raises(tfjob_manifest.ManifestError, match="'torch-distributed'"):
        runtime_of(objects)


# Each CRD's CEL rules that apply on create (rules on oldSelf apply on update only): where each is enforced here, or
# the field it guards, which the project's manifests must then not use.
CEL_RULES = {
    ("JobSet", "jobset.x-k8s.io"): {
        "StartupPolicy and DependsOn APIs are mutually exclusive": "admission.jobset_problems",
        "namespace cannot be set for VolumeClaimPolicies templates": "field:spec.volumeClaimPolicies",
    },
    ("TrainJob", "trainer.kubeflow.org"): {
        "metadata.name must match RFC 1035 DNS label format": "admission.trainjob_problems",
        "metadata.name must be no more than 63 characters": "admission.trainjob_problems",
        "storageUri may be empty, or it must be a valid URI (scheme://...)": "field:spec.initializer",
        "ManagedBy must be trainer.kubeflow.org/trainjob-controller or kueue.x-k8s.io/multikueue if set": (
            "admission.trainjob_problems"
        ),
        "lastUpdatedTime is required when trainerStatus is present": "field:status",
    },
}
for _runtime in ("TrainingRuntime", "ClusterTrainingRuntime"):
    CEL_RULES[(_runtime, "trainer.kubeflow.org")] = {
        "Only one of the policy can be configured": "admission.runtime_problems",
        "NumProcPerNode in fluxPolicy must be >= 1": "field:spec.mlPolicy.flux",
        "containerNames must not include the main node container because PET_* envs are always injected into it": (
            "field:spec.mlPolicy.torch"
        ),
        "StartupPolicy and DependsOn APIs are mutually exclusive": "admission.jobset_problems",
        "namespace cannot be set for VolumeClaimPolicies templates": "field:spec.template.spec.volumeClaimPolicies",
    }


@pytest.mark.parametrize("kind, group", sorted(CEL_RULES))
def test_every_create_time_cel_rule_of_the_crd_is_enforced_here_or_guards_a_field_we_do_not_use(kind, group):
    messages = sorted({message for _, rule, message in crd_schemas.cel_rules(kind, group) if "oldSelf" not in rule})
    assert messages == sorted(CEL_RULES[(kind, group)]), "a CEL rule changed at the pinned tag: read it and map it"
    unused = [where.removeprefix("field:") for where in CEL_RULES[(kind, group)].values() if where.startswith("field:")]
    for source in SOURCES:
        for obj in load(source):
            if obj["kind"] == kind:
                for path in unused:
                    node = obj
                    for key in path.split("."):
                        node = node.get(key) if isinstance(node, dict) else None
                    assert node is None, f"{source}: {kind} uses {path}; enforce its CEL rule in admission.py"


def test_the_submitted_jobs_engine_labels_and_the_chief_are_what_the_follower_selects():
    trainjob_objects = load("trainjob-sync.yaml")

    class Backend:
        custom_api = None

    class Client:
        backend = Backend

    engine = engines_here.part("trainjob", "cluster").TrainJobEngine.of(Client, trainjob_objects, "default")
    assert engine.chief_selector() == (
        "jobset.sigs.k8s.io/jobset-name=multi-worker,jobset.sigs.k8s.io/replicatedjob-name=node,"
        "jobset.sigs.k8s.io/job-index=0,batch.kubernetes.io/job-completion-index=0"
    )
    jobset = engines_here.part("jobset", "cluster").JobSetEngine.of(None, load("jobset-async.yaml")[0], "default")
    assert (jobset.chief_job, jobset.container, jobset.service_query()) == (
        "chief",
        "trainer",
        {"field_selector": "metadata.name=multi-worker"},
    )


# Kueue's example queues (k8s/engines/kueue/queues.yaml) against Kueue's CRDs at KUEUE_VERSION.
KUEUE_EXAMPLE = ROOT / "k8s" / "engines" / "kueue" / "queues.yaml"


def kueue_objects() -> list[dict]:
    return [doc for doc in yaml.safe_load_all(KUEUE_EXAMPLE.read_text()) if doc]


def test_the_kueue_example_is_valid_against_kueues_crds_strictly():
    objects = kueue_objects()
    assert sorted(obj["kind"] for obj in objects) == ["ClusterQueue", "LocalQueue", "ResourceFlavor"]
    for obj in objects:
        crd_schemas.validate(obj)
    # It installs the pinned Kueue the way k3d-up does (tests/tools/test_engine_installs.py checks that one's image).
    assert "make k3d-up ENGINE=jobset KUEUE=1" in KUEUE_EXAMPLE.read_text()


def kueue_cel_problems(objects: list[dict]) -> list[str]:
    """ClusterQueue's create-time CEL rules at KUEUE_VERSION (config/components/crd/bases/
    kueue.x-k8s.io_clusterqueues.yaml)."""
    problems = []
    for queue in (obj for obj in objects if obj["kind"] == "ClusterQueue"):
        spec = queue["spec"]
        for group in spec.get("resourceGroups") or []:
            for flavor in group["flavors"]:
                if len(flavor["resources"]) != len(group["coveredResources"]):
                    problems.append("flavors must have the same number of resources as the coveredResources")
                if "cohortName" not in spec and any("borrowingLimit" in r for r in flavor["resources"]):
                    problems.append("borrowingLimit must be nil when cohort is empty")
        fungibility = spec.get("flavorFungibility") or {}
        if "preference" in fungibility and not (
            fungibility.get("whenCanBorrow") == fungibility.get("whenCanPreempt") == "TryNextFlavor"
        ):
            problems.append("preference can only be set when both whenCanBorrow and whenCanPreempt are TryNextFlavor")
        preemption = spec.get("preemption") or {}
        if (
            preemption.get("reclaimWithinCohort") == "Never"
            and preemption.get("borrowWithinCohort", {}).get("policy", "Never") != "Never"
        ):
            problems.append("reclaimWithinCohort=Never and borrowWithinCohort.Policy!=Never")
    return problems


def test_the_kueue_example_passes_the_clusterqueue_cel_rules_and_its_flavor_uses_no_ruled_field():
    objects = kueue_objects()
    assert kueue_cel_problems(objects) == []
    rules = {m for _, rule, m in crd_schemas.cel_rules("ClusterQueue", "kueue.x-k8s.io") if "oldSelf" not in rule}
    assert len(rules) == 4, "ClusterQueue's CEL rules changed at the pinned tag: update kueue_cel_problems"
    broken = copy.deepcopy(objects)
    queue = next(obj for obj in broken if obj["kind"] == "ClusterQueue")
    queue["spec"]["resourceGroups"][0]["flavors"][0]["resources"].pop()
    assert kueue_cel_problems(broken) == ["flavors must have the same number of resources as the coveredResources"]
    # ResourceFlavor's rules guard topologyName, nodeTaints and tolerations, which the example leaves out.
    (flavor,) = [obj for obj in objects if obj["kind"] == "ResourceFlavor"]
    assert not set(flavor.get("spec") or {}) & {"topologyName", "nodeTaints", "tolerations"}


# The TFJob's gang scheduling (docs/cluster.md): the schedulingPolicy fields of the operator's API at v1.9.4.
SCHEDULING_POLICY = {"minAvailable": 2, "queue": "training", "scheduleTimeoutSeconds": 300}


def test_the_tfjob_scheduling_policy_fields_in_the_docs_are_the_crds():
    schema = crd_schemas.vendored("TFJob", "kubeflow.org")["openAPIV3Schema"]
    run_policy = schema["properties"]["spec"]["properties"]["runPolicy"]["properties"]
    fields = set(run_policy["schedulingPolicy"]["properties"])
    assert fields == {"minAvailable", "queue", "minResources", "priorityClass", "scheduleTimeoutSeconds"}
    docs = (ROOT / "docs" / "cluster.md").read_text()
    assert all(f"`{field}`" in docs for field in fields)
    assert "schedulingPolicy:\n" + "".join(f"      {k}: {v}\n" for k, v in SCHEDULING_POLICY.items()) in docs


def test_the_tfjob_with_the_documented_scheduling_policy_passes_the_crd_schema_and_the_sdk_model():
    tfjob = copy.deepcopy(tfjob_manifest.the_one(tfjob_manifest.render(), "TFJob"))
    crd_schemas.validate(tfjob)
    tfjob["spec"]["runPolicy"]["schedulingPolicy"] = dict(SCHEDULING_POLICY)
    crd_schemas.validate(tfjob)
    assert tfjob_cluster.sdk_request_body(tfjob_cluster.to_tfjob(tfjob)) == tfjob


def with_kueue(overlay: str, tmp_path: pathlib.Path) -> tuple[list[dict], list[dict]]:
    """The overlay rendered as is and with k8s/engines/kueue/component added (in a copy of k8s/, as a user would
    add it)."""
    shutil.copytree(ROOT / "k8s", tmp_path / "k8s")
    engine, name = pathlib.Path(overlay).parts[-2:]
    user = tmp_path / "k8s" / "engines" / engine / "with-kueue"
    user.mkdir()
    (user / "kustomization.yaml").write_text(f"resources:\n- ../{name}\ncomponents:\n- ../../kueue/component\n")
    renders = []
    for directory in (tmp_path / "k8s" / "engines" / engine / name, user):
        result = subprocess.run(["kubectl", "kustomize", str(directory)], capture_output=True, text=True, check=True)
        renders.append([doc for doc in yaml.safe_load_all(result.stdout) if doc])
    return renders[0], renders[1]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_kueue_component_labels_only_the_job_with_the_example_local_queue(overlay, tmp_path):
    plain, queued = with_kueue(overlay, tmp_path)
    (local_queue,) = [obj for obj in kueue_objects() if obj["kind"] == "LocalQueue"]
    kind = job_engine.engine_kind(queued)
    changed = [(a, b) for a, b in zip(plain, queued, strict=True) if a != b]
    assert [b["kind"] for _, b in changed] == [kind]
    job = changed[0][1]
    assert job["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == local_queue["metadata"]["name"]
    crd_schemas.validate(job)
    if kind == "TrainJob":  # the SDK's Labels option carries it into the TrainJob it creates
        _, _, options = engines_here.part("trainjob", "cluster").sdk_call(job, runtime_of(queued))
        assert any(getattr(o, "labels", {}).get("kueue.x-k8s.io/queue-name") for o in options)


@pytest.mark.parametrize("engine", [engine for engine in ("jobset", "trainjob") if engine in tfjob_manifest.ENGINES])
def test_each_shipped_kueue_example_is_its_sync_overlay_with_the_component(engine, tmp_path):
    _, queued = with_kueue(f"k8s/engines/{engine}/sync", tmp_path)
    example = ROOT / "k8s" / "engines" / engine / "sync-kueue"
    rendered = subprocess.run(["kubectl", "kustomize", str(example)], capture_output=True, text=True, check=True)
    assert [doc for doc in yaml.safe_load_all(rendered.stdout) if doc] == queued
    assert (
        f"make submit ENGINE={engine} KUSTOMIZATION=k8s/engines/{engine}/sync-kueue"
        in (example / "kustomization.yaml").read_text()
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_kueue_example_queue_covers_every_resource_the_job_s_pods_request(overlay, tmp_path):
    # Kueue leaves a workload pending for good when one requested resource is not covered (found on a real Kueue:
    # "resource ephemeral-storage unavailable in ClusterQueue").
    _, queued = with_kueue(overlay, tmp_path)
    (cluster_queue,) = [obj for obj in kueue_objects() if obj["kind"] == "ClusterQueue"]
    covered = {name for group in cluster_queue["spec"]["resourceGroups"] for name in group["coveredResources"]}
    kind = job_engine.engine_kind(queued)
    job = next(obj for obj in queued if obj["kind"] == kind)
    # A TrainJob's pods are its runtime's.
    pods_of = [job, runtime_of(queued)] if kind == "TrainJob" else [job]
    requested = {
        name
        for template in pod_templates(pods_of)
        for container in template["spec"]["containers"]
        for name in container.get("resources", {}).get("requests", {})
    }
    assert requested, "no resource requests found"
    assert requested <= covered, f"requested but not covered by the example ClusterQueue: {requested - covered}"
