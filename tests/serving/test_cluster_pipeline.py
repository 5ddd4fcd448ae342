"""The cluster side of serving, checked offline (no cluster runs here): the Argo Workflow of the pipeline and the
InferenceService, against their CRDs vendored at the pinned tags (Argo Workflows, KServe), KServe's admission rules
for the fields used, Argo's parser for the success and failure conditions with every status path they read present
in that engine's CRD, Pod Security "restricted" for every pod added, and the Workflow's steps equal to make
pipeline's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import yaml

import crd_schemas
from kubernetes_ranges import outside_ranges
from model_server import ROOT
from scripts.common import manifest
from scripts.common import settings as project_settings

SETTINGS = project_settings.load_file()
ENGINES = manifest.ENGINES  # the engine folders this checkout holds (a fork may have deleted some)
KIND = {name: kind for kind, name in manifest.ENGINE_KINDS.items()}
MODELS = ("cnn", "dropout", "batch_norm")


def generated(*args: str, env: dict[str, str] | None = None) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-m", "scripts.pipeline.cluster", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@pytest.fixture(scope="module", params=ENGINES)
def workflow(request):
    (document,) = generated("workflow", "--engine", request.param, "--image", "img:1", "--models", *MODELS)
    return request.param, document


def templates(document: dict) -> dict[str, dict]:
    return {template["name"]: template for template in document["spec"]["templates"]}


# ---- Argo's selector parser (k8s.io/apimachinery labels.Parse, which v4.1.2's executor uses) ----------------------

QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")
REQUIREMENT = re.compile(r"^\s*(!?)\s*([^\s!=<>,]+)\s*(?:(==|=|!=|>|<)\s*([^\s,]*))?\s*$")


def parsed(selector: str) -> list[tuple[str, str | None, str | None]]:
    """(key, operator, value) of each comma-separated requirement; AssertionError where labels.Parse refuses."""
    requirements = []
    for part in selector.split(","):
        match = REQUIREMENT.match(part)
        assert match, f"{selector!r}: {part!r} is not a requirement labels.Parse reads"
        negated, key, operator, value = match.groups()
        assert len(key) <= 63 and QUALIFIED_NAME.fullmatch(key), f"{key!r} is not a qualified name (<= 63 chars)"
        if operator in (">", "<"):
            assert value is not None and value.lstrip("-").isdigit(), f"{selector!r}: {operator} needs an integer"
        elif operator is not None:
            assert value is not None and len(value) <= 63 and LABEL_VALUE.fullmatch(value), f"bad value {value!r}"
        requirements.append((key, operator, value))
    return requirements


def schema_at(schema: dict, path: str) -> dict | None:
    """The schema node a gjson dotted path reaches (a numeric segment indexes an array, a name a map's key)."""
    node = schema
    for segment in path.split("."):
        if segment.isdigit() and node.get("type") == "array":
            node = node["items"]
        elif segment in (node.get("properties") or {}):
            node = node["properties"][segment]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return None
    return node


def test_every_condition_parses_and_reads_a_status_field_the_engine_sets(workflow):
    engine, document = workflow
    by_name = templates(document)
    for job in (f"multi-worker-{model.replace('_', '-')}" for model in MODELS):
        resource = by_name[f"train-{job}"]["resource"]
        created = yaml.safe_load(resource["manifest"])
        assert created["kind"] == KIND[engine] and created["metadata"]["name"] == job
        schema = crd_schemas.record_for(created)["openAPIV3Schema"]
        for field in ("successCondition", "failureCondition"):
            if field not in resource:
                continue
            for key, _, value in parsed(resource[field]):
                node = schema_at(schema, key)
                assert node is not None, f"{engine}: {key} is not in the {KIND[engine]} CRD's schema"
                if node.get("enum"):
                    assert value in node["enum"], f"{key} is one of {node['enum']}, never {value!r}"
        assert "successCondition" in resource, f"{engine}: a training step needs a success condition"
        assert by_name[f"train-{job}"]["activeDeadlineSeconds"] > 0
    if engine == "tfjob":
        replicas = created["spec"]["tfReplicaSpecs"]["Worker"]["replicas"]
        assert created["spec"]["runPolicy"].get("successPolicy", created["spec"].get("successPolicy")) == "AllWorkers"
        assert resource["successCondition"] == f"status.replicaStatuses.Worker.succeeded == {replicas}"
    data = by_name["prepare-data"]["resource"]
    job = yaml.safe_load(data["manifest"])
    assert job["kind"] == "Job"
    for key, _, _ in parsed(data["successCondition"]) + parsed(data["failureCondition"]):
        assert key in ("status.succeeded", "status.failed")
    assert parsed(data["failureCondition"])[0][2] == str(job["spec"]["backoffLimit"])


def gjson(document: dict, path: str) -> object:
    """What gjson.Get finds at a dotted path (a numeric segment indexes a list); None where nothing is."""
    node: object = document
    for segment in path.split("."):
        if isinstance(node, list) and segment.isdigit() and int(segment) < len(node):
            node = node[int(segment)]
        elif isinstance(node, dict) and segment in node:
            node = node[segment]
        else:
            return None
    return node


def requirement_matches(requirement: tuple[str, str | None, str | None], document: dict) -> bool:
    """labels.Requirement.Matches over Argo's gjsonLabels: a missing key matches only != (and fails the rest)."""
    key, operator, value = requirement
    found = gjson(document, key)
    if found is None:
        return operator == "!="
    text = str(found).lower() if isinstance(found, bool) else str(found)
    if operator is None:
        return True
    if operator in ("=", "=="):
        return text == value
    if operator == "!=":
        return text != value
    number = int(text) if text.lstrip("-").isdigit() else None
    return number is not None and (number > int(value) if operator == ">" else number < int(value))


def argo_outcome(resource: dict, status: dict) -> str:
    """Argo v4.1.2's matchConditions: any failure requirement fails the step; all success requirements end it."""
    document = {"status": status}
    if any(requirement_matches(r, document) for r in parsed(resource["failureCondition"])):
        return "failed"
    if all(requirement_matches(r, document) for r in parsed(resource["successCondition"])):
        return "succeeded"
    return "running"


def conditions(*types: str, status: str = "True") -> list[dict]:
    return [{"type": kind, "status": status} for kind in types]


# The statuses each engine writes on the way, as its source at the pinned tag writes them (the training operator's
# setCondition appends each new condition after Created; Trainer copies JobSet's Complete or Failed), and what the
# training step must make of each.
TWO = {"Worker": {"active": 2}}
ENGINE_STATUSES = {
    "tfjob": [
        ({"conditions": conditions("Created")}, "running"),
        ({"conditions": conditions("Created", "Running"), "replicaStatuses": TWO}, "running"),
        # A worker preempted and restarted: its failed pod counts, the job goes on.
        ({"conditions": conditions("Created", "Restarting"), "replicaStatuses": {"Worker": {"failed": 1}}}, "running"),
        ({"conditions": conditions("Created", "Running") + conditions("Failed")}, "failed"),
        ({"conditions": conditions("Created", "Suspended", "Running", "Failed")}, "failed"),
        ({"conditions": conditions("Created", "Restarting", "Failed")}, "failed"),
        (
            {
                "conditions": conditions("Created", "Running", "Succeeded"),
                "replicaStatuses": {"Worker": {"succeeded": 2}},
            },
            "succeeded",
        ),
    ],
    "jobset": [
        ({"replicatedJobsStatus": [{"name": "worker", "active": 1}]}, "running"),
        ({"terminalState": "Failed"}, "failed"),
        ({"terminalState": "Completed"}, "succeeded"),
    ],
    "trainjob": [
        ({}, "running"),
        # A child Job failed and JobSet recreates it (failurePolicy): not the end.
        ({"jobsStatus": [{"name": "node", "failed": 1, "active": 0}]}, "running"),
        ({"conditions": conditions("Failed")}, "failed"),
        ({"conditions": conditions("Suspended", status="False") + conditions("Failed")}, "failed"),
        ({"conditions": conditions("Complete"), "jobsStatus": [{"name": "node", "succeeded": 1}]}, "succeeded"),
    ],
}


def test_each_training_step_ends_as_its_engine_job_does_restarts_included(workflow):
    engine, document = workflow
    resource = templates(document)["train-multi-worker-cnn"]["resource"]
    assert resource.get("failureCondition"), f"{engine}: a training step needs a failure condition"
    workers = yaml.safe_load(resource["manifest"])
    if engine == "tfjob":
        assert workers["spec"]["tfReplicaSpecs"]["Worker"]["replicas"] == 2  # the statuses above are two workers'
    for status, outcome in ENGINE_STATUSES[engine]:
        assert argo_outcome(resource, status) == outcome, (engine, status)


def test_the_docs_table_of_conditions_says_what_each_training_step_reads(workflow):
    # Before: docs/serving.md said the TFJob and TrainJob steps had no failure condition; each has one.
    engine, document = workflow
    resource = templates(document)["train-multi-worker-cnn"]["resource"]
    rows = re.findall(r"^\| (\w+) \| (.+) \| (.+) \|$", (ROOT / "docs" / "serving.md").read_text(), re.MULTILINE)
    (failure,) = [cell for name, _, cell in rows if name == KIND[engine]]
    keys = [key for key, _, _ in parsed(resource["failureCondition"])]
    indices = [int(index) for key in keys for index in re.findall(r"\.(\d+)\.", key)]
    if indices:  # one requirement per index where the condition can stand
        path = re.sub(r"[.]\d+[.]", ".N.", keys[0])
        assert failure == f"`{path} == Failed`, N from {min(indices)} to {max(indices)}"
    else:
        assert failure == f"`{resource['failureCondition']}`"


def test_the_workflow_and_each_object_it_creates_validate_against_their_crds(workflow):
    engine, document = workflow
    crd_schemas.validate(document)
    for template in document["spec"]["templates"]:
        if "resource" not in template:
            continue
        created = yaml.safe_load(template["resource"]["manifest"])
        if created["kind"] in ("TFJob", "JobSet", "TrainJob", "InferenceService", "ServingRuntime"):
            crd_schemas.validate(created)
    # Where Argo reads a condition: only on a resource template (the book's serving step had it on the template).
    for template in document["spec"]["templates"]:
        assert not {"successCondition", "failureCondition"} & set(template), template["name"]


def make_dry_run(*goals: str) -> str:
    return subprocess.run(
        ["make", "-n", *goals, "VENV=.venv", "JOB_NAME=multi-worker"], cwd=ROOT, capture_output=True, text=True
    ).stdout


def test_the_workflow_runs_the_steps_make_pipeline_runs(workflow):
    _, document = workflow
    local = re.findall(
        r'run-local JOB_NAME=(\S+) ARGS="--model (\S+)', make_dry_run("-o", ".venv/.installed", "pipeline")
    )
    by_name = templates(document)
    steps = [step["name"] for group in by_name["pipeline"]["steps"] for step in group]
    trained = []
    for step in steps:
        if step.startswith("train-"):
            created = yaml.safe_load(by_name[step]["resource"]["manifest"])
            job = created["metadata"]["name"]
            # A TrainJob's trainer args live in its own runtime, applied in a step before it.
            runtime = by_name.get(f"setup-{job}-trainingruntime")
            holder = yaml.safe_load(runtime["resource"]["manifest"]) if runtime else created
            assert steps.index(f"setup-{job}-configmap") < steps.index(step)
            args = " ".join(yaml.safe_dump(holder).split())
            model = re.search(r"--model\s+-?\s*(\w+)", args)
            trained.append((job, model.group(1) if model else None))
    assert trained == local
    assert steps.index("select") > max(steps.index(f"train-{job}") for job, _ in local)
    # One failed variant leaves the selection to judge the rest (it refuses the failed one: no checked export).
    continued = [step for group in by_name["pipeline"]["steps"] for step in group if step.get("continueOn")]
    assert continued and all(step["name"].startswith("train-") for step in continued)
    assert [step["continueOn"] for step in continued] == [{"failed": True}] * len(local)
    assert steps.index("prepare-data") < min(steps.index(f"train-{job}") for job, _ in local)
    selection = by_name["select"]["container"]["command"]
    make_select = make_dry_run("-o", ".venv/.installed", "select").split()
    assert selection[:3] == ["python", "-m", "trainer.serving.select"]
    local_candidates = make_select[make_select.index("--candidates") + 1 : make_select.index("--base-path")]
    cluster_candidates = selection[selection.index("--candidates") + 1 :]
    # Each variant's own model dir, MODEL_ROOT/JOB_NAME on the volume and run-local's runs/<job>/models/<job>.
    assert [path.split("/")[-1] for path in cluster_candidates] == [path.split("/")[-1] for path in local_candidates]
    assert all(path.startswith(SETTINGS["MODEL_ROOT"] + "/") for path in cluster_candidates)
    base_path = selection[selection.index("--base-path") + 1]
    assert base_path == f"{SETTINGS['MOUNT_PATH']}/{SETTINGS['SELECTION_ROOT']}/{SETTINGS['JOB_NAME']}/serving"


def test_replace_reaches_the_selection_step_as_it_reaches_make_select():
    # REPLACE=1: the winner is published even over a served model that scores as well (trainer/serving/select.py).
    (document,) = generated("workflow", "--image", "img:1", "--models", "cnn", "--replace")
    assert "--replace" in templates(document)["select"]["container"]["command"]
    (document,) = generated("workflow", "--image", "img:1", "--models", "cnn")
    assert "--replace" not in templates(document)["select"]["container"]["command"]
    assert "--replace" in make_dry_run("-o", ".venv/.installed", "select", "REPLACE=1").split()
    assert "--replace" not in make_dry_run("-o", ".venv/.installed", "select").split()
    submitted = make_dry_run("-o", ".venv/.installed", "-o", "image", "submit-pipeline", "REPLACE=1")
    assert "scripts.pipeline.submit workflow" in submitted and "--replace" in submitted.split(), submitted


def run_steps(document: dict, existing: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """The objects after the Workflow's resource steps ran in order over `existing`, as the API server answers
    them: create fails on a name that exists (AlreadyExists), apply creates or updates, delete removes if there."""
    by_name = templates(document)
    existing = set(existing)
    for group in by_name["pipeline"]["steps"]:
        for step in group:
            resource = by_name[step["template"]].get("resource")
            if resource is None:
                continue
            obj = yaml.safe_load(resource["manifest"])
            key = (obj["kind"], obj["metadata"]["name"])
            if resource["action"] == "create":
                assert key not in existing, f"step {step['name']}: {key} already exists (AlreadyExists)"
            if resource["action"] == "delete":
                existing.discard(key)
            else:
                existing.add(key)
    return existing


def test_the_workflow_can_be_submitted_again_and_cleans_up_after_itself(workflow):
    # Before: a second submission failed on AlreadyExists: the data Job and the engine jobs have fixed names, and the
    # Workflow, which owns them, was never deleted.
    engine, document = workflow
    after_the_first = run_steps(document, set())
    assert run_steps(document, after_the_first) == after_the_first
    spec = document["spec"]
    assert spec["ttlStrategy"]["secondsAfterSuccess"] > 0 and spec["ttlStrategy"]["secondsAfterFailure"] > 0
    assert spec["podGC"]["strategy"] == "OnPodSuccess"
    # The executor's delete is `kubectl delete --ignore-not-found` (Argo's workflow/executor/resource.go): the first
    # submission finds nothing to delete and goes on. The service account may delete what it deletes.
    (rbac,) = [doc for doc in generated("rbac") if doc["kind"] == "Role"]
    deletable = {resource for rule in rbac["rules"] if "delete" in rule["verbs"] for resource in rule["resources"]}
    for template in document["spec"]["templates"]:
        if template.get("resource", {}).get("action") == "delete":
            kind = yaml.safe_load(template["resource"]["manifest"])["kind"]
            assert f"{kind.lower()}s" in deletable, f"{engine}: the Role does not let the executor delete {kind}s"


def test_two_pipelines_publish_into_and_serve_base_paths_of_their_own():
    # Before: every pipeline published into SERVE_BASE_PATH, one for all jobs, and each InferenceService served it.
    published = {}
    for job in ("team-a", "team-b"):
        (document,) = generated("workflow", "--image", "img:1", "--models", "cnn", env={"JOB_NAME": job})
        command = templates(document)["select"]["container"]["command"]
        published[job] = command[command.index("--base-path") + 1]
        documents = generated("inferenceservice", "--image", "img:1", env={"JOB_NAME": job})
        (service,) = [doc for doc in documents if doc["kind"] == "InferenceService"]
        on_the_volume = published[job].removeprefix(SETTINGS["MOUNT_PATH"] + "/")
        assert (
            service["spec"]["predictor"]["model"]["storageUri"] == f"pvc://{SETTINGS['VOLUME_CLAIM']}/{on_the_volume}"
        )
    assert published["team-a"] != published["team-b"], published
    assert all(f"/{job}/" in path for job, path in published.items()), published


@pytest.mark.parametrize("runtime", ["project", "tf-serving"])
def test_the_inference_service_passes_its_crd_and_kserves_admission_rules(runtime):
    documents = generated("inferenceservice", "--image", "img:1", "--runtime", runtime)
    (service,) = [doc for doc in documents if doc["kind"] == "InferenceService"]
    for document in documents:
        if document["kind"] != "NetworkPolicy":  # a core kind: the real API server validates it (scripts/node/tests)
            crd_schemas.validate(document)
    # pkg/apis/serving/v1beta1/inference_service_validation.go at v0.20.0: the name, the deployment mode, exactly
    # one predictor implementation, the replicas, and a storage URI it can mount.
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", service["metadata"]["name"])
    assert service["metadata"]["annotations"]["serving.kserve.io/deploymentMode"] == "Standard"
    predictor = service["spec"]["predictor"]
    implementations = {"model", "tensorflow", "sklearn", "xgboost", "pytorch", "triton", "onnx", "huggingface"}
    assert len(implementations & set(predictor)) == 1 and not predictor.get("containers")
    assert 0 <= predictor["minReplicas"] <= predictor["maxReplicas"]
    model = predictor["model"]
    on_the_volume = f"{SETTINGS['SELECTION_ROOT']}/{SETTINGS['JOB_NAME']}/serving"
    assert model["storageUri"] == f"pvc://{SETTINGS['VOLUME_CLAIM']}/{on_the_volume}"
    if runtime == "tf-serving":
        assert model["runtime"] == "kserve-tensorflow-serving"
        major_minor = tuple(int(part) for part in model["runtimeVersion"].split(".")[:2])
        assert major_minor >= (2, 21), "TF Serving older than the training TensorFlow may not load the graph"
    else:
        (serving_runtime,) = [doc for doc in documents if doc["kind"] == "ServingRuntime"]
        assert serving_runtime["metadata"]["name"] == model["runtime"]
        formats = {entry["name"] for entry in serving_runtime["spec"]["supportedModelFormats"]}
        assert model["modelFormat"]["name"] in formats
        (container,) = serving_runtime["spec"]["containers"]
        assert container["command"][-3:] == ["python", "-m", "trainer.serving"]
        assert "/mnt/models" in container["args"]
        # KServe's Service sends port 80 to the first port and exposes a "grpc"-named one as h2c.
        assert [(port["name"], port["containerPort"]) for port in container["ports"]] == [
            ("http", int(SETTINGS["SERVE_PORT"])),
            ("grpc", int(SETTINGS["SERVE_GRPC_PORT"])),
        ]
        assert container["args"][container["args"].index("--grpc-port") + 1] == SETTINGS["SERVE_GRPC_PORT"]
        # TensorFlow's pools get the pod's CPU limit, which the kubelet writes into the variable the args expand.
        assert container["args"][container["args"].index("--threads") + 1] == "$(SERVE_THREADS)"
        (threads,) = [variable for variable in container["env"] if variable["name"] == "SERVE_THREADS"]
        assert threads["valueFrom"]["resourceFieldRef"] == {"resource": "limits.cpu", "divisor": "1"}
        assert container["resources"]["limits"]["cpu"]  # without a limit the kubelet would write the node's cores


def restricted(pod: dict, containers: list[dict], where: str) -> None:
    context = pod.get("securityContext") or {}
    assert context.get("runAsNonRoot") is True and context.get("runAsUser") != 0, where
    assert (context.get("seccompProfile") or {}).get("type") == "RuntimeDefault", where
    for container in containers:
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False, where
        assert security["capabilities"]["drop"] == ["ALL"], where
        assert security["readOnlyRootFilesystem"] is True, where
        assert any(mount["mountPath"] == "/tmp" for mount in container["volumeMounts"]), where
        assert container["resources"]["requests"] and container["resources"]["limits"], where


def test_every_pod_added_passes_pod_security_restricted(workflow):
    _, document = workflow
    select = templates(document)["select"]
    # Argo adds its executor to a container template's pod (init and wait, workflow/common/common.go at v4), with the
    # controller's default security context, which is empty: the template's podSpecPatch must make them restricted.
    patch = json.loads(select["podSpecPatch"])
    executor = [*patch["initContainers"], *patch["containers"]]
    assert sorted(container["name"] for container in executor) == ["init", "wait"]
    for container in executor:
        security = container["securityContext"]
        assert security["allowPrivilegeEscalation"] is False and security["capabilities"]["drop"] == ["ALL"]
        assert security["runAsNonRoot"] is True and security["seccompProfile"]["type"] == "RuntimeDefault"
    restricted(document["spec"], [select["container"]], "the selection pod")
    documents = generated("inferenceservice", "--image", "img:1")
    (service,) = [doc for doc in documents if doc["kind"] == "InferenceService"]
    (serving_runtime,) = [doc for doc in documents if doc["kind"] == "ServingRuntime"]
    predictor = service["spec"]["predictor"]
    assert predictor["automountServiceAccountToken"] is False
    restricted(predictor, serving_runtime["spec"]["containers"], "the predictor pod")
    assert {"name": "tmp", "emptyDir": {}} in serving_runtime["spec"]["volumes"]


def test_the_pinned_stack_is_tested_on_the_clusters_kubernetes_minor():
    # KServe's own CI stops at 1.34: its evidence on the cluster's minor is the cluster suite's run (the pipeline,
    # the InferenceService), as for the engines (tests/tools/test_settings.py).
    stack = {"KSERVE_VERSION": "KSERVE_TESTED_KUBERNETES", "ARGO_WORKFLOWS_VERSION": "ARGO_WORKFLOWS_TESTED_KUBERNETES"}
    assert outside_ranges(SETTINGS, SETTINGS["K3S_IMAGE"], stack) == []


BATCHING = {
    "SERVE_MAX_BATCH_SIZE": "32",
    "SERVE_BATCH_TIMEOUT_MS": "2.5",
    "SERVE_MAX_QUEUED_EXAMPLES": "256",
    "SERVE_MAX_CONCURRENT_REQUESTS": "300",
}


@pytest.mark.parametrize("chosen", [BATCHING, {}], ids=["batching set", "defaults"])
def test_the_batching_settings_reach_make_serve_and_the_serving_runtime_alike(chosen):
    documents = generated("inferenceservice", "--image", "img:1", env=chosen)
    (serving_runtime,) = [doc for doc in documents if doc["kind"] == "ServingRuntime"]
    (container,) = serving_runtime["spec"]["containers"]
    cluster = container["args"][container["args"].index("--grpc-port") + 2 :]
    assignments = [f"{key}={value}" for key, value in chosen.items()]
    (serve,) = [
        line
        for line in make_dry_run("-o", ".venv/.installed", "serve", *assignments).splitlines()
        if "-m trainer.serving" in line
    ]
    local = serve.split()[serve.split().index("--grpc-port") + 2 :]
    flags = {"SERVE_MAX_BATCH_SIZE": "--max-batch-size", "SERVE_BATCH_TIMEOUT_MS": "--batch-timeout-ms"}
    flags["SERVE_MAX_QUEUED_EXAMPLES"] = "--max-queued-examples"
    flags["SERVE_MAX_CONCURRENT_REQUESTS"] = "--max-concurrent-requests"
    assert cluster == local == [part for key, value in chosen.items() for part in (flags[key], value)]
    from trainer.serving.__main__ import parse  # the server takes them as given

    parsed = parse(["--model-base-path", "/mnt/models", *cluster])
    limits = (parsed.max_batch_size, parsed.max_queued_examples, parsed.max_concurrent_requests)
    assert limits == ((32, 256, 300) if chosen else (0, None, 0))


def test_a_batching_setting_that_is_not_a_number_is_refused_naming_the_key():
    refused = subprocess.run(
        ["make", "k3d-down", "SERVE_BATCH_TIMEOUT_MS=2ms"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2 and "setting SERVE_BATCH_TIMEOUT_MS='2ms' is not allowed" in refused.stderr


# What Argo's executor calls for each action of a resource template (workflow/executor/resource.go at v4): kubectl
# apply reads the object and creates or patches it; create creates it, then the conditions get it until they hold;
# delete deletes it (--ignore-not-found reads it first).
ACTION_VERBS = {"apply": {"get", "create", "patch"}, "create": {"create", "get"}, "delete": {"delete", "get"}}


def test_the_workflows_service_account_may_do_what_every_resource_step_does(workflow):
    # Before: a TrainJob pipeline's steps that apply each variant's TrainingRuntime were Forbidden on the real cluster.
    engine, document = workflow
    (role,) = [doc for doc in generated("rbac") if doc["kind"] == "Role"]
    for template in document["spec"]["templates"]:
        resource = template.get("resource")
        if resource is None:
            continue
        obj = yaml.safe_load(resource["manifest"])
        group = obj["apiVersion"].rpartition("/")[0]
        plural = f"{obj['kind'].lower()}s" if not obj["kind"].endswith("y") else f"{obj['kind'].lower()[:-1]}ies"
        granted = set().union(
            *(
                set(rule["verbs"])
                for rule in role["rules"]
                if group in rule["apiGroups"] and plural in rule["resources"]
            )
        )
        missing = ACTION_VERBS[resource["action"]] - granted
        assert not missing, f"{engine}: step {template['name']} may not {sorted(missing)} {group or 'core'}/{plural}"
