"""The container image builds, stays small, and trains two workers inside itself.

The image tests build with scripts/image/build-image.sh and run the image with
`buildah run --isolation chroot`, which needs no Docker engine and shares the
host's network, so two workers meet on 127.0.0.1 as two pods meet in a TFJob.
The base is the Dockerfile's registry image where a registry answers, else a
Debian bookworm base made by scripts/image/make-base-image.sh.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
import time

import psutil
import pytest

import prepared_tfds
from multiworker import tf_config, worker_cluster
from refusing_proxy import refused_downloads
from scripts.common import settings as project_settings
from scripts.common.processes import signal_group
from trainer.artifacts.layout import ModelDir
from trainer.base.errors import ExitCode

ROOT = pathlib.Path(__file__).resolve().parents[2]
SETTINGS = project_settings.load()
# Its own repository name, so running the tests never retags the user's `latest`.
TEST_REPOSITORY = f"localhost/{SETTINGS['IMAGE_NAME']}-image-test"
# The job's model directory as the manifests build it (k8s/base/trainer-pod.yaml): MODEL_ROOT/JOB_NAME.
MOUNT_PATH, MODEL_DIR = SETTINGS["MOUNT_PATH"], f"{SETTINGS['MODEL_ROOT']}/{SETTINGS['JOB_NAME']}"
MODEL_DIR_IN_VOLUME = pathlib.PurePosixPath(MODEL_DIR).relative_to(MOUNT_PATH)
DATA_DIR_IN_VOLUME = pathlib.PurePosixPath(SETTINGS["TRAINER_DATA_DIR"]).relative_to(MOUNT_PATH)
NON_ROOT_UID = 1000
SIZE_LIMIT_BYTES = 2.5e9
UNITS = {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12}
BUILD_TIMEOUT_S = 1800
TRAIN_TIMEOUT_S = 600
TRAIN_FLAGS = [
    "--dataset",
    "synthetic",
    "--epochs",
    "1",
    "--train-examples",
    "512",
    "--test-examples",
    "256",
    "--startup-timeout",
    "180",
]


def run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "image" / "image_requirements.py"), *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )


def test_the_cpu_image_installs_tensorflow_cpu_and_no_other_tensorflow():
    result = run_script("cpu")
    assert result.returncode == 0, result.stderr
    names = {re.split(r"[=<>\[ ;]", line, maxsplit=1)[0] for line in result.stdout.split()}
    assert {name for name in names if name.startswith("tensorflow") and name != "tensorflow-datasets"} == {
        "tensorflow-cpu"
    }
    assert "keras" in names


def test_an_unknown_tensorflow_flavour_is_refused_naming_the_choices():
    result = run_script("cuda")
    assert result.returncode == 2
    assert "cuda" in result.stderr and "cpu, gpu, tf" in result.stderr


# --- the image itself --------------------------------------------------------------------------


def buildah(*args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run(["buildah", *args], capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"buildah {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


def default_base_image() -> str:
    match = re.search(r"^ARG BASE_IMAGE=(\S+)$", (ROOT / "Dockerfile").read_text(), re.MULTILINE)
    assert match, "Dockerfile has no 'ARG BASE_IMAGE=<default>' line"
    return match.group(1)


@pytest.fixture(scope="module")
def base_image() -> str | None:
    """None where the Dockerfile's default base can be pulled; else a debootstrap base's name."""
    if shutil.which("buildah") is None:
        pytest.skip(
            "buildah not found: the image tests build and run the image with it (Debian: apt-get install buildah)"
        )
    if os.geteuid() != 0:
        pytest.skip("the image tests run buildah as root (chroot isolation, a bind-mounted volume owned by uid 1000)")
    if buildah("pull", "--quiet", default_base_image(), timeout=600, check=False).returncode == 0:
        return None
    if shutil.which("debootstrap") is None:
        pytest.skip(
            f"no registry serves {default_base_image()} and debootstrap is not found to make a local base "
            "(Debian: apt-get install debootstrap)"
        )
    made = subprocess.run(
        [str(ROOT / "scripts" / "image" / "make-base-image.sh")],
        capture_output=True,
        text=True,
        env={**os.environ, "CONTAINER_TOOL": "buildah"},
        timeout=BUILD_TIMEOUT_S,
    )
    assert made.returncode == 0, f"make-base-image.sh failed:\n{made.stderr[-4000:]}"
    return made.stdout.strip()


def build(root: pathlib.Path, image: str, base: str | None) -> str:
    """Runs root's build-image.sh the way `make image` does, with buildah; returns its output."""
    env = {**os.environ, "CONTAINER_TOOL": "buildah", "BUILDAH_ISOLATION": "chroot", "IMAGE": image}
    env.pop("BASE_IMAGE", None)
    env.pop("IMAGE_TF_FLAVOUR", None)
    if base:
        env["BASE_IMAGE"] = base
    elif not SETTINGS.get("BASE_IMAGE_DIGEST"):
        env["ALLOW_UNPINNED_BASE"] = "1"  # the registry's tag, as pulled above: no digest recorded to pin it
    # RUN steps reach the package index through the host's CA bundle (an intercepting proxy may sign it).
    if pathlib.Path("/etc/ssl/certs").is_dir():
        env["EXTRA_BUILD_FLAGS"] = "-v /etc/ssl/certs:/etc/ssl/certs:ro"
    result = subprocess.run(
        [str(root / "scripts" / "image" / "build-image.sh")],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=root,
        timeout=BUILD_TIMEOUT_S,
    )
    assert result.returncode == 0, f"build-image.sh failed:\n{result.stdout[-5000:]}"
    return result.stdout


