"""make upload-images without a cluster: the comparison by sha256, the refusals of a folder that is not one, the
receiving end's write-beside-then-rename (an interrupted copy leaves no half file under its name), the helper pod's
security, the whole command against a kubectl stand-in that runs the pod's commands here (a local folder stands in
for the volume) and refusing a claim the job could not use, and make submit IMAGES= setting the dataset and its
folder on the volume."""

from __future__ import annotations

import io
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile

import pytest
import yaml

from claim_cluster import cluster, node
from pod_security import all_problems
from scripts.cluster import on_volume, submit, upload_images
from scripts.common import manifest
from scripts.common import settings as project_settings

ROOT = pathlib.Path(__file__).resolve().parents[2]
SETTINGS = project_settings.load()
SUMMARY = re.compile(r"(\d+) files checked, (\d+) copied, (\d+) already there, (\d+) bytes sent")


def image_folder(root: pathlib.Path, name: str = "pets") -> pathlib.Path:
    """A folder of the expected layout; the bytes need not be images here (the data Job decodes them)."""
    folder = root / name
    for split, count in (("train", 3), ("test", 1)):
        for label in ("cat", "dog"):
            (folder / split / label).mkdir(parents=True)
            for number in range(count):
                (folder / split / label / f"{number}.png").write_bytes(f"{split} {label} {number}".encode() * 50)
    return folder


def test_compare_sends_what_is_missing_or_different_and_reports_what_only_the_volume_holds():
    local = {"train/a/1.png": [3, "aa"], "train/a/2.png": [3, "bb"], "train/b/1.png": [4, "cc"]}
    remote = {"train/a/1.png": [3, "aa"], "train/a/2.png": [3, "b0"], "train/c/9.png": [1, "zz"]}
    plan = upload_images.compare(local, remote)
    assert plan.send == ["train/a/2.png", "train/b/1.png"]
    assert plan.same == ["train/a/1.png"] and plan.extra == ["train/c/9.png"]
    assert upload_images.compare(local, local) == upload_images.Plan([], sorted(local), [])


def refused(setup, tmp_path: pathlib.Path) -> str:
    given = setup(tmp_path)
    with pytest.raises(upload_images.UploadError) as error:
        upload_images.files_of(upload_images.folder_of(str(given)))
    return str(error.value)


def spaced_name(tmp_path):
    folder = image_folder(tmp_path)
    (folder / "train" / "cat" / "my photo.png").write_bytes(b"x")
    return folder


def linked_folder(tmp_path):
    folder = image_folder(tmp_path)
    (folder / "train" / "bird").symlink_to(tmp_path)
    return folder


def a_file(tmp_path):
    (tmp_path / "f.png").write_bytes(b"x")
    return tmp_path / "f.png"


def no_train(tmp_path):
    (tmp_path / "pets" / "cat").mkdir(parents=True)
    return tmp_path / "pets"


def empty_train(tmp_path):
    (tmp_path / "pets" / "train" / "cat").mkdir(parents=True)
    return tmp_path / "pets"


@pytest.mark.parametrize(
    "setup, says",
    [
        (lambda tmp: tmp / "nowhere", ["no such folder", "name the folder that holds train/<class>/"]),
        (a_file, ["is a file, not a folder"]),
        (no_train, ["has no train/ folder", "train/<class name>/"]),
        (lambda tmp: image_folder(tmp, "my pets"), ["'my pets' holds characters the settings refuse", "rename it"]),
        (spaced_name, ["1 file name(s)", "'train/cat/my photo.png'", "rename them to letters, digits and . _ -"]),
        (linked_folder, ["'train/bird'", "not a plain file", "copies plain files only"]),
        (empty_train, ["train holds no file", "put each class's images in"]),
    ],
    ids=["missing", "a-file", "no-train", "unsafe-folder-name", "unsafe-file-name", "folder-link", "empty-train"],
)
def test_a_folder_that_is_not_an_image_folder_is_refused_naming_the_problem_and_the_fix(tmp_path, setup, says):
    message = refused(setup, tmp_path)
    assert all(part in message for part in says), message


def test_hidden_names_are_left_out_and_counted(tmp_path):
    # Hidden files and folders are neither uploaded nor read by the trainer: .DS_Store, an editor's swap file.
    folder = image_folder(tmp_path)
    (folder / "train" / "cat" / ".DS_Store").write_bytes(b"x")
    (folder / "train" / ".cache").mkdir()
    files, hidden = upload_images.files_of(folder)
    assert hidden == 2 and len(files) == 8 and not any("/." in f"/{name}" for name in files)


