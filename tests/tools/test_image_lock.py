"""The image installs only what was checked, and all the runtime needs: every package from a hashed lock (pip
--require-hashes, written by make lock, kept in step with constraints.txt and holding every package the trainer and
the data step import, lazily included), FROM a base pinned by digest (a registry base without one is refused
unless explicitly allowed), and no secret of the clone URL reaches its labels."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

import imports_of
import prepared_tfds
from record_files import write_records
from refusing_proxy import PREPARE_DEFAULT_DATASET, refused_downloads
from scripts.common.packages import normalized
from scripts.image.image_requirements import FLAVOURS, requirements

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOCKS = ROOT / "scripts" / "image" / "locks"
BUILD_IMAGE = ROOT / "scripts" / "image" / "build-image.sh"


def lock_of(flavour: str) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, hashes) of a flavour's lock."""
    text = (LOCKS / f"{flavour}.txt").read_text().replace("\\\n", " ")
    pins = {}
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        requirement, *options = line.split()
        name, version = requirement.split("==")
        pins[normalized(name)] = (version, [o.removeprefix("--hash=sha256:") for o in options])
    return pins


def constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.strip().split("==")
            pins[normalized(name)] = version
    return pins


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_package_of_the_lock_is_pinned_with_hashes_and_agrees_with_constraints(flavour):
    lock = lock_of(flavour)
    assert lock, f"{LOCKS / flavour}.txt is empty: run make lock"
    for name, (_, hashes) in lock.items():
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", h) for h in hashes), name
    pinned = constraints()
    stale = {
        name: (version, pinned[name]) for name, (version, _) in lock.items() if pinned.get(name, version) != version
    }
    assert stale == {}, f"the lock is older than constraints.txt (lock, constraints): run make lock: {stale}"
    for requirement in requirements(flavour, ROOT / "pyproject.toml"):
        name = normalized(re.split(r"[\[=<>~ ]", requirement, maxsplit=1)[0])
        if name == "tensorflow" and flavour == "gpu":
            continue  # tensorflow[and-cuda]: the lock holds tensorflow and the CUDA wheels it brings
        assert name in lock, f"{requirement} is not in the {flavour} lock: run make lock"


def test_the_dockerfile_installs_the_flavours_lock_with_required_hashes_and_nothing_else():
    dockerfile = (ROOT / "Dockerfile").read_text()
    (install,) = [line for line in dockerfile.splitlines() if "pip install" in line and "locks/" in line]
    assert "--require-hashes" in install and "--no-deps" in install and '-r "locks/$TF_FLAVOUR.txt"' in install
    assert "-c constraints.txt" not in dockerfile  # nothing resolves at build time


def build_image(environ: dict[str, str]) -> subprocess.CompletedProcess:
    """build-image.sh up to its choice of container tool (a name that does not exist), which it reaches only once
    the base has passed."""
    env = {k: v for k, v in os.environ.items() if k not in ("BASE_IMAGE", "BASE_IMAGE_DIGEST", "ALLOW_UNPINNED_BASE")}
    return subprocess.run(
        [shutil.which("bash"), str(BUILD_IMAGE)],
        capture_output=True,
        text=True,
        env={**env, "CONTAINER_TOOL": "no-such-tool", **environ},
        timeout=60,
    )


@pytest.mark.parametrize(
    "environ, passes",
    [
        ({}, True),  # the Dockerfile's tag at the digest the settings record
        ({"BASE_IMAGE_DIGEST": "sha256:" + "a" * 64}, True),
        ({"BASE_IMAGE": "docker.io/library/debian:bookworm"}, False),
        ({"BASE_IMAGE": "docker.io/library/debian@sha256:" + "b" * 64}, True),
        ({"BASE_IMAGE": "localhost/debootstrap-python3.11:bookworm-0123"}, True),  # made here by make-base-image.sh
        ({"BASE_IMAGE": "docker.io/library/debian:bookworm", "ALLOW_UNPINNED_BASE": "1"}, True),
    ],
)
def test_a_registry_base_without_a_digest_is_refused_unless_allowed(environ, passes):
    result = build_image(environ)
    assert result.returncode != 0
    assert ("not pinned by digest" in result.stderr) != passes, result.stderr
    if not passes:
        assert "BASE_IMAGE_DIGEST" in result.stderr and "ALLOW_UNPINNED_BASE=1" in result.stderr


