"""Submits the project's job (a TFJob, JobSet or TrainJob) to the k3d cluster and follows it (make submit).

Every call names its kubeconfig context: KUBE_CONTEXT when set, else k3d-CLUSTER_NAME, never the current context.

Steps: render the kustomization with kubectl kustomize; apply the command line; check the job
against its engine's webhook rules (k8s/engines/<engine>/cluster.py) and the trainer's own flag parser;
refuse if a job of the same name is still running; import the image into k3d; apply the volume
claim, the chief's status Service and a TrainJob's runtime; prepare the dataset on the volume (an
idempotent Job that exits at once when the data is there); delete a finished job of the same name
in the foreground and wait until its pods and services are gone; create the job with its engine's
real client (TFJob: the kubeflow-training SDK; JobSet: the Kubernetes client; TrainJob: the kubeflow
SDK's TrainerClient); follow it to the end. API calls that fail transiently (HTTP 5xx or 429,
connection errors, timeouts) are retried with back-off for up to 5 minutes.

Exit codes: 0 the job succeeded; 1 the job failed; 2 bad command line or manifest;
3 a cluster step failed before the job was created; 4 stopped following (--timeout,
Ctrl-C, or the API server unreachable for too long) while the job may still run.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from scripts.common import job_engine
from scripts.common import manifest as tfjob_manifest
from scripts.common import settings as project_settings

from . import job_follower, upload_images
from . import steps as cluster_steps

EXIT_SUCCEEDED, EXIT_FAILED, EXIT_USAGE, EXIT_CLUSTER, EXIT_STILL_RUNNING = 0, 1, 2, 3, 4
SETTINGS = project_settings.load()
# The image room's build script names the image and the container tool; submit asks it for the tool only.
BUILD_IMAGE = project_settings.ROOT / "scripts" / "image" / "build-image.sh"
# How long a finished job's pods may take to go (their grace period, then the garbage collector), and the poll.
OLD_JOB_GONE_S, OLD_JOB_POLL_S = 180.0, 2.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.cluster.submit",
        description=__doc__.split("\n\n")[0],
        epilog="Trainer flags go after `--`, e.g. `-- --per-worker-batch-size 128`. " + __doc__.split("\n\n")[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="print the job's request body (JSON) and exit")
    mode.add_argument("--status", action="store_true", help="print the job's conditions, pods and the chief's status")
    mode.add_argument("--delete", action="store_true", help="delete the job (the volume and its model stay)")
    parser.add_argument(
        "--kustomize",
        type=pathlib.Path,
        default=tfjob_manifest.K8S_DIR,
        help="kustomization (make passes k8s/engines/ENGINE/STRATEGY); its job's kind picks the engine "
        "(default: %(default)s)",
    )
    parser.add_argument("--image", help="the image `make image` built, name:tag (required to submit)")
    parser.add_argument("--workers", type=int, default=int(SETTINGS["WORKERS"]), help="Worker replicas")
    parser.add_argument(
        "--dataset",
        help="the trainer's --dataset (default: image_folder with --images, else TRAINER_DATASET, else the trainer's "
        "own choice: your module's dataset, else fashion_mnist)",
    )
    parser.add_argument(
        "--images",
        help="a local image folder that make upload-images copied to the volume: train on its copy there "
        "(--dataset image_folder, TRAINER_IMAGE_DIR=IMAGES_ROOT/<its name>)",
    )
    parser.add_argument("--epochs", type=int, help="the trainer's --epochs")
    parser.add_argument("--namespace", default=SETTINGS["NAMESPACE"])
    parser.add_argument(
        "--timeout", type=float, default=0, help="stop following after this many seconds (0: until the job ends)"
    )
    parser.add_argument(
        "--tensorboard",
        action="store_true",
        help="also run TensorBoard on the volume's logs (kubectl port-forward to view)",
    )
    parser.add_argument("trainer_args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trainer_args[:1] == ["--"]:
        args.trainer_args = args.trainer_args[1:]
    if args.trainer_args and args.trainer_args[0] != "" and not args.trainer_args[0].startswith("-"):
        parser.error(f"unexpected argument {args.trainer_args[0]!r}; trainer flags go after `--`")
    if not (args.status or args.delete) and not args.image:
        parser.error("--image is required: pass the image `make image` built (make submit does)")
    args.dataset = args.dataset or (upload_images.IMAGE_FOLDER if args.images else None)
    args.image_dir = None
    if args.images is not None:
        if args.dataset != upload_images.IMAGE_FOLDER:
            parser.error(f"IMAGES= trains --dataset {upload_images.IMAGE_FOLDER}, not {args.dataset}: drop DATASET=")
        try:
            args.image_dir = upload_images.volume_dir(upload_images.folder_of(args.images).name)
        except upload_images.UploadError as error:
            parser.error(str(error))
    return args


def dataset_options(args: argparse.Namespace) -> dict[str, str]:
    """The dataset's flags the command line sets besides --dataset: --image-dir, the volume's copy of --images."""
    image_dir = getattr(args, "image_dir", None)
    return {"image-dir": image_dir} if image_dir else {}


def build_objects(args: argparse.Namespace) -> list[dict]:
    """The rendered kustomization with the command line applied, checked before any cluster call."""
    objects = tfjob_manifest.customize(
        tfjob_manifest.render(args.kustomize),
        image=args.image,
        workers=args.workers,
        dataset=args.dataset,
        epochs=args.epochs,
        trainer_args=args.trainer_args,
        dataset_options=dataset_options(args),
    )
    kind = job_engine.engine_kind(objects)
    who, problems = job_engine.cluster_part(kind).admission_problems(objects)
    if problems:
        raise tfjob_manifest.ManifestError(f"{who} would reject this {kind}:\n  " + "\n  ".join(problems))
    chief_config(objects, kind)
    return objects


def chief_config(objects: list[dict], kind: str):
    """The chief's settings, read by the trainer's own parser from its container's args and environment, so a typo
    fails here, not in a pod."""
    container = job_engine.cluster_part(kind).chief_container(objects)
    return tfjob_manifest.trainer_config(container.get("args") or [], plain_environment(container, objects))


def plain_environment(container: dict, objects: list[dict]) -> dict[str, str]:
    """The container's literal variables as the kubelet sets them: its envFrom ConfigMaps (rendered beside it, with
    their prefix) first, then its env values, the later winning. valueFrom entries are left out (set at run time)."""
    config_maps = {obj["metadata"]["name"]: obj.get("data") or {} for obj in objects if obj.get("kind") == "ConfigMap"}
    environ: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        data = config_maps.get((source.get("configMapRef") or {}).get("name"), {})
        environ.update({source.get("prefix", "") + key: value for key, value in data.items()})
    for entry in container.get("env") or []:
        if "value" in entry:
            environ[entry["name"]] = entry["value"]
        else:
            environ.pop(entry["name"], None)
    return environ


def training_client(namespace: str):
    from kubeflow.training import TrainingClient

    return TrainingClient(job_kind="TFJob", namespace=namespace, context=cluster_steps.context())


def trainer_client(namespace: str):
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient

    return TrainerClient(backend_config=KubernetesBackendConfig(namespace=namespace, context=cluster_steps.context()))


def custom_objects_api():
    import kubernetes

    kubernetes.config.load_kube_config(context=cluster_steps.context())
    return kubernetes.client.CustomObjectsApi()


def core_api():
    import kubernetes

    kubernetes.config.load_kube_config(context=cluster_steps.context())
    return kubernetes.client.CoreV1Api()


def engine_for(objects: list[dict], namespace: str) -> job_engine.Engine:
    """The rendered job's engine, behind its real client (made here, so that a test can stand in for it)."""
    clients = job_engine.Clients(training=training_client, custom_objects=custom_objects_api, trainer=trainer_client)
    return job_engine.cluster_part(job_engine.engine_kind(objects)).engine(objects, namespace, clients)


