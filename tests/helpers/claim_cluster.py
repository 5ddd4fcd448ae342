"""A cluster as the volume claim's check (scripts/common/volume_claim.py) asks it: kubectl's JSON for the nodes, the
StorageClasses and the claim. The check's own test and those of each command that creates the claim answer it here."""

from __future__ import annotations

import json
import subprocess

# What the check asks kubectl: its arguments' first two words.
QUESTIONS = (("get", "nodes"), ("get", "storageclass"), ("get", "pvc"))


def node(name: str, ready: bool = True, cordoned: bool = False) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def cluster(
    nodes: list[dict], classes: tuple[str, ...] = ("local-path", "local-path-shared"), claim: dict | None = None
):
    """A kubectl that answers as a cluster with NODES, these StorageClasses and (maybe) the claim already there."""

    def kubectl(*args: str) -> str:
        if args[:2] == ("get", "nodes"):
            return json.dumps({"items": nodes})
        if args[:2] == ("get", "storageclass"):
            return json.dumps({"items": [{"metadata": {"name": name}} for name in classes]})
        if args[:2] == ("get", "pvc"):
            return json.dumps(claim) if claim else ""
        raise AssertionError(f"unexpected kubectl {args}")

    return kubectl


def project_kubectl(answers, calls: list[tuple[str, ...]]):
    """scripts/common/kubectl.py's kubectl over ANSWERS (a cluster above): the check's questions answered, every other
    call recorded in CALLS and answered with nothing (as `get --ignore-not-found` finds nothing)."""

    def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        if args[:2] in QUESTIONS:
            return subprocess.CompletedProcess(args, 0, answers(*args), "")
        calls.append(args)
        return subprocess.CompletedProcess(args, 0, "", "")

    return kubectl
