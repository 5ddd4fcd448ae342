"""Copies a local image folder to the job's volume (make upload-images IMAGES=DIR), for `make submit IMAGES=DIR` to
train on (--dataset image_folder): DIR holds train/<class>/*.png|jpg|jpeg|gif|bmp and optionally test/<class>/.

The copy lies at IMAGES_ROOT/<DIR's name> on the volume (volume_dir, which submit asks too). A helper pod runs as the
data Job's pod does (its pod template: Pod Security Standard restricted, no service-account token, the trainer image,
the volume at MOUNT_PATH). Files are compared by content, a sha256 per file computed here and in the pod on the
volume (on_volume.py, the same code at both ends); only those missing or different there are sent, in one tar
stream through `kubectl exec`. Each is written beside its place and renamed once its sha256 checks, so an
interrupted upload (Ctrl-C, a killed pod) leaves no half-written file under a final name, and running it again
finishes the job. Files on the volume that the folder does not hold are listed and left, or removed with --prune.

Exit codes: 0 the volume holds the folder; 2 bad input (the folder, a setting, no kubectl), named with its fix;
3 a cluster step failed (no context, a claim the job could not use, the pod did not start, the copy stopped);
130 interrupted (what was copied stays: run it again to finish).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import os
import pathlib
import posixpath
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import IO

from scripts.common import manifest
from scripts.common import settings as project_settings

from . import on_volume, steps

EXIT_DONE, EXIT_USAGE, EXIT_CLUSTER, EXIT_INTERRUPTED = 0, 2, 3, 130
SETTINGS = project_settings.load()
IMAGE_FOLDER = "image_folder"  # the trainer's dataset kind that reads such a folder (--image-dir)
CONTAINER = "upload"
# The helper pod sleeps at most this long: an upload killed before it could delete the pod (SIGKILL) leaves it that
# long, and the next upload replaces it.
HELPER_LIFETIME_S = 4 * 3600
# The pod waits for the scheduler and, on a cluster that pulls the image instead of importing it, for the pull.
READY_TIMEOUT_S = 600.0
# Why a container cannot start that waiting longer does not cure.
STUCK = {"ErrImagePull", "ImagePullBackOff", "ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError"}
# Enough for Python hashing and streaming in chunks; the pod holds no image in memory.
RESOURCES = {
    "requests": {"cpu": "50m", "memory": "128Mi", "ephemeral-storage": "16Mi"},
    "limits": {"cpu": "1", "memory": "256Mi", "ephemeral-storage": "64Mi"},
}
SHOWN = 5  # names listed in a refusal or a report before "and N more"


class UploadError(ValueError):
    """Bad input; the message names the problem and the fix."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """What the upload does with each file, by name: send it (missing on the volume or different there), leave it
    (the same bytes are there), or report it (on the volume, not in the folder)."""

    send: list[str]
    same: list[str]
    extra: list[str]


def compare(local: Mapping[str, Sequence], remote: Mapping[str, Sequence]) -> Plan:
    """The plan from both ends' {name: [size, sha256]}."""
    send = sorted(name for name in local if list(remote.get(name) or []) != list(local[name]))
    return Plan(send, sorted(set(local) - set(send)), sorted(set(remote) - set(local)))