def follower(objects: list[dict], namespace: str) -> job_follower.JobFollower:
    return job_follower.JobFollower(engine_for(objects, namespace), core_api())


def show_status(objects: list[dict], namespace: str) -> int:
    watcher = follower(objects, namespace)
    if watcher.current_state() is None:
        print(f"no {watcher.kind} {watcher.name} in namespace {namespace} (make submit creates it)")
        return EXIT_FAILED
    for condition in watcher.conditions():
        print(f"{condition.last_transition_time}  {condition.type}={condition.status}  {condition.message or ''}")
    pods = watcher.pods()
    for pod in pods:
        restarts = sum(status.restart_count for status in (pod.status.container_statuses or []))
        print(f"pod {pod.metadata.name}: {pod.status.phase}, restarts {restarts}, node {pod.spec.node_name}")
    for node, why in watcher.lost_nodes(pods).items():
        print(
            lost_node_advice(
                node, why, [pod.metadata.name for pod in pods if pod.spec.node_name == node], watcher.engine
            )
        )
    status = watcher.chief_status()
    print("chief status: " + (json.dumps(status) if status is not None else "not reachable (chief not running)"))
    return EXIT_SUCCEEDED


def lost_node_advice(node: str, why: str, pods: list[str], engine: job_engine.Engine) -> str:
    """What to do about a node that stopped answering while it holds pods of the job (docs/cluster.md, a lost node)."""
    after = f"The {engine.kind} then {engine.after_lost_pods}"
    return (
        f"node {node} is not ready ({why}); this job's pods on it: {', '.join(pods)}. Kubernetes keeps them, under "
        f"their names, until the node answers again. If it will not (powered off, gone), make sure it is down, then "
        f"mark it out of service, which deletes them:\n"
        f"  kubectl taint nodes {node} node.kubernetes.io/out-of-service=nodeshutdown:NoExecute\n"
        f"{after} Once the node is back: kubectl taint nodes {node} node.kubernetes.io/out-of-service-"
    )


