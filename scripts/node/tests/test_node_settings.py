"""The local node's settings against the template's: the k3s pin is the node's Kubernetes, and the run that vouches
for a Kubernetes minor past an engine's tested range (RUN_HERE_*, scripts/common/settings.env) is this node's suite."""

from __future__ import annotations

import pathlib
import re
from collections.abc import Mapping

from scripts.common import settings as project_settings

ROOM = pathlib.Path(__file__).resolve().parents[1]
ROOT = ROOM.parents[1]
SETTINGS = project_settings.load_file()


def cluster_suite_target() -> str:
    """The pytest command line make test-cluster runs its tests with (node.mk's CLUSTER_SUITE, in its recipe)."""
    text = (ROOM / "node.mk").read_text()
    recipe = re.search(r"^test-cluster:.*\n((?:\t.*\n)+)", text, re.MULTILINE)
    assert recipe and "$(CLUSTER_SUITE)" in recipe.group(1), "scripts/node/node.mk's test-cluster runs no CLUSTER_SUITE"
    found = re.search(r"^CLUSTER_SUITE = ((?:.*\\\n)*.*)$", text, re.MULTILINE)
    assert found, "scripts/node/node.mk defines no CLUSTER_SUITE"
    return found.group(1)


def run_here_problems(settings: Mapping[str, str]) -> list[str]:
    """Why RUN_HERE_* is not this node's run (empty: it is): the version the node runs, by the suite make
    test-cluster (and so CI) runs."""
    version, suite = settings["RUN_HERE_KUBERNETES"], settings["RUN_HERE_SUITE"]
    problems = []
    if version != settings["NODE_KUBERNETES_VERSION"]:
        problems.append(f"RUN_HERE_KUBERNETES {version} is not the local node's {settings['NODE_KUBERNETES_VERSION']}")
    if not (ROOT / suite).is_dir() or not re.search(rf"-m pytest {re.escape(suite)}\b", cluster_suite_target()):
        problems.append(f"RUN_HERE_SUITE {suite} is not the suite make test-cluster runs")
    return problems


def test_the_k3s_image_runs_the_local_nodes_kubernetes():
    # One version proven: the node the cluster suite runs on is the Kubernetes a k3d user gets.
    assert SETTINGS["K3S_IMAGE"].split(":")[1].split("-k3s")[0] == SETTINGS["NODE_KUBERNETES_VERSION"]


def test_the_run_that_vouches_for_a_minor_is_this_nodes_suite():
    assert run_here_problems(SETTINGS) == []
    (other_node,) = run_here_problems({**SETTINGS, "NODE_KUBERNETES_VERSION": "v1.34.3"})
    assert "is not the local node's v1.34.3" in other_node
    (not_the_suite,) = run_here_problems({**SETTINGS, "RUN_HERE_SUITE": "tests/tools"})
    assert "RUN_HERE_SUITE tests/tools is not the suite make test-cluster runs" in not_the_suite


def test_the_nodes_keys_live_in_its_own_settings_file_and_reach_every_reader():
    # The node's keys stay out of the forker's file (each key in its owner's), and the scripts (load_file with no
    # path, as load and --check use it) still read them.
    base, node = (project_settings.load_file(path) for path in (project_settings.SETTINGS_FILE, ROOM / "settings.env"))
    assert node and not base.keys() & node.keys()
    assert node.items() <= SETTINGS.items()
