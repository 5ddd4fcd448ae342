"""TF_CONFIG exactly as the Kubeflow training operator v1.9 builds it (genTFConfigJSONStr).

Format: {"cluster":{"<type>":["<addr>", ...], ...},"task":{"type":"<type>","index":<i>},"environment":"cloud"}
with lower-cased replica types, cluster keys in sorted order (Go's json.Marshal sorts map keys),
every replica type in the cluster (evaluator included), and no whitespace.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from .manifest import CHIEF_TYPES

Address = Callable[[str, int], str]


def is_distributed(replica_counts: Mapping[str, int]) -> bool:
    """The operator sets no TF_CONFIG when the whole job has exactly one replica."""
    return sum(replica_counts.values()) != 1


def chief_of(replica_counts: Mapping[str, int]) -> tuple[str, int]:
    """The replica the operator labels job-role=master: a Chief/Master if present, else worker 0."""
    for rtype in CHIEF_TYPES:
        if replica_counts.get(rtype, 0) > 0:
            return rtype, 0
    return "Worker", 0


def operator_address(job_name: str, namespace: str, port: int) -> Address:
    """The headless-Service DNS name the operator puts in TF_CONFIG for each replica."""
    return lambda rtype, index: f"{job_name}-{rtype.lower()}-{index}.{namespace}.svc:{port}"


def cluster_spec(replica_counts: Mapping[str, int], address: Address) -> dict[str, list[str]]:
    return {
        rtype.lower(): [address(rtype, i) for i in range(count)]
        for rtype, count in sorted(replica_counts.items(), key=lambda item: item[0].lower())
    }


def tf_config(replica_counts: Mapping[str, int], rtype: str, index: int, address: Address) -> str | None:
    """The TF_CONFIG value for one replica, or None where the operator sets none."""
    if not is_distributed(replica_counts):
        return None
    config = {
        "cluster": cluster_spec(replica_counts, address),
        "task": {"type": rtype.lower(), "index": index},
        "environment": "cloud",
    }
    text = json.dumps(config, separators=(",", ":"), ensure_ascii=False)
    # Go's encoder escapes these three characters; do the same so the strings compare equal.
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