def listed(names: Sequence[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(repr(name) for name in names[:SHOWN]) + more


def safe(name: str) -> bool:
    """Whether a relative path passes the settings' rule for paths on the volume (letters, digits and . _ - /)."""
    return re.fullmatch(project_settings.RELATIVE_PATH_RULE[0], name) is not None


def volume_dir(name: str, settings: Mapping[str, str] = SETTINGS) -> str:
    """Where the folder NAME lies on the volume, for the upload and for submit alike: IMAGES_ROOT/NAME."""
    root, mount = pathlib.PurePosixPath(settings["IMAGES_ROOT"]), pathlib.PurePosixPath(settings["MOUNT_PATH"])
    if not root.is_relative_to(mount):
        raise UploadError(
            f"IMAGES_ROOT={root} is not below MOUNT_PATH={mount}, where the pods mount the volume: set IMAGES_ROOT "
            f"to a folder below it (k8s/base/settings.env, the environment or make's command line)"
        )
    return f"{root}/{name}"


def folder_of(given: str) -> pathlib.Path:
    """The image folder IMAGES names (absolute, its own name kept), refused when it is not one."""
    layout = "the folder that holds train/<class>/ (and test/<class>/) images"
    if not given:
        raise UploadError(f"IMAGES is empty: name {layout}, e.g. make upload-images IMAGES=path/to/folder")
    folder = pathlib.Path(os.path.abspath(os.path.expanduser(given)))
    if not folder.exists():
        raise UploadError(f"IMAGES={given}: no such folder ({folder}); name {layout}")
    if not folder.is_dir():
        raise UploadError(f"IMAGES={given} is a file, not a folder; name {layout}")
    if not safe(folder.name):
        raise UploadError(
            f"IMAGES={given}: the folder's name {folder.name!r} holds characters the settings refuse (its copy is "
            f"IMAGES_ROOT/<its name>, a path the pods read): rename it to letters, digits and . _ - only"
        )
    if not (folder / "train").is_dir():
        raise UploadError(
            f"{folder} has no train/ folder: put each class's images in {folder}/train/<class name>/ (PNG, JPEG, GIF "
            f"or BMP files), and the test images, if any, in {folder}/test/<class name>/"
        )
    return folder


def files_of(folder: pathlib.Path) -> tuple[list[str], int]:
    """The folder's files as relative paths, and how many hidden names were left out; refused when a name is not
    safe on the volume or an entry is not a plain file."""
    files, others, hidden = on_volume.walk(str(folder))
    unsafe = [name for name in files if not safe(name)]
    if unsafe:
        raise UploadError(
            f"{len(unsafe)} file name(s) under {folder} hold characters the settings' safe set refuses: "
            f"{listed(unsafe)}; rename them to letters, digits and . _ - only (each becomes a path the pods read)"
        )
    if others:
        raise UploadError(
            f"{listed(others)} under {folder}: not a plain file (a link to a folder, a socket, ...); the upload "
            f"copies plain files only: put the files themselves there"
        )
    if not any(name.startswith("train/") for name in files):
        raise UploadError(f"{folder}/train holds no file: put each class's images in {folder}/train/<class name>/")
    return files, hidden


def helper_pod(objects: list[dict], image: str, name: str) -> dict:
    """The data Job's pod as the helper (restricted, no token, a read-only root with /tmp scratch, the volume at
    MOUNT_PATH), on the trainer image, which has Python: asleep until the upload's commands come through exec."""
    job = manifest.the_one(objects, "Job", component="prepare-data")
    template = copy.deepcopy(job["spec"]["template"])
    spec = template["spec"]
    container = spec["containers"][0]
    spec["containers"] = [container]
    # The settings' ConfigMap is not needed here, and may not exist before the first make submit.
    container.pop("args", None)
    container.pop("envFrom", None)
    container["env"] = [entry for entry in container.get("env") or [] if "value" in entry]
    init = container["command"][: container["command"].index("--") + 1]  # tini, which passes SIGTERM on
    container.update(name=CONTAINER, image=image, command=[*init, "sleep", str(HELPER_LIFETIME_S)], resources=RESOURCES)
    spec["restartPolicy"] = "Never"
    labels = {**job["metadata"].get("labels", {}), **template["metadata"].get("labels", {})}
    labels["app.kubernetes.io/component"] = "upload-images"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels}, "spec": spec}


def on_volume_command(pod: str, namespace: str, *args: str, stdin: bool = False) -> list[str]:
    """on_volume.py's ARGS run in the helper pod (the context comes first: all after -- is the program's)."""
    exec_ = ["kubectl", "--context", steps.context(), "exec", *(["-i"] if stdin else []), "-n", namespace, pod]
    return [*exec_, "-c", CONTAINER, "--", "python3", "-c", pathlib.Path(on_volume.__file__).read_text(), *args]


def answer(what: str, code: int, stdout: str, stderr: str, advice: str = "") -> dict:
    """on_volume.py's JSON answer; StepError when it failed or ended without one (kubectl exec exits 0 when the pod
    is deleted under it)."""
    try:
        if code == 0:
            return json.loads(stdout)
    except ValueError:
        pass
    why = stderr.strip() or f"it ended without its answer (exit {code}): was the helper pod deleted?"
    raise steps.StepError(f"{what} stopped: {why}{advice}")


