import pytest

from tests.cluster.node import CONTEXT, kubectl


@pytest.fixture(scope="session", autouse=True)
def node_is_up() -> None:
    if kubectl("get", "--raw", "/readyz", check=False).returncode != 0:
        pytest.fail(f"the local node is not up (context {CONTEXT}): run make cluster-up as root first")
