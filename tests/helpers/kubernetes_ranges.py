"""Which Kubernetes minors the pins may run on: those each engine's own CI tests at its pinned tag, or the one our
cluster suite ran every engine on (RUN_HERE_KUBERNETES, by the suite RUN_HERE_SUITE names). That the run is real
(the local node's version, the suite make test-cluster runs) is the node room's to check:
scripts/node/tests/test_node_settings.py."""

from __future__ import annotations

import re
from collections.abc import Mapping


def minor(version: str) -> tuple[int, int]:
    match = re.search(r"v(\d+)\.(\d+)(?:\.\d+)?", version)
    assert match, f"no vMAJOR.MINOR[.PATCH] in {version!r}"
    return int(match.group(1)), int(match.group(2))


def run_here(settings: Mapping[str, str]) -> tuple[tuple[int, int] | None, str]:
    """(the minor our own cluster suite vouches for, or None; why not, when None)."""
    version, suite = settings.get("RUN_HERE_KUBERNETES", ""), settings.get("RUN_HERE_SUITE", "")
    if not version or not suite:
        return None, "no run here is recorded (RUN_HERE_KUBERNETES, RUN_HERE_SUITE)"
    return minor(version), ""


def outside_ranges(settings: Mapping[str, str], cluster_version: str, ranges: Mapping[str, str]) -> list[str]:
    """One line per pin (its version key: its tested-list key) whose CI does not test CLUSTER_VERSION's minor and
    for which no run here vouches; empty when every pin is covered."""
    cluster = minor(cluster_version)
    vouched, why_not = run_here(settings)
    return [
        f"{cluster_version} runs Kubernetes {'.'.join(map(str, cluster))}; {version_key} {settings[version_key]} is "
        f"tested on {settings[tested_key]}, and {why_not or 'the run here was on another minor'}"
        for version_key, tested_key in ranges.items()
        if cluster not in [minor(v) for v in settings[tested_key].split(",")] and vouched != cluster
    ]
