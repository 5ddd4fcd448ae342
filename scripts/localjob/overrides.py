"""Command-line overrides applied to a copy of the manifests, so nobody edits YAML to change a run."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any, Iterator, Sequence

from tfjob_manifest import CHIEF_TYPES, tensorflow_container
from trainer.config import ENV_PREFIX

from .manifests import ManifestError, Manifests, replica_count, replica_specs


@dataclasses.dataclass(frozen=True)
class Overrides:
    workers: int | None = None
    dataset: str | None = None
    epochs: int | None = None
    trainer_flags: Sequence[str] = ()


def setting_env_name(name: str) -> str:
    """The trainer's variable for a flag: dataset -> TRAINER_DATASET, model-dir -> TRAINER_MODEL_DIR."""
    return ENV_PREFIX + name.upper().replace("-", "_")


def flag_arguments(argv: list[str], flag: str) -> Iterator[tuple[int, str]]:
    """Each `flag V` / `flag=V` in argv as (index, prefix), where argv[index] == prefix + V."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            yield i + 1, ""
        elif arg.startswith(flag + "="):
            yield i, flag + "="


def _override_setting(container: dict[str, Any], name: str, value: str) -> None:
    """Sets TRAINER_<NAME> as the last env entry (it wins over envFrom and earlier entries) and any explicit flag."""
    env_name = setting_env_name(name)
    container["env"] = [e for e in container.get("env") or [] if e.get("name") != env_name]
    container["env"].append({"name": env_name, "value": value})
    for field in ("command", "args"):
        if container.get(field):
            argv = container[field] = list(container[field])
            for index, prefix in flag_arguments(argv, "--" + name):
                argv[index] = prefix + value


def apply(manifests: Manifests, overrides: Overrides) -> Manifests:
    result = copy.deepcopy(manifests)
    specs = replica_specs(result.tfjob)
    if overrides.workers is not None:
        if "Worker" not in specs:
            raise ManifestError(f"--workers: TFJob {result.name} has no Worker replica spec to scale")
        has_chief = any(replica_count(specs[t]) for t in CHIEF_TYPES if t in specs)
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
