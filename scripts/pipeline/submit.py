"""make submit-pipeline and make serve-cluster: the objects scripts/pipeline/cluster.py generates, on the cluster.

  python -m scripts.pipeline.submit workflow --image IMG [--engine tfjob] [--models cnn dropout batch_norm] ...
  python -m scripts.pipeline.submit serving --image IMG [--runtime project|tf-serving]

The Makefile imports the image first (scripts/cluster/import_image.py, as make submit does). `workflow` checks the
volume claim the Workflow applies against the cluster as make submit does (scripts/common/volume_claim.py: exit 2
naming the fix), applies the service account the Workflow's pods run as, creates the Workflow, then prints each step
as it starts and ends: exit 0 once it Succeeded, with each step's time; 1 when it Failed or Errored, naming the step
and Argo's message; 1 after --timeout-s, with the Workflow left running. `serving` applies the predictor's
NetworkPolicy, the ServingRuntime and the InferenceService, and waits until it is Ready (exit 1 after --timeout-s,
with its conditions).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from scripts.common import kubectl as kube
from scripts.common import manifest, volume_claim
from scripts.common import settings as project_settings
from scripts.common.kubectl import KubectlError, kubectl

from . import cluster

DONE = ("Succeeded", "Failed", "Error")
POLL_S = 5.0


def apply(objects: list[dict[str, Any]], namespace: str) -> None:
    kube.apply(objects, namespace, "submit-pipeline")


def create(workflow: dict[str, Any], namespace: str) -> str:
    """Creates the Workflow (its name is generated); returns the name."""
    result = kubectl("create", "-n", namespace, "-o", "name", "-f", "-", stdin=json.dumps(workflow))
    return result.stdout.strip().rsplit("/", 1)[-1]


def status(name: str, namespace: str) -> dict[str, Any]:
    return json.loads(kubectl("get", "workflow", name, "-n", namespace, "-o", "json").stdout).get("status", {})


def seconds(node: dict[str, Any]) -> float | None:
    return kube.seconds_between(node.get("startedAt"), node.get("finishedAt"))


def steps_of(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The Workflow's steps that run something (a pod or a resource), by name."""
    return {node["displayName"]: node for node in state.get("nodes", {}).values() if node.get("type") == "Pod"}


def follow(name: str, namespace: str, timeout_s: float, poll_s: float = POLL_S) -> int:
    seen: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s
    while True:
        state = status(name, namespace)
        for step, node in sorted(steps_of(state).items(), key=lambda item: item[1].get("startedAt") or ""):
            phase = node.get("phase", "Pending")
            if seen.get(step) != phase:
                seen[step] = phase
                message = f": {node['message']}" if node.get("message") and phase in DONE else ""
                print(f"  {step}: {phase}{message}", flush=True)
        phase = state.get("phase", "")
        if phase in DONE:
            break
        if time.monotonic() > deadline:
            print(
                f"error: the Workflow {name} is still {phase or 'Pending'} after {timeout_s:.0f} s; it goes on: "
                f"kubectl get workflow {name} -n {namespace}",
                file=sys.stderr,
            )
            return 1
        time.sleep(poll_s)
    took = seconds(state)
    print(f"Workflow {name}: {phase}" + (f" in {took:.0f} s" if took is not None else ""))
    for step, node in sorted(steps_of(state).items(), key=lambda item: item[1].get("startedAt") or ""):
        step_s = seconds(node)
        if step_s is not None:
            print(f"  {step_s:7.1f} s  {step}")
    if phase != "Succeeded":
        failed = [
            f"{step}: {node.get('message', '')}" for step, node in steps_of(state).items() if node["phase"] in DONE[1:]
        ]
        print(
            f"error: the Workflow {name} {phase.lower()}: {state.get('message', '')}; "
            + ("; ".join(failed) or "no step failed")
            + f" (kubectl get workflow {name} -n {namespace} -o yaml)",
            file=sys.stderr,
        )
        return 1
    return 0


def serve(image: str, runtime: str, settings: dict[str, str], timeout_s: float) -> int:
    namespace, name = settings["NAMESPACE"], settings["JOB_NAME"]
    service, serving_runtime = cluster.inference_service(image, settings, runtime)
    objects = [cluster.serving_policy(settings)] + ([serving_runtime] if runtime == "project" else []) + [service]
    apply(objects, namespace)
    print(f"waiting up to {timeout_s:.0f} s for the InferenceService {name} to be Ready", flush=True)
    ready = kubectl("wait", "-n", namespace, "--for=condition=Ready", f"inferenceservice/{name}",
                    f"--timeout={timeout_s:.0f}s", check=False)  # fmt: skip
    state = json.loads(kubectl("get", "inferenceservice", name, "-n", namespace, "-o", "json").stdout).get("status", {})
    if ready.returncode != 0:
        conditions = "; ".join(
            f"{c['type']}={c['status']}" + (f" ({c['message']})" if c.get("message") else "")
            for c in state.get("conditions", [])
        )
        print(
            f"error: the InferenceService {name} is not Ready after {timeout_s:.0f} s: "
            f"{conditions or 'no conditions'}; see kubectl describe inferenceservice {name} -n {namespace} "
            "and its predictor pod's events",
            file=sys.stderr,
        )
        return 1
    inside = state.get("address", {}).get("url", "")
    print(f"InferenceService {name} is Ready: {state.get('url', '')} (in the cluster: {inside})")
    # Its policy admits only the namespace's pods; a port-forward goes through the predictor's kubelet, on any node.
    rest, grpc = settings["SERVE_PORT"], settings["SERVE_GRPC_PORT"]
    print(f"From this machine: kubectl port-forward -n {namespace} service/{name}-predictor {rest}:80 {grpc}:{grpc}")
    return 0


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m scripts.pipeline.submit", description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["workflow", "serving"])
    parser.add_argument("--image", required=True)
    cluster.add_pipeline_arguments(parser)
    parser.add_argument(
        "--replace", action="store_true", help="publish the selection's winner even where the served model is as good"
    )
    parser.add_argument(
        "--timeout-s",
        type=float,
        help="stop following or waiting after (default: the training "
        f"deadline, {cluster.TRAIN_DEADLINE_SECONDS} s, for a workflow; 600 s for serving)",
    )
    parser.add_argument("trainer_args", nargs="*", help="the trainer's extra flags, after --")
    # The trainer's flags after "--", taken apart here: argparse gives a "*" positional after another one nothing.
    ours, trainer_args = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    args = parser.parse_args(ours)
    args.trainer_args += trainer_args
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    try:
        settings = project_settings.load()
        context = project_settings.kube_context(settings)
        if args.what == "serving":
            return serve(args.image, args.runtime, settings, args.timeout_s or 600)
        namespace = settings["NAMESPACE"]
        workflow = cluster.workflow_of(args, settings)
        # The claim the Workflow applies, checked before anything is created: the variants spread as make submit's job.
        volume_claim.check(cluster.created_objects(workflow), namespace)
        apply(cluster.rbac(settings), namespace)
        name = create(workflow, namespace)
        print(f"Workflow {name} created in {namespace} (context {context}); following it", flush=True)
        return follow(name, namespace, args.timeout_s or cluster.TRAIN_DEADLINE_SECONDS)
    except (ValueError, manifest.ManifestError, KubectlError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
