"""Submits the project's TFJob to the current kubectl context and follows it (make submit).

Steps: render k8s/ with kubectl kustomize; apply the command line; check the TFJob
against the operator's webhook rules and the trainer's own flag parser; refuse if a
TFJob of the same name is still running; import the image into k3d; apply the volume
claim and the chief's status Service; prepare the dataset on the volume (an idempotent
Job that exits at once when the data is there); delete a finished TFJob of the same
name and wait until its pods and services are gone; create the TFJob with the Kubeflow
SDK; follow it to the end. API calls that fail transiently (HTTP 5xx or 429, connection
errors, timeouts) are retried with back-off for up to 5 minutes.

Exit codes: 0 the job succeeded; 1 the job failed; 2 bad command line or manifest;
3 a cluster step failed before the job was created; 4 stopped following (--timeout,
Ctrl-C, or the API server unreachable for too long) while the job may still run.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

from scripts.common import manifest as tfjob_manifest
from scripts.common import settings as project_settings

from . import job_follower
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
    mode.add_argument("--dry-run", action="store_true", help="print the TFJob request body (JSON) and exit")
    mode.add_argument("--status", action="store_true", help="print the job's conditions, pods and the chief's status")
    mode.add_argument("--delete", action="store_true", help="delete the TFJob (the volume and its model stay)")
    parser.add_argument(
        "--kustomize",
        type=pathlib.Path,
        default=tfjob_manifest.K8S_DIR,
        help="kustomization: k8s (sync) or k8s-async (parameter servers) (default: %(default)s)",
    )
    parser.add_argument("--image", help="the image `make image` built, name:tag (required to submit)")
    parser.add_argument("--workers", type=int, default=int(SETTINGS["WORKERS"]), help="Worker replicas")
    parser.add_argument("--dataset", default=SETTINGS["TRAINER_DATASET"], help="the trainer's --dataset")
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
    return args


def build_objects(args: argparse.Namespace) -> list[dict]:
    """The rendered kustomization with the command line applied, checked before any cluster call."""
    objects = tfjob_manifest.customize(
        tfjob_manifest.render(args.kustomize),
        image=args.image,
        workers=args.workers,
        dataset=args.dataset,
        epochs=args.epochs,
        trainer_args=args.trainer_args,
    )
    tfjob = tfjob_manifest.the_one(objects, "TFJob")
    problems = tfjob_manifest.webhook_problems(tfjob)
    if problems:
        raise tfjob_manifest.ManifestError("the operator would reject this TFJob:\n  " + "\n  ".join(problems))
    check_trainer_flags(tfjob)
    return objects


def check_trainer_flags(tfjob: dict) -> None:
    """Runs the trainer's own parser on the container's args and env, so a typo fails here, not in a pod."""
    container = tfjob_manifest.trainer_container(tfjob)
    environ = {entry["name"]: entry.get("value", "") for entry in container.get("env", []) if "value" in entry}
    tfjob_manifest.trainer_config(container.get("args") or [], environ)


def training_client(namespace: str):
    from kubeflow.training import TrainingClient

    return TrainingClient(job_kind="TFJob", namespace=namespace)


def core_api():
    import kubernetes

    kubernetes.config.load_kube_config()
    return kubernetes.client.CoreV1Api()


def follower(namespace: str) -> job_follower.JobFollower:
    return job_follower.JobFollower(training_client(namespace), core_api(), SETTINGS["JOB_NAME"], namespace)


def show_status(namespace: str) -> int:
    watcher = follower(namespace)
    if watcher.current_state() is None:
        print(f"no TFJob {SETTINGS['JOB_NAME']} in namespace {namespace} (make submit creates it)")
        return EXIT_FAILED
    for condition in watcher.conditions():
        print(f"{condition.last_transition_time}  {condition.type}={condition.status}  {condition.message or ''}")
    for pod in watcher.pods():
        restarts = sum(status.restart_count for status in (pod.status.container_statuses or []))
        print(f"pod {pod.metadata.name}: {pod.status.phase}, restarts {restarts}")
    status = watcher.chief_status(f"{SETTINGS['JOB_NAME']}-status")
    print("chief status: " + (json.dumps(status) if status is not None else "not reachable (chief not running)"))
    return EXIT_SUCCEEDED


def foreground():
    """Delete options under which the API server keeps the object until its pods and services are deleted."""
    from kubernetes.client import V1DeleteOptions

    return V1DeleteOptions(propagation_policy="Foreground")


def delete_job(namespace: str) -> int:
    try:
        training_client(namespace).delete_job(SETTINGS["JOB_NAME"], namespace=namespace, delete_options=foreground())
    except RuntimeError as error:
        print(f"could not delete TFJob {SETTINGS['JOB_NAME']}: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(
        f"deleting TFJob {SETTINGS['JOB_NAME']} and its pods (they stop within their grace period); the volume "
        f"{SETTINGS['VOLUME_CLAIM']} and its model stay (make fetch-model copies them out)"
    )
    return EXIT_SUCCEEDED


def prepare_data(objects: list[dict], args: argparse.Namespace) -> None:
    if args.dataset == "synthetic":
        print("dataset synthetic is generated in memory; no data preparation")
        return
    job = tfjob_manifest.the_one(objects, "Job", component="prepare-data")
    name = job["metadata"]["name"]
    cluster_steps.recreate_job(job, args.namespace)
    deadline = float(job["spec"].get("activeDeadlineSeconds", 1800)) + 60
    state = cluster_steps.wait_for_job(name, args.namespace, timeout_s=deadline)
    if state != "Complete":
        raise cluster_steps.StepError(
            f"data preparation Job {name} ended {state}; its last log lines:\n"
            f"{cluster_steps.job_logs(name, args.namespace)}"
        )
    print(cluster_steps.job_logs(name, args.namespace, tail=3).rstrip())


def container_tool() -> str:
    """CONTAINER_TOOL, or the tool `make image` built with when unset: build-image.sh resolves both."""
    import subprocess

    return subprocess.run([str(BUILD_IMAGE), "--print-tool"], capture_output=True, text=True, check=True).stdout.strip()


def earlier_job(watcher: job_follower.JobFollower) -> str | None:
    """The state of a TFJob of the same name (None: there is none; Deleting: make delete is under way); refuses one
    that is still running, before anything on the cluster changes."""
    state = watcher.current_state()
    if state == "Running":
        raise cluster_steps.StepError(
            f"TFJob {watcher.name} is still running in {watcher.namespace}: follow it with `make status`, or "
            f"`make delete` it first"
        )
    return state


def delete_earlier_job(watcher: job_follower.JobFollower, state: str | None) -> None:
    """A TFJob name is unique, and so are its pods' and services' names: a finished TFJob goes first with its pods
    and services (Foreground: the API server keeps the TFJob until the garbage collector has deleted them), and
    what an earlier deletion (make delete) left terminating is waited for, before the new job is created."""
    name = watcher.name
    if state in job_follower.FINISHED:
        print(f"deleting the {state.lower()} TFJob {name} from an earlier run, and its pods and services")
        watcher.call(
            f"deleting TFJob {name}",
            watcher.training.delete_job,
            name,
            namespace=watcher.namespace,
            delete_options=foreground(),
        )
    started, announced = watcher.clock(), state in job_follower.FINISHED
    while True:
        left = [f"pod/{pod.metadata.name}" for pod in watcher.pods()]
        left += [f"service/{service.metadata.name}" for service in watcher.services()]
        if watcher.current_state() is not None:
            left.append(f"tfjob/{name}")
        if not left:
            return
        if not announced:
            print(f"waiting for what is left of an earlier TFJob {name} to go: {', '.join(left)}")
            announced = True
        if watcher.clock() - started >= OLD_JOB_GONE_S:
            raise cluster_steps.StepError(
                f"the earlier TFJob {name} is not gone after {OLD_JOB_GONE_S:.0f} s, still there: {', '.join(left)}. "
                f"Pods stop after their grace period; see `kubectl get pods,svc,tfjob -n {watcher.namespace} "
                f"-l training.kubeflow.org/job-name={name}` and run make submit again once they are gone"
            )
        watcher.sleep(OLD_JOB_POLL_S)


def submit(objects: list[dict], args: argparse.Namespace) -> int:
    context = cluster_steps.current_context()
    print(f"kubectl context: {context}, namespace: {args.namespace}")
    watcher = follower(args.namespace)
    earlier = earlier_job(watcher)
    if context == f"k3d-{SETTINGS['CLUSTER_NAME']}":
        cluster_steps.import_image(args.image, SETTINGS["CLUSTER_NAME"], container_tool())
    else:
        print(
            f"not the project's k3d cluster: skipping the image import; the cluster must be able to pull {args.image}"
        )
    cluster_steps.apply(
        tfjob_manifest.of_kind(objects, "PersistentVolumeClaim")
        + [tfjob_manifest.the_one(objects, "Service", component="training")],
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
    watcher.training.create_job(
        job=tfjob_manifest.to_tfjob(tfjob_manifest.the_one(objects, "TFJob")), namespace=args.namespace
    )
    print(f"created TFJob {SETTINGS['JOB_NAME']} with {args.workers} worker(s) running {args.image}")

    try:
        state = watcher.follow(timeout_s=args.timeout)
    except KeyboardInterrupt:
        state = "Interrupted"
    except job_follower.LostContact as lost:
        print(f"error: {lost}", file=sys.stderr)
        state = "lost contact with the API server"
    if state == "Succeeded":
        print(
            f"TFJob {SETTINGS['JOB_NAME']} succeeded; the model is on volume {SETTINGS['VOLUME_CLAIM']} under "
            f"{SETTINGS['TRAINER_MODEL_DIR']}: `make fetch-model` copies it to ./artifacts/"
        )
        return EXIT_SUCCEEDED
    if state == "Failed":
        print(f"TFJob {SETTINGS['JOB_NAME']} failed", file=sys.stderr)
        try:
            watcher.failure_report()
        except job_follower.LostContact as lost:
            print(f"no failure report: {lost}", file=sys.stderr)
        return EXIT_FAILED
    print(f"stopped following ({state}); TFJob {SETTINGS['JOB_NAME']} may still be running: `make status`, `make logs`")
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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if not (args.status or args.delete):
        try:
            objects = build_objects(args)
        except tfjob_manifest.ManifestError as error:
            print(f"error: {error}", file=sys.stderr)
            return EXIT_USAGE
        if args.dry_run:
            body = tfjob_manifest.request_body(tfjob_manifest.to_tfjob(tfjob_manifest.the_one(objects, "TFJob")))
            body["metadata"]["namespace"] = args.namespace  # where create_job would post it
            print(json.dumps(body, indent=2, sort_keys=True))
            return EXIT_SUCCEEDED
    try:
        if args.status:
            return show_status(args.namespace)
        if args.delete:
            return delete_job(args.namespace)
        return submit(objects, args)
    except cluster_errors() as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_CLUSTER
    except KeyboardInterrupt:
        print("interrupted before the job was followed; `make status` shows what exists", file=sys.stderr)
        return EXIT_STILL_RUNNING


if __name__ == "__main__":
    sys.exit(main())
