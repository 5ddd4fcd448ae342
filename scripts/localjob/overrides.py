"""Command-line overrides applied to a copy of the manifests, so nobody edits YAML to change a run."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Sequence

from tfjob_manifest import tensorflow_container

from .manifests import ManifestError, Manifests, replica_specs


@dataclasses.dataclass(frozen=True)
class Overrides:
    workers: int | None = None
    dataset: str | None = None
    epochs: int | None = None
    trainer_flags: Sequence[str] = ()


def _set_flag(argv: list[str], flag: str, value: str) -> bool:
    """Replaces the value of every `--flag V` / `--flag=V` in argv; True if one was there."""
    found = False
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            argv[i + 1] = value
            found = True
        elif arg.startswith(flag + "="):
            argv[i] = f"{flag}={value}"
            found = True
    return found


def _override_setting(container: dict[str, Any], name: str, value: str) -> None:
    """Sets TRAINER_<NAME> as the last env entry (it wins over envFrom and earlier entries) and any explicit flag."""
    env_name = "TRAINER_" + name.upper().replace("-", "_")
    container["env"] = [e for e in container.get("env") or [] if e.get("name") != env_name]
    container["env"].append({"name": env_name, "value": value})
    for field in ("command", "args"):
        if container.get(field):
            container[field] = list(container[field])
            _set_flag(container[field], "--" + name, value)


def apply(manifests: Manifests, overrides: Overrides) -> Manifests:
    result = copy.deepcopy(manifests)
    specs = replica_specs(result.tfjob)
    if overrides.workers is not None:
        if "Worker" not in specs:
            raise ManifestError(f"--workers: TFJob {result.name} has no Worker replica spec to scale")
        has_chief = any(specs.get(t, {}).get("replicas", 1) for t in ("Chief", "Master") if t in specs)
        if overrides.workers < (0 if has_chief else 1):
            raise ManifestError(f"--workers must be at least {0 if has_chief else 1}, got {overrides.workers}")
        specs["Worker"]["replicas"] = overrides.workers
    for spec in specs.values():
        container = tensorflow_container(spec["template"])
        if overrides.dataset is not None:
            _override_setting(container, "dataset", overrides.dataset)
        if overrides.epochs is not None:
            _override_setting(container, "epochs", str(overrides.epochs))
        if overrides.trainer_flags:
            container["args"] = list(container.get("args") or []) + list(overrides.trainer_flags)
    if overrides.dataset is not None:
        for job in result.jobs:
            for container in job["spec"]["template"]["spec"]["containers"]:
                _override_setting(container, "dataset", overrides.dataset)
    return result