def create_job(watcher: job_follower.JobFollower, objects: list[dict]) -> None:
    """The engine creates the job, repeated while that fails transiently (a webhook the API server could not reach,
    HTTP 5xx or 429: job_follower.transient_reason). A repeat answered 409 AlreadyExists means a try reported as
    failed had stored it: submit deleted any job of this name before the first try."""
    tries = 0

    def create() -> None:
        nonlocal tries
        tries += 1
        try:
            watcher.engine.create(objects)
        except Exception as error:
            if tries > 1 and job_follower.api_status(error) == 409:
                return
            raise

    watcher.call(f"creating {watcher.kind} {watcher.name}", create)


def delete_job(objects: list[dict], namespace: str) -> int:
    watcher = follower(objects, namespace)
    try:
        watcher.delete()
    except job_follower.LostContact as error:
        print(f"could not delete {watcher.kind} {watcher.name}: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(
        f"deleting {watcher.kind} {watcher.name} and its pods in the foreground (they stop within their grace "
        f"period); the volume {SETTINGS['VOLUME_CLAIM']} and its model stay (make fetch-model copies them out)"
    )
    return EXIT_SUCCEEDED


def prepare_data(objects: list[dict], args: argparse.Namespace) -> None:
    dataset = args.dataset or chief_config(objects, job_engine.engine_kind(objects)).dataset
    if dataset == "synthetic":
        print("dataset synthetic is generated in memory; no data preparation")
        return
    job = tfjob_manifest.the_one(objects, "Job", component="prepare-data")
    name = job["metadata"]["name"]
    cluster_steps.recreate_job(job, args.namespace)
    deadline = float(job["spec"].get("activeDeadlineSeconds", 1800)) + 60
    state = cluster_steps.wait_for_job(name, args.namespace, timeout_s=deadline)
    if state != "Complete":
        image_dir = dataset_options(args).get("image-dir")
        uploaded = f" (is {image_dir} there? make upload-images IMAGES=... copies it)" if image_dir else ""
        raise cluster_steps.StepError(
            f"data preparation Job {name} ended {state}{uploaded}; its last log lines:\n"
            f"{cluster_steps.job_logs(name, args.namespace)}"
        )
    print(cluster_steps.job_logs(name, args.namespace, tail=3).rstrip())


