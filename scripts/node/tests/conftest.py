import fcntl
import functools
import os

import pytest

import process_environment  # noqa: F401  (sets the tests' environment before anything imports TensorFlow)
from scripts.node.tests.node import CONTEXT, kubectl, make, project_image


@functools.cache
def node_ready() -> bool:
    """Asked once per session: the API server's readiness."""
    return kubectl("get", "--raw", "/readyz", check=False).returncode == 0


@pytest.fixture(autouse=True)
def node_is_up(request: pytest.FixtureRequest) -> None:
    """The cluster suite's tests need the node; this folder's quick tests (its scripts, offline) do not."""
    if request.node.get_closest_marker("cluster") is not None and not node_ready():
        pytest.fail(f"the local node is not up (context {CONTEXT}): run make cluster-up as root first")


@functools.cache
def image_built() -> None:
    """make image once per session, unless make test-cluster built it just before (CLUSTER_SUITE_IMAGE names it); a
    lock keeps pytest-xdist's workers from building at once. Every make call then takes the image as built."""
    if os.environ.get("CLUSTER_SUITE_IMAGE") == project_image():
        return
    with open(f"/tmp/distml-cluster-suite-{CONTEXT}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        make("image", image_as_built=False)


@pytest.fixture(autouse=True)
def image_is_built(request: pytest.FixtureRequest, node_is_up: None) -> None:
    if request.node.get_closest_marker("cluster") is not None:
        image_built()
