"""A rendered overlay of k8s/: what the cluster runs, what submit creates and run-local runs from it.

`render()` runs the real renderer (`kubectl kustomize k8s/engines/<engine>/<strategy>`); `customize()` applies the
command line (image, worker count, dataset, epochs, trainer flags) to the rendered objects,
for `make submit` and `make run-local` alike, with each engine's part from its folder (`engine_module`).
"""

from __future__ import annotations

import copy
import functools
import pathlib
import shutil
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any

import yaml

from trainer.settings.options import ENV_PREFIX

from . import engine_folders, settings

K8S_DIR = engine_folders.ENGINES_DIR / engine_folders.DEFAULT / "sync"  # make's default: ENGINE=tfjob STRATEGY=sync
ENGINES = engine_folders.names()  # the engine folders this checkout holds
STRATEGIES = engine_folders.STRATEGIES
# The object that runs the training group, per engine; a TrainJob comes with the TrainingRuntime it names.
ENGINE_KINDS = engine_folders.kinds()
# The image's ENTRYPOINT (the Dockerfile's; tests/tools/test_run_local_manifest.py holds the two equal).
IMAGE_ENTRYPOINT = ("/usr/bin/tini", "-s", "--", "python", "-m", "trainer")
CHIEF_TYPES = ("Chief", "Master")

Manifest = dict[str, Any]


class ManifestError(RuntimeError):
    """The kustomization cannot be rendered or does not hold what submit and run-local need."""


def require_kubectl(why: str) -> None:
    """The one check that kubectl is installed; `why` says what it was needed for and what else to do."""
    if shutil.which("kubectl") is None:
        raise ManifestError(f"kubectl is not on PATH, so {why}: install it (https://kubernetes.io/docs/tasks/tools/)")


def render_text(k8s_dir: pathlib.Path = K8S_DIR) -> str:
    """The YAML `kubectl kustomize k8s_dir` prints, the renderer `kubectl apply -k` uses."""
    require_kubectl(f"{k8s_dir} cannot be rendered")
    if not (k8s_dir / "kustomization.yaml").exists():
        raise ManifestError(f"{k8s_dir}/kustomization.yaml does not exist: point at a kustomization directory")
    # settings.env overridden from the environment (make exports its values): a copy holds the overrides.
    with settings.kustomization(k8s_dir) as effective_dir:
        result = subprocess.run(["kubectl", "kustomize", str(effective_dir)], capture_output=True, text=True)
    if result.returncode != 0:
        raise ManifestError(f"kubectl kustomize {k8s_dir} failed:\n{result.stderr.strip()}")
    return result.stdout


def setting_env_name(name: str) -> str:
    """The trainer's variable for a flag: dataset -> TRAINER_DATASET, model-dir -> TRAINER_MODEL_DIR."""
    return ENV_PREFIX + name.upper().replace("-", "_")


def render(k8s_dir: pathlib.Path = K8S_DIR) -> list[Manifest]:
    """Every object `kubectl kustomize k8s_dir` renders, in its order; with SPREAD_OVER_NODES=0, no pod is spread
    over the nodes (k8s/base/trainer-pod.yaml's topologySpreadConstraints gone)."""
    objects = [doc for doc in yaml.safe_load_all(render_text(k8s_dir)) if doc]
    if settings.load().get("SPREAD_OVER_NODES") == "0":
        for obj in objects:
            for template in pod_templates(obj):
                template["spec"].pop("topologySpreadConstraints", None)
    return objects


def of_kind(objects: Iterable[Manifest], kind: str) -> list[Manifest]:
    return [obj for obj in objects if obj.get("kind") == kind]


