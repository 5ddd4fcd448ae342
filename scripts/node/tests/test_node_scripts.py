"""The local node's scripts where no node exists: the missing tools and the taken port cluster-up names before it
starts anything (no root needed, nothing touched outside tmp_path)."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import socket
import subprocess

import pytest

from scripts.common import engine_folders
from scripts.common import settings as project_settings
from stub_tools import path_with, run_script, with_real

ROOM = pathlib.Path(__file__).resolve().parents[1]


TOOLS = ("go", "containerd", "runc", "ctr", "iptables", "ipset", "conntrack", "openssl", "buildah", "kubectl")


def node_settings(tmp_path: pathlib.Path) -> dict[str, str]:
    """The local node's directories in TMP_PATH, so that no check touches a real node."""
    return {
        "NODE_ROOT": str(tmp_path / "root"),
        "NODE_RUN": str(tmp_path / "run"),
        "NODE_CNI_BIN": str(tmp_path / "cni"),
    }


def test_cluster_up_names_every_missing_tool_at_once_with_where_to_get_it(tmp_path):
    path = with_real(path_with(tmp_path, {}), "id", "sed")
    result = run_script(ROOM / "up.sh", path, **node_settings(tmp_path))
    assert result.returncode == 1
    for tool in (*TOOLS, "ss"):
        assert f"error: {tool} is not installed: " in result.stderr, result.stderr
    assert "https://go.dev/dl/" in result.stderr and "apt-get install iproute2" in result.stderr
    assert f"error: the CNI plugins are not in {tmp_path / 'cni'}: apt-get install containernetworking-plugins" in (
        result.stderr
    )
    if os.getuid() != 0:
        assert "run it as root (sudo make cluster-up)" in result.stderr
    # SERVE=1 reads KServe's manifest with the project's Python: without the venv, named with its fix.
    served = run_script(
        ROOM / "up.sh", path, SERVE="1", PY=str(tmp_path / "no-venv/bin/python"), **node_settings(tmp_path)
    )
    assert served.returncode == 1
    assert f"the project's Python ({tmp_path / 'no-venv/bin/python'}): run make install first" in served.stderr


def test_cluster_up_names_a_port_another_process_holds_before_it_starts_anything(tmp_path):
    if shutil.which("ss") is None:
        pytest.skip("cluster-up finds a taken port with ss: apt-get install iproute2")
    path = with_real(path_with(tmp_path, dict.fromkeys(TOOLS, "exit 0")), "id", "sed", "ss", "head")
    (tmp_path / "cni").mkdir()
    (tmp_path / "cni" / "bridge").write_text("#!/bin/sh\n")
    (tmp_path / "cni" / "bridge").chmod(0o755)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run_script(ROOM / "up.sh", path, NODE_API_PORT=str(port), **node_settings(tmp_path))
    assert result.returncode == 1
    assert f"error: port {port} is taken by another process (" in result.stderr, result.stderr
    assert "stop it, or run make cluster-down" in result.stderr
    assert not (tmp_path / "root").exists() and not (tmp_path / "run").exists(), "nothing started"


def test_cluster_up_refuses_a_node_count_it_cannot_make_and_names_the_agents_tools(tmp_path):
    path = with_real(path_with(tmp_path, {}), "id", "sed")
    three = run_script(ROOM / "up.sh", path, NODES="3", **node_settings(tmp_path))
    assert three.returncode == 1
    assert "error: NODES=3 is not 1 or 2: the local cluster has the host's node and at most one agent" in three.stderr
    assert not (tmp_path / "root").exists() and not (tmp_path / "run").exists(), "nothing started"
    # NODES=2 runs the agent's processes in its network namespace (nsenter) and shapes its link (tc).
    two = run_script(ROOM / "up.sh", path, NODES="2", **node_settings(tmp_path))
    assert two.returncode == 1
    for tool in ("nsenter", "tc"):
        assert f"error: {tool} is not installed: " in two.stderr, two.stderr
    one = run_script(ROOM / "up.sh", path, **node_settings(tmp_path))
    assert "error: nsenter is not installed" not in one.stderr


# local-path-provisioner v0.0.30's deploy manifest as its module zip holds it, byte for byte (the one k3d-up's test
# feeds it too).
LOCAL_PATH_MANIFEST = ROOM.parents[1] / "tests" / "tools" / "fixtures" / "local-path-storage-v0.0.30.yaml"
RENDERER = ROOM.parents[1] / "scripts" / "cluster" / "render-local-path.sh"