def test_the_copy_lies_under_images_root_which_must_be_on_the_volume():
    assert upload_images.volume_dir("pets") == f"{SETTINGS['IMAGES_ROOT']}/pets"
    with pytest.raises(upload_images.UploadError, match="IMAGES_ROOT=/data/images is not below MOUNT_PATH"):
        upload_images.volume_dir("pets", {**SETTINGS, "IMAGES_ROOT": "/data/images"})


def tar_of(folder: pathlib.Path, names: list[str]) -> bytes:
    local = {name: list(on_volume.file_digest(str(folder / name))) for name in names}
    stream = io.BytesIO()
    upload_images.write_tar(stream, folder, names, local)
    return stream.getvalue()


def test_a_cut_stream_leaves_no_half_file_under_its_name_and_a_rerun_finishes_the_copy(tmp_path):
    folder = image_folder(tmp_path)
    names = on_volume.walk(str(folder))[0]
    whole = tar_of(folder, names)
    volume, staging = tmp_path / "volume" / "pets", str(tmp_path / "volume" / ".upload-pets")
    cut = whole[: whole.index(b"train cat 1") + 100]  # the stream ends inside a file: Ctrl-C, a killed pod
    with pytest.raises(tarfile.ReadError):
        on_volume.receive(str(volume), staging, io.BytesIO(cut))
    arrived = on_volume.digests(str(volume))
    expected = on_volume.digests(str(folder))
    assert 0 < len(arrived) < len(names)
    assert all(expected[name] == digest for name, digest in arrived.items()), "only whole files have their name"
    assert os.listdir(staging), "the half-written file stays beside, in the staging folder"

    assert on_volume.receive(str(volume), staging, io.BytesIO(whole)) == (
        len(names),
        sum(d[0] for d in expected.values()),
    )
    assert on_volume.digests(str(volume)) == expected and not os.path.exists(staging)


def test_a_file_that_arrives_with_another_sha256_never_gets_its_name(tmp_path):
    folder = image_folder(tmp_path)
    damaged = tar_of(folder, ["train/cat/0.png"]).replace(b"train cat 0", b"train cat 9", 1)
    with pytest.raises(ValueError, match="arrived with sha256 .* run the upload again"):
        on_volume.receive(str(tmp_path / "volume"), str(tmp_path / "staging"), io.BytesIO(damaged))
    assert not (tmp_path / "volume" / "train" / "cat" / "0.png").exists()


def test_remove_takes_the_files_and_the_folders_they_leave_empty_and_nothing_outside(tmp_path):
    folder = image_folder(tmp_path)
    assert on_volume.remove(str(folder), ["test/cat/0.png", "train/dog/0.png"]) == 2
    assert not (folder / "test" / "cat").exists() and (folder / "train" / "dog" / "1.png").exists()
    with pytest.raises(ValueError, match="only plain files below the folder"):
        on_volume.remove(str(folder), ["../outside.png"])


def test_the_helper_pod_is_the_data_jobs_restricted_pod_with_the_volume_and_no_settings_map():
    pod = upload_images.helper_pod(manifest.render(manifest.K8S_DIR), "trainer:1", "multi-worker-upload-images")
    assert all_problems(pod["spec"]) == []
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "trainer:1" and "envFrom" not in container
    assert {"name": "training-volume", "mountPath": SETTINGS["MOUNT_PATH"]} in container["volumeMounts"]
    assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "upload-images"


STUB = """#!/bin/bash
# kubectl as the upload sees it: exec runs the pod's command here; the rest is recorded and answered.
echo "$*" | cut -c1-200 >>"$STUB_LOG"
case " $* " in
  *" exec "*) while [ "$1" != "--" ]; do shift; done; shift; exec "$@" ;;
  *" kustomize "*) exec "$REAL_KUBECTL" "$@" ;;
  *" config get-contexts "*) echo "$STUB_CONTEXTS" ;;
  *" get pod "*) echo '{"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}' ;;
  *" get storageclass "*) echo "$STUB_CLASSES" ;;
  *" get nodes "*) echo "$STUB_NODES" ;;
  *" apply "*) cat >"$STUB_LOG.applied" ;;
  *" create "*) cat >/dev/null ;;
esac
"""