def in_pod(pod: str, namespace: str, *args: str, stdin: str | None = None) -> dict:
    """The JSON on_volume.py prints for ARGS in the pod; StepError with its error otherwise."""
    result = subprocess.run(
        on_volume_command(pod, namespace, *args, stdin=stdin is not None), input=stdin, capture_output=True, text=True
    )
    return answer(f"on_volume.py {' '.join(args)} in pod {pod}", result.returncode, result.stdout, result.stderr)


def start_helper(pod: dict, namespace: str) -> None:
    """A fresh helper pod (an earlier upload's, if any, goes first)."""
    name = pod["metadata"]["name"]
    steps.run(steps.kubectl("delete", "pod", name, "-n", namespace, "--ignore-not-found", "--wait=true"), quiet=True)
    steps.run(steps.kubectl("create", "-n", namespace, "-f", "-"), stdin=json.dumps(pod), quiet=True)


def not_starting(status: dict) -> str | None:
    """Why the pod will not start however long one waits (the image cannot be had, it ended), or None."""
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in STUCK:
            return (
                f"{waiting['reason']}: {waiting.get('message', '')}; make upload-images imports the image into the "
                f"project's cluster (k3d or the local node), another cluster must be able to pull {container['image']}"
            )
    if status.get("phase") in ("Succeeded", "Failed"):
        return f"it ended {status['phase']}"
    return None


