"""The pipeline and the model server on a cluster, generated from the same steps and settings as `make pipeline`:

  python -m scripts.pipeline.cluster workflow --engine tfjob --image IMG --models cnn dropout batch_norm
  python -m scripts.pipeline.cluster inferenceservice --image IMG [--runtime project|tf-serving]

`workflow` prints an Argo Workflow (ARGO_WORKFLOWS_VERSION): the data Job created once, the variants' engine jobs
created in parallel by resource templates (each its own JOB_NAME-<model> and model dir on the volume, with
--model <model>), then a pod running the selection, then the InferenceService applied. `inferenceservice` prints
the ServingRuntime and InferenceService (KServe KSERVE_VERSION, Standard mode) that serve the job's published base
path from the volume: storageUri pvc://VOLUME_CLAIM/SELECTION_ROOT/JOB_NAME/serving. The default runtime is this
project's image running the same server as `make serve`; `--runtime tf-serving` is KServe's TensorFlow Serving
runtime at TF_SERVING_VERSION instead (not run here).

The success and failure conditions read fields each engine sets (its cluster.py's WORKFLOW_CONDITIONS);
tests/serving/test_cluster_pipeline.py checks each path against the engine's vendored CRD and that Argo's selector
parser accepts it.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from typing import Any

import yaml

from scripts.common import job_engine, manifest
from scripts.common import settings as project_settings
from scripts.common.pod_security import RESTRICTED_CONTAINER, RESTRICTED_POD
from scripts.common.volume_layout import select_command, serving_base_path

SERVING_RUNTIME = "tf-multiworker-trainer"
# What Argo reads on the created object (gjson paths in a Kubernetes label selector: AND within success, OR within
# failure): each engine's WORKFLOW_CONDITIONS (k8s/engines/<engine>/cluster.py). A TFJob's Worker.failed and a
# TrainJob's jobsStatus failed also count a failure the engine then restarts from, so failure reads the terminal
# condition instead. No selector can search a list by type, so each index where that condition can stand is listed.
# The data Job: Kubernetes counts failed pods against backoffLimit and then stops.
DATA_CONDITIONS = {"success": "status.succeeded > 0", "failure": "status.failed > {backoff_limit}"}
TRAIN_DEADLINE_SECONDS = 6 * 3600
# A finished Workflow is deleted after these (and with it, through their owner references, the jobs it created): an
# hour after a success, as the data Job's own TTL, and a day after a failure, to read it. Succeeded pods go at once.
TTL_STRATEGY = {"secondsAfterSuccess": 3600, "secondsAfterFailure": 24 * 3600}
POD_GC = {"strategy": "OnPodSuccess"}


def resources(settings: dict[str, str]) -> dict[str, Any]:
    """The selection pod's and the predictor's: SERVE_CPU_REQUEST, sized to the nodes as the job's requests are."""
    return {
        "requests": {"cpu": settings["SERVE_CPU_REQUEST"], "memory": "1Gi"},
        "limits": {"cpu": "2", "memory": "4Gi"},
    }


def variant_job(job_name: str, model: str) -> str:
    """The job name of one variant, as the Makefile's variant_job spells it."""
    return f"{job_name}-{model.replace('_', '-')}"


def render_overlay(engine: str, strategy: str, job: str) -> list[dict[str, Any]]:
    previous = os.environ.get("JOB_NAME")
    os.environ["JOB_NAME"] = job
    try:
        return manifest.render(manifest.overlay(engine, strategy))
    finally:
        if previous is None:
            os.environ.pop("JOB_NAME", None)
        else:
            os.environ["JOB_NAME"] = previous


def resource_template(
    name: str, obj: dict[str, Any], success: str | None, failure: str | None, action: str = "create"
) -> dict[str, Any]:
    resource: dict[str, Any] = {"action": action, "manifest": yaml.safe_dump(obj, sort_keys=False)}
    if action == "create":
        resource["setOwnerReference"] = True
    if success:
        resource["successCondition"] = success
    if failure:
        resource["failureCondition"] = failure
    return {"name": name, "resource": resource}


def delete_first(obj: dict[str, Any]) -> dict[str, Any]:
    """A step deleting an earlier run's object of the same name, so that the step creating it again does not fail
    on AlreadyExists: Argo runs `kubectl delete --ignore-not-found` (nothing there is no error), and kubectl waits
    until the object and, in the foreground, its pods are gone."""
    metadata = {key: obj["metadata"][key] for key in ("name", "namespace") if key in obj["metadata"]}
    stub = {"apiVersion": obj["apiVersion"], "kind": obj["kind"], "metadata": metadata}
    template = resource_template(
        f"delete-previous-{obj['kind'].lower()}-{metadata['name']}", stub, None, None, "delete"
    )
    template["resource"]["flags"] = ["--cascade=foreground"]
    return template