def git_head() -> str | None:
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    return head.stdout.strip() if head.returncode == 0 else None


@pytest.fixture(scope="module")
def built(base_image: str | None) -> tuple[str, str, str | None]:
    """The image built from this checkout, build-image.sh's output, and the commit it was built at."""
    image, head = f"{TEST_REPOSITORY}:proof", git_head()
    return image, build(ROOT, image, base_image), head


def image_config(image: str) -> dict:
    return json.loads(buildah("inspect", "--type", "image", image).stdout)["OCIv1"]["config"]


def size_in_bytes(build_output: str) -> float:
    match = re.search(r"size ([\d.]+) ?([kKMGT]?B) \(uncompressed\)", build_output)
    assert match, f"build-image.sh did not print the image size:\n{build_output[-2000:]}"
    return float(match.group(1)) * UNITS[match.group(2)]


@pytest.mark.image
def test_the_image_is_tagged_labelled_non_root_and_under_the_size_limit(built):
    image, output, head = built
    config = image_config(image)
    assert image_config(f"{TEST_REPOSITORY}:latest") == config, "the latest tag is not the image just built"
    assert size_in_bytes(output) < SIZE_LIMIT_BYTES, f"the image is over 2.5 GB: {output[-300:]}"
    if head:
        assert config["Labels"]["org.opencontainers.image.revision"] == head
    assert config["Labels"]["org.opencontainers.image.version"] != "unknown"
    assert config["User"] == f"{NON_ROOT_UID}:{NON_ROOT_UID}"
    assert config["Entrypoint"][0].endswith("tini"), "PID 1 must be tini so SIGTERM reaches the trainer"


def fs_group_volume(tmp_path: pathlib.Path) -> pathlib.Path:
    """A host directory prepared as a pod's fsGroup prepares its volume: group 1000, group-writable, setgid."""
    volume = tmp_path / "volume"
    volume.mkdir()
    os.chown(volume, 0, NON_ROOT_UID)
    volume.chmod(0o2775)
    return volume


def stop(process: subprocess.Popen) -> None:
    """Kills a worker still running (its whole session: buildah and the trainer under it)."""
    if process.poll() is None:
        signal_group(process.pid, signal.SIGKILL)
        process.wait()


@contextlib.contextmanager
def working_container(image: str):
    """A buildah working container of the image: one per worker, as a pod is."""
    container = buildah("from", "--pull=never", image).stdout.strip()
    try:
        yield container
    finally:
        buildah("rm", container, check=False)


def in_image(container: str, volume: pathlib.Path, command: list[str], env: dict[str, str]) -> list[str]:
    """`buildah run` of COMMAND in CONTAINER, the volume mounted where the pods mount it, as a pod runs it."""
    flags = [f"--env={key}={value}" for key, value in env.items()]
    mount = ["--volume", f"{volume}:{MOUNT_PATH}"]
    return ["buildah", "run", "--isolation", "chroot", *flags, *mount, container, "--", *command]