def the_one(objects: Iterable[Manifest], kind: str, component: str | None = None) -> Manifest:
    """The single object of `kind` (and app.kubernetes.io/component label, if given)."""
    found = [
        obj
        for obj in of_kind(objects, kind)
        if component is None or obj["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
    ]
    if len(found) != 1:
        which = f"{kind}" + (f" with component {component}" if component else "")
        raise ManifestError(f"the manifests must hold exactly one {which}, found {len(found)}")
    return found[0]


def overlay(engine: str, strategy: str) -> pathlib.Path:
    """k8s/engines/<engine>/<strategy>: the one kustomization for an engine and a strategy."""
    if engine not in ENGINES:
        raise ManifestError(f"engine {engine!r} is unknown: use one of {', '.join(ENGINES)}")
    if strategy not in STRATEGIES:
        raise ManifestError(f"strategy {strategy!r} is unknown: use sync or async")
    return engine_folders.ENGINES_DIR / engine / strategy


def engine_of(objects: Iterable[Manifest]) -> str:
    """Which engine's object the rendered manifests hold (exactly one): tfjob, or an optional engine's name."""
    found = [obj for obj in objects if obj.get("kind") in ENGINE_KINDS]
    if len(found) != 1:
        kinds = ", ".join(obj["kind"] for obj in found) or "none"
        raise ManifestError(f"the manifests must hold exactly one {' or '.join(ENGINE_KINDS)}, found {kinds}")
    return ENGINE_KINDS[found[0]["kind"]]


# The generic kinds whose one pod template is spec.template; every engine's kinds are its customize.py's.
TEMPLATE_KINDS = ("Job", "Deployment")


@functools.cache
def _customize_parts() -> tuple[ModuleType, ...]:
    """Every engine folder's customize.py, the default's first."""
    return tuple(
        engine_folders.part(name, "customize") for name in ENGINES if engine_folders.has_part(name, "customize")
    )


def pod_templates(obj: Manifest) -> list[Manifest]:
    """The pod templates inside a Job or Deployment, or inside an engine's object (a TFJob, a JobSet, a Trainer v2
    runtime: the engine folder's customize.py whose POD_TEMPLATE_KINDS holds the kind says where they are)."""
    if obj["kind"] in TEMPLATE_KINDS:
        return [obj["spec"]["template"]]
    for part in _customize_parts():
        if obj["kind"] in part.POD_TEMPLATE_KINDS:
            return part.pod_templates(obj)
    return []


def trainer_of(template: Manifest) -> Manifest:
    """The trainer's container in an engine's pod template: the one named as an engine's customize.py's
    TRAINER_CONTAINER (`tensorflow`, `trainer`, `node`), else the first container (each engine's trainer-pod
    component copies the trainer's pod into the first)."""
    names = {part.TRAINER_CONTAINER for part in _customize_parts()}
    containers = template["spec"]["containers"]
    for container in containers:
        if container.get("name") in names:
            return container
    return containers[0]


def flag_arguments(argv: list[str], flag: str) -> Iterator[tuple[int, str]]:
    """Each `flag V` / `flag=V` in argv as (index, prefix), where argv[index] == prefix + V."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            yield i + 1, ""
        elif arg.startswith(flag + "="):
            yield i, flag + "="


DATA_PREPARATION = "trainer.data"  # the module the data Job runs: it reads the trainer's data settings


def _prepares_data(container: Manifest) -> bool:
    """A container that runs the data preparation, or otherwise names the trainer's --dataset or TRAINER_DATASET."""
    argv = list(container.get("command") or []) + list(container.get("args") or [])
    names = {entry.get("name") for entry in container.get("env") or []}
    return DATA_PREPARATION in argv or setting_env_name("dataset") in names or any(flag_arguments(argv, "--dataset"))


def _set_setting(container: Manifest, name: str, value: str) -> None:
    """Sets TRAINER_<NAME> (in place, else appended) and rewrites any explicit --name flag, so the value wins."""
    env_name = setting_env_name(name)
    entries = [entry for entry in container.setdefault("env", []) if entry.get("name") == env_name]
    for entry in entries:
        entry.pop("valueFrom", None)
        entry["value"] = value
    if not entries:
        container["env"].append({"name": env_name, "value": value})
    for field in ("command", "args"):
        if container.get(field):
            argv = container[field] = list(container[field])
            for index, prefix in flag_arguments(argv, "--" + name):
                argv[index] = prefix + value


def engine_module(kind: str, module: str) -> ModuleType:
    """One part of the engine folder whose kind this is (k8s/engines/<engine>/<module>.py)."""
    name = ENGINE_KINDS.get(kind)
    if name is None:
        raise ManifestError(f"{kind} is no engine's kind here: run one of {', '.join(ENGINE_KINDS)} (k8s/engines/)")
    return engine_folders.part(name, module)


def engine_part(objects: list[Manifest]) -> ModuleType:
    """The customize.py of the rendered job's engine folder (k8s/engines/<engine>/): which templates run the trainer,
    how the worker count scales it, what else carries the trainer's command line and the image."""
    return engine_folders.part(engine_of(objects), "customize")


def trainer_templates(objects: list[Manifest]) -> list[Manifest]:
    """Every pod template that runs the trainer (the TFJob's replicas, the JobSet's replicated jobs, ...)."""
    return engine_part(objects).trainer_templates(objects)


def customize(
    objects: list[Manifest],
    *,
    workers: int | None = None,
    dataset: str | None = None,
    epochs: int | None = None,
    trainer_args: Sequence[str] = (),
    image: str | None = None,
    dataset_options: Mapping[str, str] | None = None,
) -> list[Manifest]:
    """A copy of the rendered objects with the command line applied: the one override for submit and run-local.

    workers scales the workers as the engine's customize.py says (the TFJob's Worker replicas, the JobSet's worker
    Job, the TrainJob's numNodes); dataset and epochs become TRAINER_* variables (and replace explicit
    flags) in every trainer container (each TFJob replica's, each replicated job's), the dataset also in every
    other container that reads it (the data preparation), so both always agree; dataset_options (a flag's name
    without its dashes -> value, e.g. image-dir) go wherever the dataset goes, the same way; trainer_args are
    appended to every trainer container (a chief's too) and to the data preparation's (it checks the same files
    the trainer reads); image goes into every container.
    """
    if image is not None and not image:
        raise ManifestError("--image is empty; pass the image `make image` built, e.g. --image name:tag")
    result = copy.deepcopy(objects)
    engine = engine_part(result)
    if workers is not None:
        engine.scale(result, workers)
    trainers = [trainer_of(template) for template in trainer_templates(result)]
    trainers += engine.trainer_overrides(result)
    for trainer in trainers:
        if epochs is not None:
            _set_setting(trainer, "epochs", str(epochs))
        if trainer_args:
            trainer["args"] = list(trainer.get("args") or []) + list(trainer_args)
    if image is not None:
        engine.set_image(result, image)
    for obj in result:
        for template in pod_templates(obj):
            for container in template["spec"]["containers"]:
                if image is not None:
                    container["image"] = image
                is_trainer = any(container is t for t in trainers)
                if dataset is not None and (is_trainer or _prepares_data(container)):
                    _set_setting(container, "dataset", dataset)
                    for name, value in (dataset_options or {}).items():
                        _set_setting(container, name, value)
                if trainer_args and not is_trainer and _prepares_data(container):
                    # python -m trainer.data reads the trainer's flags: --train-files and the like reach it too.
                    container["args"] = list(container.get("args") or []) + list(trainer_args)
    return result


def trainer_config(args: Sequence[str], environ: dict[str, str]):
    """The trainer's settings for these arguments and variables, read by the trainer's own parser (flags over
    TRAINER_* over defaults), so a typo fails before anything runs."""
    from trainer.base.errors import ConfigError
    from trainer.context import parse_config

    try:
        return parse_config(list(args), environ=environ)
    except ConfigError as error:
        raise ManifestError(f"trainer flags: {error}") from None
    except SystemExit:
        raise ManifestError(
            f"trainer flags {list(args)} are not accepted by `python -m trainer` (see its --help)"
        ) from None