def workflow(
    engine: str,
    image: str,
    models: list[str],
    workers: int,
    dataset: str | None,
    epochs: int,
    trainer_args: list[str],
    settings: dict[str, str],
    replace: bool = False,
) -> dict[str, Any]:
    """The Argo Workflow of the pipeline's steps (replace: the selection publishes its winner over a served model
    that is as good)."""
    base = settings["JOB_NAME"]
    first = render_overlay(engine, "sync", base)
    data_job = copy.deepcopy(manifest.the_one(manifest.customize(first, image=image, dataset=dataset), "Job"))
    templates: list[dict[str, Any]] = []
    # The volume and the settings the data Job reads, applied first (kept if they exist).
    shared = [obj for obj in first if obj["kind"] in ("PersistentVolumeClaim", "ConfigMap")]
    for obj in shared:
        templates.append(
            resource_template(f"apply-{obj['kind'].lower()}-{obj['metadata']['name']}", obj, None, None, action="apply")
        )
    data = DATA_CONDITIONS
    templates.append(
        resource_template(
            "prepare-data",
            data_job,
            data["success"],
            data["failure"].format(backoff_limit=data_job["spec"].get("backoffLimit", 6)),
        )
    )
    created = [data_job]
    kind = job_engine.kind_of(engine)
    part = job_engine.cluster_part(kind)
    jobs = []
    for model in models:
        job = variant_job(base, model)
        jobs.append(job)
        rendered = manifest.customize(
            render_overlay(engine, "sync", job),
            image=image,
            workers=workers,
            dataset=dataset,
            epochs=epochs,
            trainer_args=["--model", model, *trainer_args],
        )
        # Beside the job: its pods' environment (the JOB-settings ConfigMap) and what its engine creates before it (a
        # TrainJob's runtime, which holds the trainer's args); the volume, settings and data Job come first.
        before = [obj for obj in rendered if obj["kind"] == "ConfigMap"] + part.objects_before_job(rendered)
        for obj in before:
            if obj["metadata"]["name"].startswith(f"{job}-"):
                name = f"setup-{job}-{obj['kind'].lower()}"
                templates.append(resource_template(name, obj, None, None, action="apply"))
        conditions = part.WORKFLOW_CONDITIONS
        train = resource_template(
            f"train-{job}",
            manifest.the_one(rendered, kind),
            conditions["success"].format(workers=workers),
            conditions["failure"],
        )
        train["activeDeadlineSeconds"] = TRAIN_DEADLINE_SECONDS
        templates.append(train)
        created.append(manifest.the_one(rendered, kind))
    templates.append(select_template(image, jobs, settings, replace))
    service, runtime = inference_service(image, settings, "project")
    templates.append(resource_template("serving-policy", serving_policy(settings), None, None, action="apply"))
    templates.append(resource_template("serving-runtime", runtime, None, None, action="apply"))
    templates.append(resource_template("inference-service", service, "status.url", None, action="apply"))
    # The data Job and the engine jobs have fixed names (the model dirs are keyed by them): an earlier run's go first.
    templates.extend(delete_first(obj) for obj in created)
    names = [template["name"] for template in templates]
    steps = [
        [{"name": name, "template": name} for name in names if name.startswith("delete-previous-")],
        [{"name": name, "template": name} for name in names if name.startswith("apply-")],
        [{"name": "prepare-data", "template": "prepare-data"}],
        [{"name": name, "template": name} for name in names if name.startswith("setup-")],
        # A variant that fails fails its step at once, and the others go on: the selection refuses it (it left no
        # checked export) and publishes the best of the rest; with none left, the selection fails the Workflow.
        [{"name": f"train-{job}", "template": f"train-{job}", "continueOn": {"failed": True}} for job in jobs],
        [{"name": "select", "template": "select"}],
        [
            {"name": "serving-policy", "template": "serving-policy"},
            {"name": "serving-runtime", "template": "serving-runtime"},
        ],
        [{"name": "inference-service", "template": "inference-service"}],
    ]
    templates.insert(0, {"name": "pipeline", "steps": steps})
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Workflow",
        "metadata": {"generateName": f"{base}-pipeline-", "namespace": settings["NAMESPACE"]},
        "spec": {
            "entrypoint": "pipeline",
            "ttlStrategy": TTL_STRATEGY,
            "podGC": POD_GC,
            # The workflow's pods (the executor, the selection) read nothing from the API but what Argo gives them.
            "serviceAccountName": "argo-pipeline",
            "securityContext": RESTRICTED_POD,
            "volumes": [
                {"name": "volume", "persistentVolumeClaim": {"claimName": settings["VOLUME_CLAIM"]}},
                {"name": "tmp", "emptyDir": {}},
            ],
            "templates": templates,
        },
    }


