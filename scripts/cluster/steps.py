"""The cluster-side steps before a TFJob starts: the volume claim's check, image import, apply, data preparation.

They shell out to the tools the user already has (kubectl, k3d, the container tool that
built the image), so what runs is what docs/cluster.md tells the user to run by hand.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import yaml

from scripts.common import settings as project_settings
from scripts.common import volume_claim

Manifest = dict[str, Any]


class StepError(RuntimeError):
    """A step failed; the message says which and what to try."""


def run(
    command: list[str], stdin: str | None = None, check: bool = True, quiet: bool = False
) -> subprocess.CompletedProcess:
    """Runs a command (echoed with its output unless quiet); StepError with its stderr if it fails."""
    if shutil.which(command[0]) is None:
        raise StepError(f"{command[0]} is not installed or not on PATH (see docs/cluster.md)")
    if not quiet:
        print("+ " + " ".join(command), flush=True)
    result = subprocess.run(command, input=stdin, capture_output=True, text=True)
    if check and result.returncode != 0:
        raise StepError(f"`{' '.join(command)}` failed (exit {result.returncode}):\n{result.stderr.strip()}")
    if not quiet and result.stdout.strip():
        print(result.stdout.rstrip(), flush=True)
    return result


def context() -> str:
    """The context every kubectl call here names (KUBE_CONTEXT, else the k3d cluster's), never the current one."""
    return project_settings.kube_context(project_settings.load())


def kubectl(*args: str) -> list[str]:
    """A kubectl command on the project's context (a global flag, so it may come last)."""
    return ["kubectl", *args, "--context", context()]


def check_context() -> str:
    """The context, once it is known to be in the kubeconfig; StepError saying how to get it otherwise."""
    name = context()
    result = run(["kubectl", "config", "get-contexts", "-o", "name"], check=False, quiet=True)
    if name not in result.stdout.split():
        raise StepError(
            f"your kubeconfig has no context {name}: run `make k3d-up` for the project's cluster, or name the context "
            f"to use with KUBE_CONTEXT= (kubectl config get-contexts lists them)"
        )
    return name


def check_volume_claim(objects: list[Manifest], namespace: str) -> None:
    """StepError, before anything is created, unless the job's claim can serve its pods on this cluster."""
    try:
        volume_claim.check(objects, namespace, lambda *args: run(kubectl(*args), quiet=True).stdout)
    except volume_claim.VolumeClaimError as error:
        raise StepError(str(error)) from None


def import_image_to_cluster(context: str, image: str, container_tool: str) -> None:
    """The image into the project's k3d cluster or local node, whichever CONTEXT names; another cluster pulls it."""
    settings = project_settings.load()
    if context == f"k3d-{settings['CLUSTER_NAME']}":
        import_image(image, settings["CLUSTER_NAME"], container_tool)
    elif context == f"node-{settings['CLUSTER_NAME']}" and "NODE_RUN" in settings:  # the local node's room is here
        import_image_to_node(image, container_tool, node_sockets(settings["NODE_RUN"]))
    else:
        print(f"not the project's k3d cluster: skipping the image import; the cluster must be able to pull {image}")


def node_sockets(node_run: str) -> list[str]:
    """Every local node's containerd socket: node 0's in NODE_RUN, the agent's (make cluster-up NODES=2) in a folder
    of it."""
    run_dir = pathlib.Path(node_run)
    return [str(socket) for socket in [run_dir / "containerd.sock", *sorted(run_dir.glob("*/containerd.sock"))]]


def import_image_to_node(image: str, container_tool: str, containerd_sockets: list[str]) -> None:
    """Copies the locally built image into each local node's containerd (make cluster-up), from one archive."""
    if container_tool not in ("podman", "buildah"):
        raise StepError(f"the local node imports images built with podman or buildah, not {container_tool or 'docker'}")
    # The node keeps the local image's ID as a label: an image already there is not copied again.
    inspect = [container_tool, "inspect", "--type", "image", "--format", "{{.FromImageID}}", image]
    if container_tool == "podman":
        inspect = ["podman", "image", "inspect", "--format", "{{.Id}}", image]
    image_id = run(inspect, quiet=True).stdout.strip()
    name = kubelet_name(image)
    lacking = []
    for socket in containerd_sockets:
        ctr = ["ctr", "--address", socket, "-n", "k8s.io", "images"]
        held = run([*ctr, "ls", "-q", f'name=={name},labels."{IMAGE_ID_LABEL}"=={image_id}'], quiet=True).stdout
        if name in held.split():
            print(f"the node at {socket} already holds {image} (image {image_id[:12]}); not importing it again")
        else:
            lacking.append(ctr)
    if not lacking:
        return
    with _docker_archive(image, container_tool) as archive:
        for ctr in lacking:
            run([*ctr, "import", archive])
            run([*ctr, "label", name, f"{IMAGE_ID_LABEL}={image_id}"], quiet=True)


def import_image(image: str, cluster: str, container_tool: str) -> None:
    """Copies the locally built image into the k3d cluster's nodes (no registry involved).

    k3d reads images from the Docker daemon; images built with podman or buildah go
    through a docker-archive tarball named like Docker would name them.
    """
    if container_tool in ("", "docker"):
        run(["k3d", "image", "import", image, "--cluster", cluster])
        return
    if container_tool not in ("podman", "buildah"):
        raise StepError(f"CONTAINER_TOOL={container_tool!r} is not one of docker, podman, buildah")
    with _docker_archive(image, container_tool) as archive:
        run(["k3d", "image", "import", archive, "--cluster", cluster])


IMAGE_ID_LABEL = "io.tf-multiworker-trainer.image-id"


def kubelet_name(image: str) -> str:
    """The name a kubelet resolves an image to: an unqualified name is docker.io/library/NAME."""
    return image if "/" in image.split(":")[0] else f"docker.io/library/{image}"


@contextlib.contextmanager
def _docker_archive(image: str, container_tool: str) -> Iterator[str]:
    """The image saved as a docker-archive under the name a kubelet resolves it to, for as long as the block that
    imports it runs."""
    docker_name = kubelet_name(image)
    with tempfile.TemporaryDirectory(prefix="image-import-") as scratch:
        archive = os.path.join(scratch, "image.tar")
        run([container_tool, "push", image, f"docker-archive:{archive}:{docker_name}"])
        yield archive


def apply(objects: list[Manifest], namespace: str) -> None:
    """Server-side apply: creates or updates, and re-running changes nothing."""
    if objects:
        run(
            kubectl("apply", "--server-side", "--field-manager=submit-py", "-n", namespace, "-f", "-"),
            stdin=yaml.safe_dump_all(objects, sort_keys=False),
        )


def recreate_job(job: Manifest, namespace: str) -> None:
    """A Job's pod template is immutable, so a new image means delete, then create."""
    name = job["metadata"]["name"]
    run(kubectl("delete", "job", name, "-n", namespace, "--ignore-not-found", "--wait=true"))
    run(kubectl("create", "-n", namespace, "-f", "-"), stdin=yaml.safe_dump(job, sort_keys=False))


def wait_for_job(name: str, namespace: str, timeout_s: float, poll_s: float = 5.0) -> str:
    """Waits until a batch Job is Complete or Failed; returns which ("Timeout" if neither)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = run(
            kubectl(
                "get",
                "job",
                name,
                "-n",
                namespace,
                "-o",
                'jsonpath={range .status.conditions[?(@.status=="True")]}{.type}{"\\n"}{end}',
            ),
            check=False,
            quiet=True,
        )
        states = set(result.stdout.split())
        for state in ("Complete", "Failed"):
            if state in states:
                return state
        time.sleep(poll_s)
    return "Timeout"


def job_logs(name: str, namespace: str, tail: int = 40) -> str:
    result = run(kubectl("logs", f"job/{name}", "-n", namespace, f"--tail={tail}"), check=False, quiet=True)
    return result.stdout or result.stderr