def train_in_image(image: str, volume: pathlib.Path, logs: pathlib.Path, flags: list[str]) -> ModelDir:
    """Two workers of the image's entrypoint with FLAGS, each in its own container, to exit 0; the model dir."""
    entrypoint = image_config(image)["Entrypoint"]
    cluster = worker_cluster(2)
    with contextlib.ExitStack() as stack:
        workers = []
        for index in range(2):
            command = in_image(
                stack.enter_context(working_container(image)),
                volume,
                [*entrypoint, *flags, "--model-dir", MODEL_DIR],
                {"TF_CONFIG": tf_config(cluster, "worker", index)},
            )
            log = logs / f"worker-{index}.log"
            with log.open("w") as out:
                process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
            stack.callback(stop, process)
            workers.append((process, log))
        codes = [process.wait(timeout=TRAIN_TIMEOUT_S) for process, _ in workers]
    texts = [log.read_text() for _, log in workers]
    failures = (f"--- worker {i} exited {codes[i]}:\n{text[-3000:]}" for i, text in enumerate(texts))
    assert codes == [0, 0], "\n".join(failures)
    model_dir = ModelDir(str(volume / MODEL_DIR_IN_VOLUME))
    metrics = json.loads(pathlib.Path(model_dir.metrics).read_text())
    digests = [re.findall(r"weights sha256 ([0-9a-f]{64})", text) for text in texts]
    assert digests[0] and digests[0] == digests[1] == [metrics["weights_sha256"]], (
        f"the workers did not finish with the same weights: {digests}"
    )
    return model_dir


@pytest.mark.image
def test_two_workers_train_inside_the_image_and_the_non_root_user_writes_the_model(built, tmp_path):
    volume = fs_group_volume(tmp_path)
    host_model_dir = train_in_image(built[0], volume, tmp_path, [*TRAIN_FLAGS])

    assert os.path.isfile(host_model_dir.keras_model)
    assert os.path.isfile(os.path.join(host_model_dir.latest_saved_model(), "saved_model.pb"))
    assert json.loads(pathlib.Path(host_model_dir.metrics).read_text())["workers"] == 2
    written = list(volume.rglob("*"))
    assert written and all(path.stat().st_uid == NON_ROOT_UID for path in written), [
        f"{path} uid {path.stat().st_uid}" for path in written if path.stat().st_uid != NON_ROOT_UID
    ]


@pytest.mark.image
def test_the_default_dataset_is_prepared_in_the_image_up_to_the_download_and_trained_from_a_prepared_volume(
    built, tmp_path
):
    """make submit's default path with the image's code: the data Job's TFDS preparation of fashion_mnist (nothing
    can be downloaded here: a proxy refuses the download, so everything before it runs), then two workers reading a
    prepared copy on the volume, as the Job leaves it."""
    image, data_dir = built[0], SETTINGS["TRAINER_DATA_DIR"]
    volume = fs_group_volume(tmp_path)
    prepare = ["/usr/bin/tini", "-s", "--", "python", "-m", "trainer.data", f"--data-dir={data_dir}"]  # the Job's
    with working_container(image) as container, refused_downloads() as proxy:
        refused = subprocess.run(
            in_image(container, volume, prepare, proxy),
            capture_output=True,
            text=True,
            timeout=TRAIN_TIMEOUT_S,
        )
    assert refused.returncode == 1 and "HTTP code: 403" in refused.stderr, refused.stderr[-3000:]
    assert "ModuleNotFoundError" not in refused.stderr, refused.stderr[-3000:]

    prepared_tfds.prepare_in_a_process(volume / DATA_DIR_IN_VOLUME)
    with working_container(image) as container:
        ready = subprocess.run(in_image(container, volume, prepare, {}), capture_output=True, text=True)
    assert ready.returncode == 0 and f"dataset fashion_mnist is ready at {data_dir}/fashion_mnist" in ready.stdout, (
        ready.stderr[-3000:]
    )

    flags = ["--dataset", "fashion_mnist", "--data-dir", data_dir, "--epochs", "1", "--startup-timeout", "180"]
    model_dir = train_in_image(image, volume, tmp_path, flags)
    metrics = json.loads(pathlib.Path(model_dir.metrics).read_text())
    # The prepared images are learnable (a band per class): read through TFDS with their labels, they are learned.
    assert metrics["config"]["dataset"] == "fashion_mnist" and metrics["test_accuracy"] > 0.5, metrics