def container_tool() -> str:
    """CONTAINER_TOOL, or the tool `make image` built with when unset: build-image.sh resolves both."""
    import subprocess

    return subprocess.run([str(BUILD_IMAGE), "--print-tool"], capture_output=True, text=True, check=True).stdout.strip()


def earlier_job(watcher: job_follower.JobFollower) -> str | None:
    """The state of a job of the same name (None: there is none; Deleting: make delete is under way); refuses one
    that is still running, before anything on the cluster changes."""
    state = watcher.current_state()
    if state == "Running":
        raise cluster_steps.StepError(
            f"{watcher.kind} {watcher.name} is still running in {watcher.namespace}: follow it with `make status`, "
            f"or `make delete` it first"
        )
    return state


def delete_earlier_job(watcher: job_follower.JobFollower, state: str | None) -> None:
    """A job name is unique, and so are its pods' and services' names: a finished job goes first with its pods
    and services (Foreground: the API server keeps the job until the garbage collector has deleted them), and
    what an earlier deletion (make delete) left terminating is waited for, before the new job is created."""
    name, kind = watcher.name, watcher.kind
    if state in job_follower.FINISHED:
        print(f"deleting the {state.lower()} {kind} {name} from an earlier run, and its pods and services")
        watcher.delete()
    started, announced = watcher.clock(), state in job_follower.FINISHED
    while True:
        left = [f"pod/{pod.metadata.name}" for pod in watcher.pods()]
        left += [f"service/{service.metadata.name}" for service in watcher.services()]
        if watcher.current_state() is not None:
            left.append(f"{kind.lower()}/{name}")
        if not left:
            return
        if not announced:
            print(f"waiting for what is left of an earlier {kind} {name} to go: {', '.join(left)}")
            announced = True
        if watcher.clock() - started >= OLD_JOB_GONE_S:
            raise cluster_steps.StepError(
                f"the earlier {kind} {name} is not gone after {OLD_JOB_GONE_S:.0f} s, still there: {', '.join(left)}. "
                f"Pods stop after their grace period; see `kubectl get pods,svc,{kind.lower()} -n {watcher.namespace} "
                f"-l {watcher.engine.pod_selector()}` and run make submit again once they are gone"
            )
        watcher.sleep(OLD_JOB_POLL_S)


