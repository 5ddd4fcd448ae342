"""What the cluster suite does on the local node (make cluster-up), as a user does it: kubectl on its context, the
project's make targets with KUBE_CONTEXT set, and the node's containerd for what only the node can do (a SIGKILL).
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest

from scripts.cluster.steps import node_sockets
from scripts.common import settings as project_settings
from trainer.artifacts.layout import STATUS

ROOT = pathlib.Path(__file__).resolve().parents[3]
SETTINGS = project_settings.load()
CONTEXT = f"node-{SETTINGS['CLUSTER_NAME']}"
NAMESPACE = SETTINGS["NAMESPACE"]
# The cluster suite's two nodes (make cluster-up NODES=2, scripts/node/nodes.sh): the host's and the agent.
NODES = (SETTINGS["CLUSTER_NAME"], f"{SETTINGS['CLUSTER_NAME']}-agent")
# A short job: the synthetic dataset needs no download (no network here), two workers as the card says.
SHORT_JOB = ["DATASET=synthetic", "EPOCHS=1", "ARGS=--train-examples 2048 --test-examples 512"]
CHECKPOINT_EVERY = 50
# Long enough to be hit and recover: three epochs of 256 steps at the group's batch of 2 x 64. Each fault waits for
# a checkpoint past the last, so the faults take a few checkpoints' steps, on a machine of any speed.
LONG_JOB = [
    "DATASET=synthetic",
    "EPOCHS=3",
    f"ARGS=--train-examples 32768 --test-examples 512 --checkpoint-every {CHECKPOINT_EVERY}",
]
STEPS_PER_EPOCH = 256
TOTAL_STEPS = 3 * STEPS_PER_EPOCH
# One fault and its recovery need one epoch: the fault comes at the first checkpoint, a fifth of the way in.
ONE_EPOCH_JOB = ["EPOCHS=1" if flag.startswith("EPOCHS=") else flag for flag in LONG_JOB]


KUBECTL = ["kubectl", "--context", CONTEXT]


def kubectl(*args: str, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*KUBECTL, *args], input=stdin, capture_output=True, text=True, check=check)


def make_environment() -> dict[str, str]:
    return {**os.environ, "KUBE_CONTEXT": CONTEXT}


# The session builds the image once (conftest.py's image_built); each make call takes it as built, as a user's second
# `make submit` of unchanged code could, instead of running every cached build step again.
MAKE = ["make", "--no-print-directory"]
IMAGE_AS_BUILT = ["-o", "image"]


def make(
    *args: str, check: bool = True, timeout: float = 1200, image_as_built: bool = True
) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [*MAKE, *(IMAGE_AS_BUILT if image_as_built else []), *args],
        cwd=ROOT,
        env=make_environment(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        pytest.fail(
            f"make {' '.join(args)} exited {result.returncode}:\n{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        )
    return result


def start_make(*args: str, log: pathlib.Path) -> subprocess.Popen[str]:
    """make in the background, its output in LOG (a pipe nobody reads would stall it)."""
    output = log.open("w")
    return subprocess.Popen(
        [*MAKE, *IMAGE_AS_BUILT, *args],
        cwd=ROOT,
        env=make_environment(),
        stdout=output,
        stderr=subprocess.STDOUT,
        text=True,
    )


def wait_until(what: str, check: Callable[[], Any], timeout_s: float = 300, poll_s: float = 2) -> Any:
    """CHECK's first true answer, polled; fails naming WHAT after TIMEOUT_S."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        answer = check()
        if answer:
            return answer
        time.sleep(poll_s)
    pytest.fail(f"timed out after {timeout_s:.0f} s waiting for {what}")


def pods(selector: str) -> list[dict]:
    return json.loads(kubectl("get", "pods", "-n", NAMESPACE, "-l", selector, "-o", "json").stdout)["items"]


def nodes_of(selector: str) -> set[str]:
    """The nodes the pods SELECTOR picks ran on."""
    return {pod["spec"].get("nodeName") for pod in pods(selector)}


def chief_status(*make_args: str) -> dict | None:
    """The chief's live /status as `make status` prints it (through a port-forward to the chief's pod)."""
    printed = make("status", *make_args, check=False).stdout
    for line in printed.splitlines():
        if line.startswith("chief status: {"):
            return json.loads(line.removeprefix("chief status: "))
    return None


def trainer_host_pid(pod: dict) -> int:
    """The host PID of the pod's trainer container, from its node's containerd (node 0's in NODE_RUN, the agent's in a
    folder of it; the pod's status names the task)."""
    container_id = pod["status"]["containerStatuses"][0]["containerID"].removeprefix("containerd://")
    for socket in node_sockets(SETTINGS["NODE_RUN"]):
        tasks = subprocess.run(
            ["ctr", "--address", socket, "-n", "k8s.io", "tasks", "ls"], capture_output=True, text=True, check=True
        ).stdout
        for line in tasks.splitlines()[1:]:
            task, pid, _status = line.split()
            if task == container_id:
                return int(pid)
    pytest.fail(f"no containerd task for {pod['metadata']['name']}'s container {container_id}")