def wait_until_ready(name: str, namespace: str, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Polls the pod until it is Ready; StepError naming why it is not (the scheduler's, the kubelet's reason)."""
    deadline = time.monotonic() + timeout_s
    while True:
        pod = json.loads(steps.run(steps.kubectl("get", "pod", name, "-n", namespace, "-o", "json"), quiet=True).stdout)
        status = pod.get("status") or {}
        conditions = status.get("conditions") or []
        if any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
            return
        problem = not_starting(status)
        if problem is None and time.monotonic() > deadline:
            waiting = [
                f"{c['type']}: {c.get('message') or c.get('reason')}" for c in conditions if c["status"] != "True"
            ]
            problem = f"not Ready after {timeout_s:.0f} s ({status.get('phase')}; {'; '.join(waiting) or 'no reason'})"
        if problem:
            raise steps.StepError(f"the helper pod {name} did not start: {problem}")
        time.sleep(1)


def write_tar(stream: IO[bytes], folder: pathlib.Path, names: list[str], local: Mapping[str, Sequence]) -> None:
    """NAMES as one tar stream, each member carrying its sha256 for the receiver to check."""
    with tarfile.open(fileobj=stream, mode="w|", format=tarfile.PAX_FORMAT) as archive:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = int(local[name][0]), 0o644, int(time.time())
            info.pax_headers = {on_volume.SHA256_HEADER: str(local[name][1])}
            with open(folder / name, "rb") as handle:
                archive.addfile(info, handle)


def send(pod: str, namespace: str, folder: pathlib.Path, names: list[str], local: Mapping, dest: str) -> int:
    """Streams NAMES to the pod, which writes each beside the folder (DEST's hidden staging folder) and renames it
    into place once whole; the bytes it received."""
    staging = posixpath.join(posixpath.dirname(dest), f".upload-{posixpath.basename(dest)}")
    command = on_volume_command(pod, namespace, "receive", dest, staging, stdin=True)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=out, stderr=err)
        assert process.stdin is not None
        try:
            write_tar(process.stdin, folder, names, local)
        except BrokenPipeError:
            pass  # the receiver stopped: its error says why
        except BaseException:  # Ctrl-C, a file that changed: the receiver keeps no partial file
            process.kill()
            raise
        finally:
            with contextlib.suppress(BrokenPipeError):
                process.stdin.close()
        code = process.wait()
        out.seek(0)
        err.seek(0)
        output, errors = out.read().decode(errors="replace"), err.read().decode(errors="replace")
    again = "; every file copied before is whole there: run the upload again to finish"
    received = answer(f"copying to {dest}", code, output, errors, again)
    if received["files"] != len(names):
        raise steps.StepError(f"copying to {dest}: {received['files']} of {len(names)} files arrived{again}")
    return int(received["bytes"])


def summary(plan: Plan, sent: int, removed: int | None, dest: str) -> str:
    """The one line an upload ends with."""
    done = f", {removed} removed" if removed is not None else ""
    return (
        f"upload-images: {len(plan.send) + len(plan.same)} files checked, {len(plan.send)} copied, "
        f"{len(plan.same)} already there, {sent} bytes sent{done}: {dest} on volume {SETTINGS['VOLUME_CLAIM']}"
    )


def synchronise(pod: str, args: argparse.Namespace, folder: pathlib.Path, files: list[str], dest: str) -> str:
    """Hashes the folder (while the pod starts), compares with the volume, sends what differs; the summary line."""
    local = {name: list(on_volume.file_digest(str(folder / name))) for name in files}
    wait_until_ready(pod, args.namespace)
    plan = compare(local, in_pod(pod, args.namespace, "digests", dest))
    if plan.send:
        size = sum(int(local[name][0]) for name in plan.send)
        print(f"copying {len(plan.send)} of {len(files)} files ({size} bytes) to {dest}", flush=True)
    sent = send(pod, args.namespace, folder, plan.send, local, dest) if plan.send else 0
    removed = 0 if args.prune else None
    if plan.extra and args.prune:
        removed = in_pod(pod, args.namespace, "remove", dest, stdin=json.dumps(plan.extra))["removed"]
    elif plan.extra:
        print(
            f"{len(plan.extra)} file(s) in {dest} are not in {folder}: {listed(plan.extra)}; left there "
            f"(PRUNE=1 removes them)"
        )
    return summary(plan, sent, removed, dest)


def upload(args: argparse.Namespace) -> int:
    """The folder and the tools checked before the cluster is touched, and the claim against the cluster before
    anything is created; then the claim, the helper pod, the copy."""
    folder = folder_of(args.images)
    files, hidden = files_of(folder)
    dest = volume_dir(folder.name)
    manifest.require_kubectl("the folder cannot be copied to the volume")
    steps.check_context()
    objects = manifest.render(args.kustomize)
    # The one helper pod would fit a ReadWriteOnce claim anywhere, but the claim outlives it: it is the claim of the
    # job that trains on the copy, so it is checked for that job's pods, before the copy lands on the wrong claim.
    steps.check_volume_claim(objects, args.namespace)
    steps.apply(manifest.of_kind(objects, "PersistentVolumeClaim"), args.namespace)
    pod = helper_pod(objects, args.image, f"{SETTINGS['JOB_NAME']}-upload-images")
    name = pod["metadata"]["name"]
    if hidden:
        print(f"left out {hidden} hidden name(s) (starting with '.'): not data, and the trainer skips them too")
    try:
        start_helper(pod, args.namespace)
        print(synchronise(name, args, folder, files, dest), flush=True)
    finally:
        steps.run(
            steps.kubectl("delete", "pod", name, "-n", args.namespace, "--ignore-not-found", "--wait=false"),
            check=False,
            quiet=True,
        )
    return EXIT_DONE


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m scripts.cluster.upload_images",
        description=__doc__.split("\n\n")[0],
        epilog=__doc__.split("\n\n")[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--images", required=True, help="the local image folder (make passes IMAGES)")
    parser.add_argument("--image", required=True, help="the trainer image the helper pod runs (make passes its own)")
    parser.add_argument("--kustomize", type=pathlib.Path, default=manifest.K8S_DIR, help="its data Job is the helper")
    parser.add_argument("--namespace", default=SETTINGS["NAMESPACE"])
    parser.add_argument("--prune", action="store_true", help="remove the volume's files that the folder does not hold")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return upload(args)
    except (UploadError, manifest.ManifestError) as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except steps.StepError as error:
        print(f"error: {error}", file=sys.stderr)
        return EXIT_CLUSTER
    except KeyboardInterrupt:
        print(
            "interrupted: each file copied so far is whole on the volume and none is half-written under its name; "
            "run the upload again to finish",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