def run_upload(
    tmp_path: pathlib.Path, folder: pathlib.Path, *flags: str, contexts: str = "stub", nodes: int = 1, **settings: str
) -> tuple:
    """python -m scripts.cluster.upload_images against the stand-in, a cluster of NODES Ready nodes, with these
    settings; (its result, the summary's four numbers)."""
    bin_dir = tmp_path / "bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        (bin_dir / "kubectl").write_text(STUB)
        (bin_dir / "kubectl").chmod(0o755)
    mount = tmp_path / "mnt"
    answers = cluster([node(f"node-{number}") for number in range(nodes)])
    environ = {
        **os.environ,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "REAL_KUBECTL": shutil.which("kubectl") or "kubectl",
        "STUB_LOG": str(tmp_path / "kubectl.log"),
        "STUB_CONTEXTS": contexts,
        "STUB_NODES": answers("get", "nodes"),
        "STUB_CLASSES": answers("get", "storageclass"),
        "KUBE_CONTEXT": "stub",
        "MOUNT_PATH": str(mount),
        "IMAGES_ROOT": str(mount / "images"),
        **settings,
    }
    command = [sys.executable, "-m", "scripts.cluster.upload_images", "--image", "trainer:1", "--images", str(folder)]
    result = subprocess.run([*command, *flags], capture_output=True, text=True, env=environ, cwd="/", timeout=120)
    numbers = SUMMARY.search(result.stdout)
    return result, tuple(int(n) for n in numbers.groups()) if numbers else None


def test_an_upload_copies_once_then_only_what_changed_and_reports_what_the_folder_no_longer_holds(tmp_path):
    folder = image_folder(tmp_path / "local")
    on_the_volume = tmp_path / "mnt" / "images" / "pets"
    first, numbers = run_upload(tmp_path, folder)
    assert first.returncode == 0, first.stderr
    assert numbers == (8, 8, 0, sum(path.stat().st_size for path in folder.rglob("*.png"))), first.stdout
    assert on_volume.digests(str(on_the_volume)) == on_volume.digests(str(folder))
    assert f"{on_the_volume} on volume {SETTINGS['VOLUME_CLAIM']}" in first.stdout
    # The helper pod goes when the upload ends.
    assert "delete pod multi-worker-upload-images" in (tmp_path / "kubectl.log").read_text().splitlines()[-1]

    again, numbers = run_upload(tmp_path, folder)
    assert numbers == (8, 0, 8, 0), again.stdout

    (folder / "train" / "dog" / "2.png").write_bytes(b"a retouched dog")
    (folder / "test" / "cat" / "0.png").unlink()
    changed, numbers = run_upload(tmp_path, folder)
    assert numbers == (7, 1, 6, len(b"a retouched dog")), changed.stdout
    assert "1 file(s) in" in changed.stdout and "'test/cat/0.png'; left there (PRUNE=1 removes them)" in changed.stdout
    assert (on_the_volume / "test" / "cat" / "0.png").exists()

    pruned, numbers = run_upload(tmp_path, folder, "--prune")
    assert numbers == (7, 0, 7, 0) and "bytes sent, 1 removed:" in pruned.stdout, pruned.stdout
    assert on_volume.digests(str(on_the_volume)) == on_volume.digests(str(folder))