def project_image() -> str:
    """The image `make image` built and `make submit` imported, name:tag, as the Makefile names it."""
    environment = {key: value for key, value in os.environ.items() if key != "IMAGE"}
    return subprocess.run(
        [str(ROOT / "scripts/image/build-image.sh"), "--print-image"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def volume_on_node(namespace: str = NAMESPACE) -> pathlib.Path | None:
    """The namespace's claim as the node's disk holds it (local-path keeps it there); None before it is bound."""
    claim = kubectl("get", "pvc", "-n", namespace, SETTINGS["VOLUME_CLAIM"], "-o", "json", check=False).stdout
    volume = json.loads(claim or "{}").get("spec", {}).get("volumeName")
    if not volume:
        return None
    return pathlib.Path(json.loads(kubectl("get", "pv", volume, "-o", "json").stdout)["spec"]["hostPath"]["path"])


def model_dir_on_node(job_name: str, namespace: str = NAMESPACE) -> pathlib.Path | None:
    """JOB_NAME's model directory as the node's disk holds it; None before the claim is bound."""
    root = volume_on_node(namespace)
    if root is None:
        return None
    return root / pathlib.PurePosixPath(SETTINGS["MODEL_ROOT"]).relative_to(SETTINGS["MOUNT_PATH"]) / job_name


# 0: connected; anything else (refused, unreachable, timed out) is a refusal.
PROBE = "import socket, sys; s = socket.socket(); s.settimeout(3); print(s.connect_ex((sys.argv[1], int(sys.argv[2]))))"


def connects(pod: str, namespace: str, address: str, port: int) -> bool:
    """Whether POD (its image has Python) opens a TCP connection to ADDRESS:PORT."""
    probed = kubectl("exec", "-n", namespace, pod, "--", "python3", "-c", PROBE, address, str(port), check=False)
    assert probed.returncode == 0, probed.stderr
    return probed.stdout.strip() == "0"


def clear_model_dir(job_name: str) -> None:
    """A fresh start for JOB_NAME: a rerun of the suite on the same node would otherwise meet an earlier run's
    checkpoints, which the trainer refuses."""
    model_dir = model_dir_on_node(job_name)
    if model_dir is not None:
        shutil.rmtree(model_dir, ignore_errors=True)


def fetch_model(destination: pathlib.Path, job_name: str | None = None, namespace: str | None = None) -> pathlib.Path:
    """make fetch-model's script, into DESTINATION (make fetch-model writes ./artifacts); the model directory (the
    published model, where there is one, lands beside it in DESTINATION/published)."""
    environment = {**make_environment(), "IMAGE": project_image()}
    if job_name:
        environment["JOB_NAME"] = job_name
    if namespace:
        environment["NAMESPACE"] = namespace
    fetched = subprocess.run(
        ["scripts/cluster/fetch-model.sh", str(destination)], cwd=ROOT, env=environment, capture_output=True, text=True
    )
    assert fetched.returncode == 0, fetched.stderr
    return destination / "model"


@functools.cache
def image_built() -> None:
    """make image once per session, unless make test-cluster built it just before (CLUSTER_SUITE_IMAGE names it), and
    the image in every node's containerd, as make submit imports it: a test's own pods name it before any submit
    may have run. A lock keeps pytest-xdist's workers from building at once. Every make call then takes it as built."""
    with open(f"/tmp/distml-cluster-suite-{CONTEXT}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.environ.get("CLUSTER_SUITE_IMAGE") != project_image():
            make("image", image_as_built=False)
        imported = subprocess.run(
            [sys.executable, "-m", "scripts.cluster.import_image", project_image()],
            cwd=ROOT,
            env=make_environment(),
            capture_output=True,
            text=True,
        )
        if imported.returncode != 0:
            pytest.fail(f"importing {project_image()} into the node failed:\n{imported.stdout}{imported.stderr}")


def status_on_disk(job_name: str) -> dict | None:
    """The chief's status.json, as it writes it on the volume."""
    model_dir = model_dir_on_node(job_name)
    try:
        return json.loads((model_dir / STATUS).read_text()) if model_dir else None
    except (FileNotFoundError, json.JSONDecodeError):  # not written yet, or read mid-replace
        return None


def running_past(restarts: int, step: int, job_name: str) -> dict:
    """The chief's status once it trains after RESTARTS restarts and has checkpointed beyond STEP."""

    def check() -> dict | None:
        status = status_on_disk(job_name)
        if not status or status.get("state") != "running" or status["restarts"] < restarts:
            return None
        return status if status.get("checkpoint_step", 0) > step else None

    return wait_until(f"the chief to checkpoint past step {step} after {restarts} restart(s)", check, 600, poll_s=0.5)