@pytest.mark.parametrize(
    "origin, label",
    [
        ("https://user:ghp_secret@github.com/o/r.git", "https://github.com/o/r.git"),
        ("https://oauth2:tok@gitlab.example/o/r.git?private_token=x#frag", "https://gitlab.example/o/r.git"),
        ("git@github.com:o/r.git", "github.com:o/r.git"),
        ("ssh://git@host:22/o/r", "ssh://host:22/o/r"),
        ("https://github.com/o/r.git", "https://github.com/o/r.git"),
    ],
)
def test_the_source_label_carries_no_userinfo_of_the_clone_url(tmp_path, origin, label):
    checkout = tmp_path / "checkout"
    for name in ("scripts/image/build-image.sh", "scripts/common/settings.sh", "scripts/common/settings.py"):
        (checkout / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, checkout / name)
    for package in ("scripts", "scripts/common"):
        (checkout / package / "__init__.py").touch()
    (checkout / "k8s" / "base").mkdir(parents=True)
    shutil.copy2(ROOT / "k8s" / "base" / "settings.env", checkout / "k8s" / "base" / "settings.env")
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    subprocess.run(["git", "-C", str(checkout), "remote", "add", "origin", origin], check=True)
    result = subprocess.run(
        [shutil.which("bash"), str(checkout / "scripts" / "image" / "build-image.sh"), "--print-source"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == label


def test_every_file_the_dockerfile_copies_is_in_the_build_context():
    # .dockerignore is an allow-list: a COPY of a path it leaves out fails the build (the locks once were).
    allowed = [
        line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")
    ]
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        words = line.split()
        if words[:1] != ["COPY"] or any(word.startswith("--from") for word in words):
            continue
        for source in words[1:-1]:
            assert any(source.rstrip("/") == a or source.startswith(a + "/") for a in allowed), source


# --- completeness: every package the runtime imports, lazily included, is in each lock ----------------------------
# Each route runs the real code in this venv, recording the file of every module it imported from site-packages
# (tests/helpers/imports_of.py); the distribution owning each file must be in every flavour's lock. A package this
# venv has for other reasons may be imported only because it is there (Keras draws with matplotlib when it can): such
# a package passes only if the route, run again with it uninstallable, ends the same way.
# The flavour's TensorFlow wheel installs the same import package as this venv's `tensorflow`.
SAME_IMPORT_PACKAGE = {"tensorflow-cpu": "tensorflow"}
# The project itself: its editable install's finder here, its wheel in the image.
PROJECT = normalized(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["name"])


@functools.cache
def owners() -> dict[str, tuple[str, str]]:
    """Each installed module file of this venv (resolved path) -> (its distribution's normalized name, its top-level
    import package)."""
    owned = {}
    for distribution in importlib.metadata.distributions():
        name = normalized(distribution.metadata["Name"])
        for file in distribution.files or []:
            if file.suffix in (".py", ".so", ".pyc"):
                top_level = file.parts[0].split(".")[0]
                owned[str(pathlib.Path(distribution.locate_file(file)).resolve())] = (name, top_level)
    return owned


def run_route(tmp_path: pathlib.Path, args: tuple[str, ...], env: dict[str, str], missing: set[str] = frozenset()):
    """`python -m ARGS` under the recorder, with the MISSING top-level modules uninstallable; its result and
    {distribution: its top-level packages the route imported}."""
    out = tmp_path / "imports.json"
    out.unlink(missing_ok=True)
    result = subprocess.run(
        imports_of.command(str(out), args, missing),
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **env},
        timeout=300,
    )
    assert out.is_file(), f"the route did not reach its exit ({result.returncode}):\n{result.stderr[-3000:]}"
    files = [str(pathlib.Path(f).resolve()) for f in json.loads(out.read_text())]
    unowned = [f for f in files if f not in owners()]
    assert not unowned, f"modules from no installed distribution: {unowned[:5]}"
    imported: dict[str, set[str]] = {}
    for file in files:
        distribution, top_level = owners()[file]
        imported.setdefault(distribution, set()).add(top_level)
    return result, imported


def unlocked(distributions, flavour: str) -> set[str]:
    locked = set(lock_of(flavour))
    locked |= {SAME_IMPORT_PACKAGE.get(name, name) for name in locked}
    return set(distributions) - locked - {PROJECT}


def check_route(tmp_path: pathlib.Path, route: str, *args: str, env: dict[str, str] | None = None):
    """Runs the route; fails naming each package it needs that a lock lacks. Returns the run's result."""
    env = env or {}
    result, imported = run_route(tmp_path, args, env)
    extra = set().union(*(unlocked(imported, flavour) for flavour in FLAVOURS))
    if extra:
        # Imported only because this venv has them? Then the route ends the same without them, as in the image.
        without = {top_level for name in extra for top_level in imported[name]}
        again, imported_again = run_route(tmp_path, args, env, missing=without)
        for flavour in FLAVOURS:
            needed = sorted(unlocked(imported, flavour))
            assert again.returncode == result.returncode and not unlocked(imported_again, flavour), (
                f"{route} needs {needed}, which the {flavour} lock (scripts/image/locks/{flavour}.txt) does not "
                f"install: without them it exits {again.returncode}, not {result.returncode}:\n"
                f"{again.stderr[-2000:]}\nAdd them to pyproject.toml's dependencies and run make lock"
            )
    return result


@pytest.fixture(scope="module")
def prepared_fashion_mnist(tmp_path_factory) -> pathlib.Path:
    data_dir = tmp_path_factory.mktemp("tfds")
    prepared_tfds.prepare_in_a_process(data_dir, 512, 128)
    return data_dir


def test_every_package_the_default_datasets_preparation_imports_is_in_each_lock(tmp_path):
    route = "preparing fashion_mnist (python -m trainer.data)"
    with refused_downloads() as env:
        result = check_route(tmp_path, route, *PREPARE_DEFAULT_DATASET, str(tmp_path / "data"), env=env)
    # As far as the download, which the proxy refuses: everything before it ran.
    assert result.returncode == 1 and "HTTP code: 403" in result.stderr, result.stderr[-3000:]


@pytest.mark.slow
def test_every_package_the_trainer_imports_reading_a_prepared_tfds_dataset_is_in_each_lock(
    tmp_path, prepared_fashion_mnist
):
    result = check_route(
        tmp_path,
        "the trainer on a prepared TFDS dataset (python -m trainer)",
        *("trainer", "--dataset", "fashion_mnist", "--data-dir", str(prepared_fashion_mnist), "--epochs", "1"),
        *("--model-dir", str(tmp_path / "model")),
    )
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("dataset", ["synthetic", "tfrecord"])
def test_every_package_the_trainer_and_the_data_check_import_is_in_each_lock(tmp_path, dataset):
    flags = ["--dataset", "synthetic", "--train-examples", "512", "--test-examples", "128"]
    if dataset == "tfrecord":
        records = write_records(tmp_path / "records", 512, 2, 128, 1, seed=3)
        flags = ["--dataset", "tfrecord", *records, "--image-shape", "28x28x1", "--num-classes", "10"]
        checked = check_route(tmp_path, "checking TFRecord files (python -m trainer.data)", "trainer.data", *flags)
        assert checked.returncode == 0, checked.stderr[-3000:]
    result = check_route(
        tmp_path,
        f"the trainer on {dataset} (python -m trainer)",
        *("trainer", *flags, "--epochs", "1", "--model-dir", str(tmp_path / "model")),
    )
    assert result.returncode == 0, result.stderr[-3000:]


def test_a_package_the_runtime_needs_and_a_lock_lacks_fails_the_check_naming_it(tmp_path, monkeypatch):
    """The check itself: with importlib-resources taken out of the locks (as they were), the preparation fails it."""
    real = lock_of
    monkeypatch.setattr(
        sys.modules[__name__],
        "lock_of",
        lambda flavour: {k: v for k, v in real(flavour).items() if k != "importlib-resources"},
    )
    with refused_downloads() as env, pytest.raises(AssertionError, match=r"needs \['importlib-resources'\]"):
        check_route(tmp_path, "preparing fashion_mnist", *PREPARE_DEFAULT_DATASET, str(tmp_path / "data"), env=env)
