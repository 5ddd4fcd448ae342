"""kubectl for the tools that drive a cluster through it (make submit-pipeline, make serve-cluster, make
tune-cluster): every call names the project's context (KUBE_CONTEXT, else the k3d cluster's), never the current one,
and objects go to it as JSON (a value such as 1e+30 is text to PyYAML but a number to kubectl's YAML reader)."""

from __future__ import annotations

import datetime
import json
import subprocess
from typing import Any

from scripts.common import settings as project_settings


class KubectlError(RuntimeError):
    """A kubectl call failed; the message holds the command and what kubectl said."""


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    command = ["kubectl", "--context", project_settings.kube_context(project_settings.load()), *args]
    try:
        done = subprocess.run(command, input=stdin, capture_output=True, text=True)
    except FileNotFoundError:
        raise KubectlError("kubectl is not installed: https://kubernetes.io/docs/tasks/tools/") from None
    if check and done.returncode != 0:
        raise KubectlError(f"`{' '.join(command)}` failed (exit {done.returncode}): {done.stderr.strip()}")
    return done


def apply(objects: list[dict[str, Any]], namespace: str, field_manager: str) -> None:
    listed = json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})
    kubectl("apply", "--server-side", f"--field-manager={field_manager}", "-n", namespace, "-f", "-", stdin=listed)


def get(kind: str, name: str, namespace: str) -> dict[str, Any] | None:
    """The object, or None when there is none."""
    done = kubectl("get", kind, name, "-n", namespace, "-o", "json", "--ignore-not-found")
    return json.loads(done.stdout) if done.stdout.strip() else None


def seconds_between(start: str | None, end: str | None) -> float | None:
    """Seconds between two of the API's timestamps (RFC 3339, UTC), None unless both are there."""
    if not (start and end):
        return None
    start_time, end_time = (datetime.datetime.fromisoformat(t.replace("Z", "+00:00")) for t in (start, end))
    return (end_time - start_time).total_seconds()