def read_status(model_dir: pathlib.Path) -> dict:
    try:
        return json.loads(pathlib.Path(ModelDir(str(model_dir)).status).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


@pytest.mark.image
def test_sigterm_to_the_entrypoint_reaches_the_trainer_which_checkpoints_and_exits_retryably(built, tmp_path):
    """Kubernetes stops a pod with SIGTERM to its first process, tini; the trainer must receive it."""
    image = built[0]
    volume = fs_group_volume(tmp_path)
    host_model_dir = volume / MODEL_DIR_IN_VOLUME
    entrypoint = image_config(image)["Entrypoint"]
    log = tmp_path / "trainer.log"
    # Far more steps than the test waits for: it ends by SIGTERM, not by finishing.
    flags = [
        "--dataset",
        "synthetic",
        "--epochs",
        "1000",
        "--train-examples",
        "512",
        "--test-examples",
        "256",
        "--steps-per-loop",
        "4",
        "--model-dir",
        MODEL_DIR,
    ]
    with working_container(image) as container, log.open("w") as out:
        process = subprocess.Popen(
            [
                "buildah",
                "run",
                "--isolation",
                "chroot",
                "--volume",
                f"{volume}:{MOUNT_PATH}",
                container,
                "--",
                *entrypoint,
                *flags,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + TRAIN_TIMEOUT_S
            while read_status(host_model_dir).get("global_step", 0) < 1:
                assert process.poll() is None, f"the trainer exited before training:\n{log.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"no training step in {TRAIN_TIMEOUT_S} s"
                time.sleep(0.5)
            tini = [child for child in psutil.Process(process.pid).children(recursive=True) if child.name() == "tini"]
            assert len(tini) == 1, f"expected one tini under buildah run, found {tini}"
            tini[0].send_signal(signal.SIGTERM)
            code = process.wait(timeout=TRAIN_TIMEOUT_S)
        finally:
            stop(process)
    assert code == ExitCode.PREEMPTED, f"exit code {code}:\n{log.read_text()[-3000:]}"
    assert read_status(host_model_dir)["state"] == "preempted"
    assert (pathlib.Path(ModelDir(str(host_model_dir)).checkpoints) / "checkpoint").is_file(), (
        "no checkpoint was saved on SIGTERM"
    )


@pytest.mark.image
def test_a_code_change_reuses_the_dependency_layer_and_ships_the_new_code(built, base_image, tmp_path):
    copy = tmp_path / "checkout"
    for name in ("Dockerfile", ".dockerignore", "pyproject.toml", "constraints.txt", "k8s/base/settings.env"):
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, copy / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("trainer", "scripts", "modules"):
        shutil.copytree(ROOT / name, copy / name, ignore=ignore)
    marker = f"# code change {tmp_path.name}"
    with (copy / "trainer" / "__init__.py").open("a") as init:
        init.write(f"\n{marker}\n")
    # A fork's new task file in modules/ ships too, with no Dockerfile edit, importable from any directory.
    (copy / "modules" / "forked.py").write_text(f"MARKER = {marker!r}\n")
    # Another repository, so this build's `latest` does not move the proof image's.
    repository = f"{TEST_REPOSITORY}-code-change"
    try:
        output = build(copy, f"{repository}:test", base_image)
        dependency_step = re.search(r"STEP \d+/\d+: RUN /opt/venv/bin/pip install .*--require-hashes.*\n(.*)", output)
        assert dependency_step, f"no dependency step in the build output:\n{output[-3000:]}"
        assert "Using cache" in dependency_step.group(1), "the code change reinstalled the dependencies"
        # The answer goes through a mounted folder, not buildah's stdout: under load `buildah run` can exit 0 having
        # lost a short-lived process's output.
        answer = tmp_path / "answer"
        answer.mkdir(mode=0o777)
        answer.chmod(0o777)  # the image's user writes it; mkdir's mode is cut by the umask
        with working_container(f"{repository}:test") as container:
            ran = buildah(
                "run",
                "--isolation",
                "chroot",
                "--volume",
                f"{answer}:/answer",
                container,
                "--",
                "python",
                "-c",
                "import inspect, os, trainer; os.chdir('/'); import modules.forked; "
                "open('/answer/shipped', 'w').write(inspect.getsource(trainer) + modules.forked.MARKER)",
            )
        shipped = (answer / "shipped").read_text()
        assert marker in shipped, f"the image runs the old trainer code:\n{shipped[-2000:]}\n{ran.stderr[-2000:]}"
        assert shipped.count(marker) == 2, "a module in modules/ did not reach the image"
    finally:
        buildah("rmi", f"{repository}:test", f"{repository}:latest", check=False)