def submit(objects: list[dict], args: argparse.Namespace) -> int:
    context = cluster_steps.check_context()
    print(f"kubectl context: {context}, namespace: {args.namespace}")
    watcher = follower(objects, args.namespace)
    kind, name = watcher.kind, watcher.name
    earlier = earlier_job(watcher)
    cluster_steps.check_volume_claim(objects, args.namespace)
    cluster_steps.import_image_to_cluster(context, args.image, container_tool())
    # A TrainJob's runtime goes first: Trainer's webhook refuses a TrainJob whose runtime does not exist yet. The
    # NetworkPolicies go before any pod of the job exists, so no pod is ever reachable beyond them.
    # The settings ConfigMap too: every pod of the job takes its environment from it (envFrom), and a kubelet
    # refuses to start a container whose ConfigMap does not exist.
    cluster_steps.apply(
        tfjob_manifest.of_kind(objects, "NetworkPolicy")
        + tfjob_manifest.of_kind(objects, "ConfigMap")
        + tfjob_manifest.of_kind(objects, "PersistentVolumeClaim")
        + [tfjob_manifest.the_one(objects, "Service", component="training")]
        + job_engine.cluster_part(job_engine.engine_kind(objects)).objects_before_job(objects),
        args.namespace,
    )
    if args.tensorboard:
        cluster_steps.apply(
            [
                obj
                for obj in objects
                if obj["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "tensorboard"
            ],
            args.namespace,
        )
        print(f"TensorBoard: kubectl port-forward -n {args.namespace} svc/{SETTINGS['JOB_NAME']}-tensorboard 6006:6006")
    prepare_data(objects, args)

    delete_earlier_job(watcher, earlier)
    create_job(watcher, objects)
    print(f"created {kind} {name} with {args.workers} worker(s) running {args.image}")

    try:
        state = watcher.follow(timeout_s=args.timeout)
    except KeyboardInterrupt:
        state = "Interrupted"
    except job_follower.LostContact as lost:
        print(f"error: {lost}", file=sys.stderr)
        state = "lost contact with the API server"
    if state == "Succeeded":
        print(
            f"{kind} {name} succeeded; the model is on volume {SETTINGS['VOLUME_CLAIM']} under "
            f"{SETTINGS['MODEL_ROOT']}/{SETTINGS['JOB_NAME']}: `make fetch-model` copies it to ./artifacts/"
        )
        return EXIT_SUCCEEDED
    if state == "Failed":
        print(f"{kind} {name} failed", file=sys.stderr)
        try:
            watcher.failure_report()
        except job_follower.LostContact as lost:
            print(f"no failure report: {lost}", file=sys.stderr)
        return EXIT_FAILED
    print(f"stopped following ({state}); {kind} {name} may still be running: `make status`, `make logs`")
    return EXIT_STILL_RUNNING


def cluster_errors() -> tuple[type[BaseException], ...]:
    """What talking to a cluster can raise that deserves a message rather than a traceback."""
    import kubernetes
    import urllib3

    return (
        cluster_steps.StepError,
        tfjob_manifest.ManifestError,
        job_follower.LostContact,
        RuntimeError,
        TimeoutError,
        kubernetes.config.ConfigException,
        kubernetes.client.ApiException,
        urllib3.exceptions.HTTPError,
    )


def with_cause(error: BaseException) -> str:
    """The error's first line and, where it wraps the server's answer, that answer in one line: the SDKs' "Failed to
    create ..." keep the reason (a webhook's refusal, a quota) in the exception they raise from, or as its dump."""
    first = (str(error).splitlines() or [""])[0]
    answer = job_follower.describe(error) if job_follower.api_status(error) is not None else ""
    return f"{first}: {answer}" if answer and answer not in first else first


def request_body(objects: list[dict], namespace: str) -> dict:
    """What creating the job sends: the SDK's TFJob body; the JobSet as rendered; the TrainJob as rendered with the
    image the SDK's CustomTrainerContainer carries (test_submit_engines checks the SDK sends exactly this)."""
    body = job_engine.cluster_part(job_engine.engine_kind(objects)).request_body(objects)
    body["metadata"]["namespace"] = namespace  # where the client would post it
    return body


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        objects = tfjob_manifest.render(args.kustomize) if args.status or args.delete else build_objects(args)
    except tfjob_manifest.ManifestError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        print(json.dumps(request_body(objects, args.namespace), indent=2, sort_keys=True))
        return EXIT_SUCCEEDED
    try:
        if args.status:
            return show_status(objects, args.namespace)
        if args.delete:
            return delete_job(objects, args.namespace)
        return submit(objects, args)
    except cluster_errors() as error:
        print(f"error: {with_cause(error)}", file=sys.stderr)
        return EXIT_CLUSTER
    except KeyboardInterrupt:
        print("interrupted before the job was followed; `make status` shows what exists", file=sys.stderr)
        return EXIT_STILL_RUNNING


if __name__ == "__main__":
    sys.exit(main())