def created_objects(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    """What the Workflow's steps apply or create, as its resource templates hold them (not what they delete)."""
    return [
        yaml.safe_load(template["resource"]["manifest"])
        for template in workflow["spec"]["templates"]
        if template.get("resource", {}).get("action") in ("apply", "create")
    ]


# The containers Argo adds to a container template's pod (its executor: `init` and `wait`, workflow/common/common.go),
# whose security context comes from the controller's configuration and is empty by default: without this patch a
# namespace enforcing Pod Security "restricted" refuses the selection's pod. Their root stays writable (Argo sets no
# read-only root for them either).
EXECUTOR_CONTAINER = {key: value for key, value in RESTRICTED_CONTAINER.items() if key != "readOnlyRootFilesystem"}
EXECUTOR_PATCH = {
    "initContainers": [{"name": "init", "securityContext": EXECUTOR_CONTAINER}],
    "containers": [{"name": "wait", "securityContext": EXECUTOR_CONTAINER}],
}


def workflow_of(args: argparse.Namespace, settings: dict[str, str]) -> dict[str, Any]:
    """The Workflow of a command line's arguments (this module's and scripts/pipeline/submit.py's, named alike)."""
    return workflow(
        args.engine,
        args.image,
        args.models,
        args.workers,
        args.dataset,
        args.epochs,
        args.trainer_args,
        settings,
        args.replace,
    )


def select_template(image: str, jobs: list[str], settings: dict[str, str], replace: bool) -> dict[str, Any]:
    """The selection, as make select runs it, on the volume's paths."""
    command = select_command(settings, jobs, replace)
    return {
        "name": "select",
        "podSpecPatch": json.dumps(EXECUTOR_PATCH),
        "container": {
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": command,
            "securityContext": RESTRICTED_CONTAINER,
            "resources": resources(settings),
            "volumeMounts": [
                {"name": "volume", "mountPath": settings["MOUNT_PATH"]},
                {"name": "tmp", "mountPath": "/tmp"},
            ],
        },
    }


# The model server's flags that settings.env sets, each passed only when its setting is not empty (the Makefile's
# SERVE_BATCHING passes the same to make serve).
SERVER_FLAGS = {
    "SERVE_MAX_BATCH_SIZE": "--max-batch-size",
    "SERVE_BATCH_TIMEOUT_MS": "--batch-timeout-ms",
    "SERVE_MAX_QUEUED_EXAMPLES": "--max-queued-examples",
    "SERVE_MAX_CONCURRENT_REQUESTS": "--max-concurrent-requests",
}


def server_flags(settings: dict[str, str]) -> list[str]:
    return [part for key, flag in SERVER_FLAGS.items() if settings.get(key) for part in (flag, settings[key])]


def inference_service(image: str, settings: dict[str, str], runtime: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the InferenceService, the ServingRuntime it names) serving the published base path from the volume."""
    storage_uri = f"pvc://{settings['VOLUME_CLAIM']}/{serving_base_path(settings)}"
    model: dict[str, Any] = {"modelFormat": {"name": "tensorflow"}, "storageUri": storage_uri}
    if runtime == "project":
        model["runtime"] = SERVING_RUNTIME
    else:
        model["runtime"] = "kserve-tensorflow-serving"
        model["runtimeVersion"] = settings["TF_SERVING_VERSION"]
        model["resources"] = resources(settings)
    service = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {
            "name": settings["JOB_NAME"],
            "namespace": settings["NAMESPACE"],
            "annotations": {"serving.kserve.io/deploymentMode": "Standard"},
        },
        "spec": {
            "predictor": {
                "minReplicas": 1,
                "maxReplicas": 1,
                "automountServiceAccountToken": False,
                "securityContext": RESTRICTED_POD,
                "model": model,
            }
        },
    }
    rest, grpc = settings["SERVE_PORT"], settings["SERVE_GRPC_PORT"]
    # TensorFlow's pools sized to the pod's CPU limit (whole CPUs, from the kubelet), not to the node's cores.
    threads = ["--threads", "$(SERVE_THREADS)"]
    serving_runtime = {
        "apiVersion": "serving.kserve.io/v1alpha1",
        "kind": "ServingRuntime",
        "metadata": {"name": SERVING_RUNTIME, "namespace": settings["NAMESPACE"]},
        "spec": {
            "supportedModelFormats": [{"name": "tensorflow", "version": "2", "autoSelect": False}],
            "protocolVersions": ["v1", "v2", "grpc-v2"],
            "containers": [
                {
                    "name": "kserve-container",
                    "image": image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["/usr/bin/tini", "-s", "--", "python", "-m", "trainer.serving"],
                    "args": ["--model-base-path", "/mnt/models", "--model-name", "{{.Name}}", *threads]
                    + ["--rest-port", rest, "--grpc-port", grpc, *server_flags(settings)],
                    "env": [
                        {
                            "name": "SERVE_THREADS",
                            "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1"}},
                        }
                    ],
                    # KServe's Service: port 80 to the first port; each further port as itself, a "grpc" name
                    # marking it h2c (service_reconciler.go at KSERVE_VERSION).
                    "ports": [
                        {"name": "http", "containerPort": int(rest), "protocol": "TCP"},
                        {"name": "grpc", "containerPort": int(grpc), "protocol": "TCP"},
                    ],
                    "readinessProbe": {"httpGet": {"path": "/v2/health/ready", "port": int(rest)}},
                    "securityContext": RESTRICTED_CONTAINER,
                    "resources": resources(settings),
                    "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
                }
            ],
            "volumes": [{"name": "tmp", "emptyDir": {}}],
        },
    }
    return service, serving_runtime


def serving_policy(settings: dict[str, str]) -> dict[str, Any]:
    """The predictor's NetworkPolicy: its REST and gRPC ports admit the pods of its namespace, and nothing else reaches
    it (KServe labels the predictor's pods with the InferenceService's name). A client elsewhere needs a rule here."""
    name = settings["JOB_NAME"]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": f"{name}-serving", "namespace": settings["NAMESPACE"]},
        "spec": {
            "podSelector": {"matchLabels": {"serving.kserve.io/inferenceservice": name}},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {}}],
                    "ports": [
                        {"protocol": "TCP", "port": int(settings["SERVE_PORT"])},
                        {"protocol": "TCP", "port": int(settings["SERVE_GRPC_PORT"])},
                    ],
                }
            ],
        },
    }


# What the executor does to a job a step creates: create and watch it, and delete an earlier run's (delete_first).


def rbac(settings: dict[str, str]) -> list[dict[str, Any]]:
    """The service account the Workflow's pods run as: Argo's executor creates and watches the steps' objects
    (so, unlike the trainer's pods, these pods keep their service account token)."""
    namespace = settings["NAMESPACE"]
    rules = [
        {"apiGroups": [""], "resources": ["configmaps", "persistentvolumeclaims"], "verbs": ["get", "create", "patch"]},
        {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": [*job_engine.JOB_VERBS, "patch"]},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "create", "patch"]},
        # Each engine's job (and what goes before it), whichever the Workflow runs.
        *(rule for kind in manifest.ENGINE_KINDS for rule in job_engine.cluster_part(kind).API_RULES),
        {
            "apiGroups": ["serving.kserve.io"],
            "resources": ["inferenceservices", "servingruntimes"],
            "verbs": ["get", "list", "watch", "create", "patch"],
        },
        {"apiGroups": ["argoproj.io"], "resources": ["workflowtaskresults"], "verbs": ["create", "patch"]},
    ]
    meta = {"name": "argo-pipeline", "namespace": namespace}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": rules},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "argo-pipeline"},
            "subjects": [{"kind": "ServiceAccount", "name": "argo-pipeline", "namespace": namespace}],
        },
    ]


def add_pipeline_arguments(parser: argparse.ArgumentParser) -> None:
    """The Workflow's shape, as this module and scripts/pipeline/submit.py both take it (workflow_of reads them)."""
    parser.add_argument("--engine", choices=manifest.ENGINES, default="tfjob")
    parser.add_argument("--models", nargs="+", default=["cnn", "dropout", "batch_norm"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--dataset", help="default: TRAINER_DATASET, else the trainer's own choice")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--runtime", choices=["project", "tf-serving"], default="project")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.pipeline.cluster", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["workflow", "rbac", "inferenceservice"])
    parser.add_argument("--image", default="")
    add_pipeline_arguments(parser)
    parser.add_argument("--replace", action="store_true", help="the selection publishes its winner in any case")
    parser.add_argument("trainer_args", nargs="*", help="the trainer's extra flags, after --")
    args = parser.parse_args(argv)
    try:
        settings = project_settings.load()
    except ValueError as error:  # a setting the manifests cannot hold, named with its fix
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        if args.what == "workflow":
            documents = [workflow_of(args, settings)]
        elif args.what == "rbac":
            documents = rbac(settings)
        else:
            service, runtime = inference_service(args.image, settings, args.runtime)
            documents = [serving_policy(settings)] + ([service] if args.runtime == "tf-serving" else [runtime, service])
    except manifest.ManifestError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(yaml.safe_dump_all(documents, sort_keys=False), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
