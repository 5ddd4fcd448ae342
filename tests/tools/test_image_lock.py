"""The image installs only what was checked: every package from a hashed lock (pip --require-hashes, written by
make lock, kept in step with constraints.txt), FROM a base pinned by digest (a registry base without one is refused
unless explicitly allowed), and no secret of the clone URL reaches its labels."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess

import pytest

from scripts.image.image_requirements import FLAVOURS, requirements

ROOT = pathlib.Path(__file__).resolve().parents[2]
LOCKS = ROOT / "scripts" / "image" / "locks"
BUILD_IMAGE = ROOT / "scripts" / "image" / "build-image.sh"


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


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
