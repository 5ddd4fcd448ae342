"""The cluster shell scripts where no cluster exists: shellcheck, and the messages a user gets
when docker, k3d, kubectl or git is missing or Docker is not running."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPTS = [ROOT / "scripts" / name for name in ("k3d-up.sh", "k3d-down.sh", "fetch-model.sh")]
# What the scripts need from the system before they look for the cluster tools.
BASICS = ("bash", "dirname")


def test_shellcheck_passes_on_the_cluster_scripts():
    assert shutil.which("shellcheck"), "shellcheck is missing: apt-get install shellcheck (Debian/Ubuntu)"
    result = subprocess.run(["shellcheck", *map(str, SCRIPTS)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def path_with(tmp_path: pathlib.Path, stubs: dict[str, str]) -> str:
    """A PATH holding only the basics plus the given stub tools (name -> shell body)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in BASICS:
        (bin_dir / tool).symlink_to(shutil.which(tool))
    for name, body in stubs.items():
        stub = bin_dir / name
        stub.write_text(f"#!{shutil.which('bash')}\n{body}\n")
        stub.chmod(0o755)
    return str(bin_dir)


def run_script(name: str, path: str) -> subprocess.CompletedProcess:
    return subprocess.run([shutil.which("bash"), str(ROOT / "scripts" / name)], capture_output=True, text=True,
                          env={"PATH": path, "HOME": os.environ.get("HOME", "/tmp")}, timeout=60)


def test_k3d_up_names_every_missing_tool_with_where_to_get_it(tmp_path):
    result = run_script("k3d-up.sh", path_with(tmp_path, {}))
    assert result.returncode == 1
    for tool, hint in (("docker", "docs.docker.com"), ("k3d", "k3d.io"), ("kubectl", "kubernetes.io/docs/tasks/tools"),
                       ("git", "git-scm.com")):
        assert f"error: {tool} is not installed" in result.stderr and hint in result.stderr, result.stderr


def test_k3d_up_says_when_docker_is_installed_but_not_running(tmp_path):
    stubs = {"docker": "exit 1", "k3d": "exit 0", "kubectl": "exit 0", "git": "exit 0"}
    result = run_script("k3d-up.sh", path_with(tmp_path, stubs))
    assert result.returncode == 1
    assert "daemon does not answer" in result.stderr
    assert "not installed" not in result.stderr


@pytest.mark.parametrize("script, missing", [("k3d-down.sh", "k3d"), ("fetch-model.sh", "kubectl")])
def test_other_scripts_say_which_tool_is_missing(tmp_path, script, missing):
    result = run_script(script, path_with(tmp_path, {}))
    assert result.returncode == 1
    assert f"{missing} is not installed" in result.stderr