def test_an_upload_without_kubectl_or_its_context_says_so_before_copying_anything(tmp_path):
    folder = image_folder(tmp_path / "local")
    no_context, _ = run_upload(tmp_path, folder, contexts="another")
    assert no_context.returncode == 3 and "your kubeconfig has no context stub" in no_context.stderr
    (tmp_path / "bin" / "kubectl").unlink()
    environ = {"PATH": os.path.dirname(sys.executable), "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)}
    command = [sys.executable, "-m", "scripts.cluster.upload_images", "--image", "t:1", "--images", str(folder)]
    no_kubectl = subprocess.run(command, capture_output=True, text=True, env=environ, cwd="/", timeout=60)
    assert no_kubectl.returncode == 2 and "kubectl is not on PATH" in no_kubectl.stderr, no_kubectl.stderr
    assert not (tmp_path / "mnt").exists()


def test_an_upload_refuses_a_claim_the_job_cannot_share_over_the_nodes_before_it_creates_anything(tmp_path):
    folder = image_folder(tmp_path / "local")
    refused, _ = run_upload(tmp_path, folder, nodes=2)
    assert refused.returncode == 3 and "the claim training-volume is ReadWriteOnce" in refused.stderr, refused.stderr
    assert "SPREAD_OVER_NODES=0" in refused.stderr
    log = (tmp_path / "kubectl.log").read_text()
    assert " apply " not in log and " create " not in log and not (tmp_path / "mnt").exists(), log
    # The claim it creates has the settings' mode and class, which the check asked about.
    shared, numbers = run_upload(
        tmp_path, folder, nodes=2, VOLUME_ACCESS_MODE="ReadWriteMany", VOLUME_STORAGE_CLASS="local-path-shared"
    )
    assert shared.returncode == 0 and numbers[:2] == (8, 8), shared.stderr
    (claim,) = yaml.safe_load_all((tmp_path / "kubectl.log.applied").read_text())
    assert (claim["spec"]["accessModes"], claim["spec"]["storageClassName"]) == (["ReadWriteMany"], "local-path-shared")


def test_submit_with_images_trains_image_folder_on_the_volumes_copy_in_the_trainers_and_the_data_job(tmp_path):
    folder = image_folder(tmp_path)
    args = submit.parse_args(["--image", "trainer:1", "--images", str(folder)])
    assert args.dataset == "image_folder" and args.image_dir == f"{SETTINGS['IMAGES_ROOT']}/pets"
    objects = manifest.customize(
        manifest.render(manifest.K8S_DIR), dataset=args.dataset, dataset_options=submit.dataset_options(args)
    )
    data_job = manifest.the_one(objects, "Job", component="prepare-data")["spec"]["template"]
    containers = [manifest.trainer_of(t) for t in manifest.trainer_templates(objects)] + [manifest.trainer_of(data_job)]
    for container in containers:
        env = {entry["name"]: entry.get("value") for entry in container["env"]}
        assert env["TRAINER_DATASET"] == "image_folder" and env["TRAINER_IMAGE_DIR"] == args.image_dir


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--dataset", "mnist"], "IMAGES= trains --dataset image_folder, not mnist: drop DATASET="),
        (["--images", "/no/such/folder"], "no such folder"),
    ],
)
def test_submit_refuses_images_with_another_dataset_or_a_folder_that_is_not_there(tmp_path, capsys, flags, says):
    folder = image_folder(tmp_path)
    with pytest.raises(SystemExit):
        submit.parse_args(["--image", "trainer:1", "--images", str(folder), *flags])
    assert says in capsys.readouterr().err


def test_make_passes_images_to_both_commands_through_the_environment():
    dry = subprocess.run(
        ["make", "-n", "submit", "upload-images", "IMAGES=/tmp/my pets"], cwd=ROOT, capture_output=True, text=True
    )
    assert dry.returncode == 0, dry.stderr
    assert '--dataset image_folder --epochs 3 --images "$IMAGES"' in dry.stdout
    assert "scripts.cluster.upload_images --kustomize k8s/engines/tfjob/sync" in dry.stdout
    missing = subprocess.run(["make", "upload-images"], cwd=ROOT, capture_output=True, text=True)
    assert missing.returncode == 2 and "make upload-images needs IMAGES=path/to/folder" in missing.stderr


def test_run_local_reads_a_local_images_folder_where_it_is_by_its_absolute_path(tmp_path, monkeypatch, capsys):
    from scripts.localrun import run_local

    folder = tmp_path / "My Photos"  # a space, as macOS folders have: it reached the settings check, a traceback
    (folder / "train" / "cat").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    args = run_local.parse_args(
        [
            "--images",
            "My Photos",
            "--dataset",
            "image_folder",
            "--kustomize",
            str(ROOT / "k8s" / "engines" / "tfjob" / "sync"),
        ]
    )
    objects = run_local.load(args)
    templates = [spec["template"] for spec in objects.job["spec"]["tfReplicaSpecs"].values()]
    templates += [job["spec"]["template"] for job in objects.jobs]  # the data preparation
    environments = [
        {item["name"]: item.get("value") for item in container.get("env", [])}
        for template in templates for container in template["spec"]["containers"]
    ]  # fmt: skip
    assert environments and all(env.get("TRAINER_IMAGE_DIR") == str(folder) for env in environments), environments
    with pytest.raises(SystemExit) as refused:  # was: `cd` failed, the run went on without the folder
        run_local.parse_args(["--images", str(tmp_path / "nowhere")])
    assert refused.value.code == 2 and "no folder with a train/ folder there" in capsys.readouterr().err
