import functools

import pytest

import process_environment  # noqa: F401  (sets the tests' environment before anything imports TensorFlow)
from scripts.node.tests.node import CONTEXT, image_built, kubectl


@functools.cache
def node_ready() -> bool:
    """Asked once per session: the API server's readiness."""
    return kubectl("get", "--raw", "/readyz", check=False).returncode == 0


@pytest.fixture(autouse=True)
def node_is_up(request: pytest.FixtureRequest) -> None:
    """The cluster suite's tests need the node; this folder's quick tests (its scripts, offline) do not."""
    if request.node.get_closest_marker("cluster") is not None and not node_ready():
        pytest.fail(f"the local node is not up (context {CONTEXT}): run make cluster-up as root first")


@pytest.fixture(autouse=True)
def image_is_built(request: pytest.FixtureRequest, node_is_up: None) -> None:
    if request.node.get_closest_marker("cluster") is not None:
        image_built()