def rendered(storage: str, shared: str) -> str:
    done = subprocess.run(
        [shutil.which("bash"), str(RENDERER), str(LOCAL_PATH_MANIFEST), storage, shared],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout


def test_the_node_applies_the_local_path_classes_from_the_renderer_k3d_up_shares(tmp_path):
    """install_storage as up.sh has it, with the module's directory and kubectl stood in for: what it applies is
    scripts/cluster/render-local-path.sh's output for the node's folders, the script k3d-up NODES=2 applies."""
    module = tmp_path / "module"
    (module / "deploy").mkdir(parents=True)
    shutil.copy(LOCAL_PATH_MANIFEST, module / "deploy" / "local-path-storage.yaml")
    applied, root = tmp_path / "applied.yaml", tmp_path / "root"
    function = re.search(r"^install_storage\(\) \{\n.*?^\}\n", (ROOM / "up.sh").read_text(), re.MULTILINE | re.DOTALL)
    assert function, "scripts/node/up.sh has no install_storage"
    script = (
        f"set -euo pipefail\nmodule_dir() {{ echo {module}; }}\n"
        f'kube() {{ [ "$1" != apply ] || cat > {applied}; }}\n{function.group(0)}install_storage\n'
    )
    subprocess.run(
        [shutil.which("bash"), "-c", script],
        cwd=ROOM.parents[1],
        env={"PATH": os.environ["PATH"], "NODE_ROOT": str(root), "LOCAL_PATH_PROVISIONER_VERSION": "v0.0.30"},
        check=True,
        timeout=60,
    )
    assert applied.read_text() == rendered(f"{root}/storage", f"{root}/shared")
    assert (root / "storage").is_dir() and (root / "shared").is_dir()
    # One renderer: the node keeps no copy of its own (k3d-up's test holds k3d-up to the same script).
    for script_path in ROOM.glob("*.sh"):
        assert "storageClassConfigs" not in script_path.read_text(), script_path


def engine_builds(root: pathlib.Path, settings: dict[str, str]) -> list[list[str]]:
    """common.sh's engine_builds, run in root with these settings only: each line's fields."""
    function = re.search(r"^engine_builds\(\) \{\n.*?^\}\n", (ROOM / "common.sh").read_text(), re.MULTILINE | re.DOTALL)
    assert function, "scripts/node/common.sh has no engine_builds"
    done = subprocess.run(
        [shutil.which("bash"), "-c", f"set -euo pipefail\n{function.group(0)}engine_builds"],
        cwd=root,
        env={"PATH": os.environ["PATH"], **settings},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return [line.split(" ", 8) for line in done.stdout.splitlines()]


def test_the_node_builds_the_controllers_of_the_engine_folders_that_are_there(tmp_path):
    """build.sh and render_engines build and render an engine's controller from engine_builds, which leaves out an
    engine a fork deleted (its settings went with its folder), under the names and versions the build cache holds."""
    settings = project_settings.load_file()
    here = {line[0]: line for line in engine_builds(ROOM.parents[1], settings)}
    cached = {folder: f"{line[5]}-{line[3]}" for folder, line in here.items()}
    expected = {"kueue": f"kueue-{settings['KUEUE_VERSION']}"}
    if "jobset" in engine_folders.names():
        expected["jobset"] = f"jobset-{settings['JOBSET_VERSION']}"
    if "trainjob" in engine_folders.names():
        expected["trainjob"] = f"trainer-controller-manager-{settings['KUBEFLOW_TRAINER_VERSION']}"
    assert cached == expected
    build = (ROOM / "build.sh").read_text()
    assert "JOBSET_VERSION" not in build and "KUBEFLOW_TRAINER_VERSION" not in build  # only through the table
    # A fork without the optional engines: neither their folders nor their settings.
    fork = tmp_path / "fork"
    shutil.copytree(engine_folders.ENGINES_DIR, fork / "k8s" / "engines")
    for name in engine_folders.names():
        if name != engine_folders.DEFAULT:
            shutil.rmtree(fork / "k8s" / "engines" / name, ignore_errors=True)
    pinned = ("JOBSET_VERSION", "JOBSET_COMMIT", "KUBEFLOW_TRAINER_VERSION", "KUBEFLOW_TRAINER_COMMIT")
    without = {key: value for key, value in settings.items() if key not in pinned}
    assert [line[0] for line in engine_builds(fork, without)] == ["kueue"]


def test_link_rate_shapes_both_ends_of_the_agents_link_and_unlimited_removes_the_limit(tmp_path):
    calls = tmp_path / "calls"
    stubs = {
        # The agent's link is there; nsenter runs its command as given (here, outside any namespace).
        "ip": "exit 0",
        "nsenter": 'shift; exec "$@"',
        "tc": f'echo "tc $*" >> {calls}; [ "$2" != show ] || echo "qdisc of $4"',
    }
    path = with_real(path_with(tmp_path, stubs), "id", "sed")
    limited = run_script(ROOM / "link-rate.sh", path, CLUSTER_NAME="stubbed", NODE_LINK_RATE="100mbit")
    if os.getuid() != 0:
        assert limited.returncode == 1 and "run it as root (sudo make link-rate)" in limited.stderr
        return
    assert limited.returncode == 0, limited.stderr
    # Each direction at the rate, the bucket never under 64 KiB, as cluster-up and the bench's namespaces set it.
    replace = "root tbf rate 100mbit burst 65536 latency 100ms"
    assert calls.read_text().splitlines()[:2] == [
        f"tc qdisc replace dev stubbed-agent {replace}",
        f"tc qdisc replace dev eth0 {replace}",
    ]
    assert limited.stdout.splitlines() == [
        "the link to stubbed-agent: 100mbit each way",
        "qdisc of stubbed-agent",
        "qdisc of eth0",
    ]
    calls.unlink()
    unlimited = run_script(ROOM / "link-rate.sh", path, CLUSTER_NAME="stubbed", NODE_LINK_RATE="")
    assert unlimited.returncode == 0, unlimited.stderr
    assert calls.read_text().splitlines()[:2] == ["tc qdisc del dev stubbed-agent root", "tc qdisc del dev eth0 root"]
    assert "the link to stubbed-agent: unlimited each way" in unlimited.stdout


def test_link_rate_without_an_agent_node_says_how_to_add_one(tmp_path):
    path = with_real(path_with(tmp_path, {"ip": "exit 1", "tc": "exit 0", "nsenter": "exit 0"}), "id", "sed")
    result = run_script(ROOM / "link-rate.sh", path, CLUSTER_NAME="stubbed")
    assert result.returncode == 1
    if os.getuid() == 0:
        said = result.stderr.strip()
        assert said == "error: no agent node here (no link stubbed-agent): make cluster-up NODES=2 adds it"
