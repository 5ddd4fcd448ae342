"""`make tune-cluster`: the search space `make tune` reads, as a Katib Experiment whose trials are the project's job.

    python -m scripts.tune.cluster --search-space scripts/tune/search_space.yaml --study multi-worker-tune \\
        --kustomize k8s/engines/tfjob/sync --image IMG --workers 2 --dataset synthetic --epochs 3 -- ARGS

The search space is checked against the trainer's options as `make tune` checks it, then rendered into an Experiment
(Katib KATIB_VERSION, kubeflow.org/v1beta1) named after the study: its trials are the overlay's job, as its engine's
katib.py makes it (k8s/engines/<engine>/: the TFJob's and the TrainJob's), each under the trial's own name and model
dir (MODEL_ROOT/<trial>), its parameters in the trainer's flags. Katib's goptuna service suggests them (tpe or
random); the StdOut collector reads the chief's `<objective>=<value>` line. Its volume, settings, NetworkPolicy and
data are applied once, under the study's name. The command follows the Experiment, a line as each trial starts and
ends; at the end it prints the table of trials, publishes the best trial's model on the volume through model
selection (SELECTION_ROOT/JOB_NAME/serving, what make serve-cluster serves) and fetches it to ./artifacts/ (make
fetch-model). The same command again follows an Experiment already there instead of creating it; one made from
another search space is refused.

Where Katib cannot do what make tune does, the command says so and does the nearest thing: goptuna has no log
scale, so a log-scale range is searched as LOG_POINTS values per decade spread evenly on it; an int or stepped range
as its list of values; it has no grid (refused); Katib's early stopping service is not built, so trials are not
pruned (said). What Katib cannot run is refused: an engine with no katib.py (JobSet), the async shape, a word
`sh -c` would split
(docs/tuning.md says why).

Exit code: 0 the best model was published, 1 no trial succeeded or the Experiment failed, 2 the search space or
the flags cannot run on the cluster, 3 a cluster step failed (or the volume claim cannot serve the trials there,
refused before anything is created), 4 stopped following (Ctrl-C, --timeout) while the Experiment goes on.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import pathlib
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from scripts.common import engine_folders, manifest, volume_claim
from scripts.common import settings as project_settings
from scripts.common.kubectl import KubectlError, get, kubectl, seconds_between
from scripts.common.kubectl import apply as kube_apply
from scripts.common.pod_security import RESTRICTED_CONTAINER, RESTRICTED_POD
from scripts.common.volume_layout import model_dir, select_command
from trainer.base.errors import UserError

from . import arguments
from . import space as spaces
from .trial import error_line

EXIT_PUBLISHED, EXIT_NO_MODEL, EXIT_USAGE, EXIT_CLUSTER, EXIT_STILL_RUNNING = 0, 1, 2, 3, 4
GROUP, VERSION = "kubeflow.org", "v1beta1"
ALGORITHMS = {"tpe": "tpe", "random": "random"}  # the file's sampler -> the goptuna algorithm (katib-config.yaml)
LOG_POINTS = 4  # values per decade for a log-scale range, which goptuna cannot sample
MAX_LISTED = 1000  # values a stepped range may list
MADE_FROM = "distml/made-from"  # the annotation holding the digest of the Experiment's spec
TRIAL_NAME = "trial-name"  # the trial parameter that carries each trial's own name into its job
POLL_S = 5.0
FIELD_MANAGER = "tune-cluster"
DATA_TIMEOUT_S = 1800
SELECT_TIMEOUT_S = 600


class TuneClusterError(UserError):
    """The search space or the flags cannot run as a Katib Experiment; the message names the problem and the fix."""


class ClusterStepError(RuntimeError):
    """A step on the cluster failed (a Job, the Experiment); the message says which and where to look."""


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = arguments.study_parser("python -m scripts.tune.cluster", __doc__, "tune-cluster")
    parser.add_argument("--study", required=True, help="the Experiment's name (STUDY=); trials are <study>-<suffix>")
    parser.add_argument("--kustomize", required=True, help="the overlay each trial runs (ENGINE=)")
    parser.add_argument("--image", required=True, help="the image `make image` built")
    arguments.add_trial_shape(parser)
    parser.add_argument("--trials", type=int, help="trials in all (TRIALS=; default: the file's)")
    parser.add_argument("--parallel", type=int, help="trials at once (PARALLEL=; default: the file's)")
    parser.add_argument("--timeout", type=float, default=0, help="stop following after this many seconds (0: never)")
    parser.add_argument("--no-fetch", action="store_true", help="publish on the volume, but fetch nothing")
    parser.add_argument(
        "--replace", action="store_true", help="publish the best even where the published model is as good (REPLACE=)"
    )
    parser.add_argument("--dry-run", action="store_true", help="print the Experiment (JSON) and exit")
    args = arguments.parse(parser, argv)
    if not re.fullmatch(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", args.study):
        parser.error(
            f"STUDY={args.study}: Katib names the Experiment and each trial's job after it (<study>-<8 letters>), so "
            f"it must be at most 40 lower-case letters, digits and '-', starting with a letter"
        )
    return args


def katib_parameter(parameter: spaces.Parameter) -> dict[str, Any]:
    """One parameter as Katib's Experiment declares it; a log-scale range becomes its log-spaced values."""
    if parameter.kind == "categorical":
        if any(isinstance(value, bool) for value in parameter.values):
            raise TuneClusterError(
                f"{parameter.name}: Katib passes a value as text, and a true/false switch is a flag of its own "
                f"(--{parameter.name} / --no-{parameter.name}); search it with make tune, or set it in ARGS"
            )
        return {
            "name": parameter.name,
            "parameterType": "categorical",
            "feasibleSpace": {"list": [text(value) for value in parameter.values]},
        }
    if parameter.log:
        return {
            "name": parameter.name,
            "parameterType": "discrete",
            "feasibleSpace": {"list": [text(value) for value in log_points(parameter)]},
        }
    assert parameter.low is not None and parameter.high is not None, "a range has both ends"
    if parameter.kind == "float" and parameter.step is None:
        return {
            "name": parameter.name,
            "parameterType": "double",
            "feasibleSpace": {"min": text(float(parameter.low)), "max": text(float(parameter.high))},
        }
    # goptuna's random search never draws an int range's top and its TPE can step past it: every value, listed.
    values = step_points(parameter)
    if len(values) > MAX_LISTED:
        raise TuneClusterError(
            f"{parameter.name}: {len(values)} values from {text(parameter.low)} to {text(parameter.high)}; Katib "
            f"searches a stepped range as its list of values, at most {MAX_LISTED}: give it a larger step"
        )
    return {"name": parameter.name, "parameterType": "discrete", "feasibleSpace": {"list": [text(v) for v in values]}}


def step_points(parameter: spaces.Parameter) -> list[float] | list[int]:
    """Every value of a stepped or int range, both ends included where the step reaches the top (as Optuna does)."""
    assert parameter.low is not None and parameter.high is not None, "a range has both ends"
    step = parameter.step or 1
    count = math.floor((parameter.high - parameter.low) / step + 1e-9) + 1
    if parameter.kind == "int":
        return [int(parameter.low) + i * int(step) for i in range(count)]
    return [round(parameter.low + i * step, 12) for i in range(count)]


def log_points(parameter: spaces.Parameter) -> list[float] | list[int]:
    """The range's values spread evenly on the log scale, LOG_POINTS per decade, both ends included."""
    assert parameter.low is not None and parameter.high is not None, "a range has both ends"
    low, high = float(parameter.low), float(parameter.high)
    count = max(2, math.ceil(LOG_POINTS * math.log10(high / low)) + 1)
    inner = [low * (high / low) ** (i / (count - 1)) for i in range(1, count - 1)]
    if parameter.kind == "int":
        return sorted({round(value) for value in [low, *inner, high]})
    return [low, *(float(f"{value:.3g}") for value in inner), high]


def text(value: int | float | str) -> str:
    """A value as Katib carries it: text the trainer's parser reads back to the same number."""
    return repr(value) if isinstance(value, float) else str(value)


def algorithm(space: spaces.SearchSpace) -> dict[str, Any]:
    if space.sampler not in ALGORITHMS:
        raise TuneClusterError(
            f"search space {space.path}: sampler {space.sampler}: Katib's goptuna service has no grid search; "
            f"use sampler: tpe or random on the cluster, or make tune for a grid"
        )
    settings = [] if space.seed is None else [{"name": "random_state", "value": str(space.seed)}]
    return {"algorithmName": ALGORITHMS[space.sampler], "algorithmSettings": settings}


def placeholder(name: str) -> str:
    return f"${{trialParameters.{name}}}"


def trial_flags(space: spaces.SearchSpace) -> list[str]:
    """The searched flags with Katib's placeholders for their values."""
    return [part for parameter in space.parameters for part in (f"--{parameter.name}", placeholder(parameter.name))]


def per_trial_env(settings: Mapping[str, str]) -> list[dict[str, str]]:
    """Each trial is a job of its own name, with its own model dir on the volume (k8s/base/trainer-pod.yaml's)."""
    return [
        {"name": "JOB_NAME", "value": placeholder(TRIAL_NAME)},
        {"name": "TRAINER_MODEL_DIR", "value": model_dir(settings, placeholder(TRIAL_NAME))},
    ]


def katib_part(objects: list[dict[str, Any]]) -> ModuleType:
    """The katib.py of the overlay's engine folder (k8s/engines/<engine>/): a job Katib can run as a trial and read
    its chief; TuneClusterError where it cannot (an engine without one, the async shape)."""
    engine = manifest.engine_of(objects)
    if not engine_folders.has_part(engine, "katib"):
        takes = [name for name in manifest.ENGINES if engine_folders.has_part(name, "katib")]
        kinds = " and ".join(kind for kind, name in manifest.ENGINE_KINDS.items() if name in takes)
        raise TuneClusterError(
            f"ENGINE={engine}: Katib {project_settings.load().get('KATIB_VERSION', '')} takes {kinds} trials "
            f"(katib-config's trialResources); use " + " or ".join(f"ENGINE={name}" for name in takes)
        )
    part = engine_folders.part(engine, "katib")
    if part.asynchronous(objects):
        raise TuneClusterError(
            "STRATEGY=async: a trial's chief and parameter servers are other replicas than the workers Katib's "
            "collector and the searched flags reach; tune with STRATEGY=sync (the default)"
        )
    return part


# Katib's collector runs the chief's command as `sh -c "<command and args joined by spaces> 1>...": a word the shell
# would split or read must not reach it (the other replicas are not wrapped, so quoting would reach them literally).
def check_words(body: dict[str, Any], part: ModuleType) -> None:
    template = body["spec"]["trialTemplate"]
    words = part.command_words(template["trialSpec"], template["primaryContainerName"])
    values = [value for p in body["spec"]["parameters"] for value in p["feasibleSpace"].get("list", [])]
    for word in [*words, *values]:
        if shlex.quote(word) != word and not re.fullmatch(r"\$\{trialParameters\.[\w-]+\}", word):
            raise TuneClusterError(
                f"{word!r} in the trainer's flags or the searched values: Katib runs the chief's command through "
                f"`sh -c` with its words joined by spaces, so a space or a shell character (;&|$<>'\"*? and the like) "
                f"would split it or run; rename the path or value, or tune with make tune"
            )


def trial_spec(
    objects: list[dict[str, Any]], part: ModuleType, space: spaces.SearchSpace, settings: Mapping[str, str]
) -> dict[str, Any]:
    """The job one trial runs: the rendered job, with the searched flags, the trial's name and model dir, and the
    image's entrypoint as its command (the engine's katib.py says where)."""
    job = part.trial_spec(objects, trial_flags(space), per_trial_env(settings))
    job["metadata"] = {"labels": job["metadata"].get("labels", {})}  # Katib names it after the trial
    return job


def experiment(
    name: str, namespace: str, space: spaces.SearchSpace, part: ModuleType, spec: dict[str, Any]
) -> dict[str, Any]:
    container, primary_labels = part.PRIMARY_CONTAINER, part.PRIMARY_LABELS
    parameters = [katib_parameter(parameter) for parameter in space.parameters]
    body: dict[str, Any] = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Experiment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "objective": {
                "type": space.direction,
                "objectiveMetricName": space.objective.key,
            },
            "algorithm": algorithm(space),
            "parallelTrialCount": space.parallel,
            "maxTrialCount": space.trials,
            # A failed trial (a diverging learning rate's exit 4) is recorded and never chosen; the search goes on.
            "maxFailedTrialCount": space.trials,
            "metricsCollectorSpec": {"collector": {"kind": "StdOut"}},
            "parameters": parameters,
            "trialTemplate": {
                "primaryContainerName": container,
                "primaryPodLabels": primary_labels,
                # A trial's job stays after it ends, as make submit's does: its pods say why it failed.
                "retain": True,
                "trialParameters": [
                    *({"name": p["name"], "reference": p["name"]} for p in parameters),
                    {"name": TRIAL_NAME, "reference": "${trialSpec.Name}"},
                ],
                "trialSpec": spec,
            },
        },
    }
    # What the Experiment was made from: the same command again follows it only if it would make the same one.
    made_from = hashlib.sha256(json.dumps(body["spec"], sort_keys=True).encode()).hexdigest()[:16]
    body["metadata"]["annotations"] = {MADE_FROM: made_from}
    return body


def say(line: str) -> None:
    print(f"tune-cluster: {line}", flush=True)


def prepare(objects: list[dict[str, Any]], namespace: str) -> None:
    """What every trial shares, applied once: the volume, the settings, the NetworkPolicies, a TrainJob's runtime,
    and the dataset on the volume (the data Job, run to its end). The namespace gets Katib's collector. First of all,
    the claim is checked against the cluster, as make submit checks it: each trial spreads its pods as the job does."""
    volume_claim.check(objects, namespace)
    kubectl("label", "namespace", namespace, "katib.kubeflow.org/metrics-collector-injection=enabled", "--overwrite")
    shared = ("NetworkPolicy", "ConfigMap", "PersistentVolumeClaim", *katib_part(objects).SHARED_KINDS)
    kube_apply([obj for obj in objects if obj["kind"] in shared], namespace, FIELD_MANAGER)
    data = manifest.the_one(objects, "Job")
    name = data["metadata"]["name"]
    # A Job's pod template cannot change: an earlier run's goes first (it exits at once when the data is there).
    kubectl("delete", "job", name, "-n", namespace, "--ignore-not-found", "--cascade=foreground", "--wait=true")
    kube_apply([data], namespace, FIELD_MANAGER)
    say(f"preparing the data (Job {name})")
    deadline = time.monotonic() + DATA_TIMEOUT_S
    while time.monotonic() < deadline:
        status = (get("job", name, namespace) or {}).get("status", {})
        if status.get("succeeded"):
            return
        if status.get("failed", 0) > data["spec"].get("backoffLimit", 6):
            logs = kubectl("logs", f"job/{name}", "-n", namespace, "--tail=20", check=False).stdout
            raise ClusterStepError(f"the data Job {name} failed; its last lines:\n{logs}")
        time.sleep(POLL_S)
    raise ClusterStepError(f"the data Job {name} did not finish in {DATA_TIMEOUT_S} s: kubectl logs job/{name}")


def start(body: dict[str, Any], objects: list[dict[str, Any]], namespace: str) -> bool:
    """Prepares what the trials share and creates the Experiment; or, when the same command made it before, leaves
    it to be followed. One made from anything else is refused: its trials would not be this search's. True once the
    Experiment is there."""
    name = body["metadata"]["name"]
    existing = get("experiment", name, namespace)
    if existing is None:
        prepare(objects, namespace)
        kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(body))
        spec = body["spec"]
        say(
            f"created Experiment {name}: {spec['maxTrialCount']} trials, {spec['parallelTrialCount']} at once, "
            f"{spec['algorithm']['algorithmName']}"
        )
        return True
    if existing["metadata"].get("annotations", {}).get(MADE_FROM) != body["metadata"]["annotations"][MADE_FROM]:
        raise TuneClusterError(
            f"Experiment {name} already exists, made from another search space, trial budget or job (ENGINE, "
            f"DATASET, EPOCHS, ARGS, the image); pick another STUDY=, or delete it first: "
            f"kubectl delete experiment {name} -n {namespace}"
        )
    say(f"Experiment {name} exists: following it")
    return True


def condition(obj: dict[str, Any]) -> str | None:
    """The object's latest condition that holds (Katib appends them in order)."""
    held = [c for c in obj.get("status", {}).get("conditions") or [] if c.get("status") == "True"]
    return held[-1]["type"] if held else None


@dataclasses.dataclass
class TrialView:
    name: str
    params: dict[str, str]
    state: str
    objective: float | None
    seconds: float | None
    reason: str

    @classmethod
    def of(cls, trial: dict[str, Any], objective: str) -> TrialView:
        status = trial.get("status", {})
        params = {a["name"]: a["value"] for a in trial["spec"].get("parameterAssignments") or []}
        metrics = {m["name"]: m for m in (status.get("observation") or {}).get("metrics") or []}
        value = metrics.get(objective, {}).get("latest")
        held = [c for c in status.get("conditions") or [] if c.get("status") == "True"]
        return cls(
            name=trial["metadata"]["name"],
            params=params,
            state=held[-1]["type"] if held else "Pending",
            objective=float(value) if value not in (None, "unavailable") else None,
            seconds=seconds_between(status.get("startTime"), status.get("completionTime")),
            reason=held[-1].get("message", "") if held else "",
        )

    def shown_params(self) -> str:
        return " ".join(f"{name}={value}" for name, value in self.params.items())


def trials_of(name: str, namespace: str, objective: str) -> list[TrialView]:
    listed = kubectl("get", "trials", "-n", namespace, "-l", f"katib.kubeflow.org/experiment={name}", "-o", "json")
    items = sorted(json.loads(listed.stdout)["items"], key=lambda t: t["metadata"]["creationTimestamp"])
    return [TrialView.of(trial, objective) for trial in items]


def exit_reason(trial: str, part: ModuleType, namespace: str) -> str:
    """Why a trial's job failed, from its pods' trainer containers: the exit code and the error line of the
    termination message (the trainer's own line, which it writes there; else the kubelet's fallback, the last log
    lines). A replica the trainer ended outranks one the engine stopped after it."""
    listed = kubectl("get", "pods", "-n", namespace, "-o", "json", "-l", f"{part.POD_LABEL}={trial}", check=False)
    reasons = []
    for pod in json.loads(listed.stdout or '{"items": []}')["items"]:
        for status in pod.get("status", {}).get("containerStatuses") or []:
            terminated = status.get("state", {}).get("terminated") or status.get("lastState", {}).get("terminated")
            if status["name"] != part.PRIMARY_CONTAINER or not terminated or not terminated.get("exitCode"):
                continue
            line = error_line(terminated.get("message") or "")
            reasons.append(
                (line.startswith("error:"), f"exit {terminated['exitCode']}" + (f": {line}" if line else ""))
            )
    return max(reasons, key=lambda reason: (reason[0], len(reason[1])), default=(False, ""))[1]


def follow(
    name: str, part: ModuleType, namespace: str, objective: str, timeout_s: float
) -> tuple[dict[str, Any], list[TrialView]]:
    """Prints each trial as it starts and ends until the Experiment ends; returns it and its trials."""
    seen: dict[str, str] = {}
    started = time.monotonic()
    while True:
        experiment_now = get("experiment", name, namespace)
        if experiment_now is None:
            raise ClusterStepError(f"Experiment {name} is gone (deleted while it was followed)")
        views = trials_of(name, namespace, objective)
        for view in views:
            if seen.get(view.name) == view.state:
                continue
            seen[view.name] = view.state
            line = f"trial {view.name} ({view.shown_params()}): {view.state.lower()}"
            if view.state == "Succeeded" and view.objective is not None:
                line += f", {objective} {view.objective:.4g}" + (f" in {view.seconds:.0f} s" if view.seconds else "")
            elif view.state in ("Failed", "MetricsUnavailable"):
                view.reason = " ".join(filter(None, [view.reason, exit_reason(view.name, part, namespace)]))
                line += f": {view.reason}"
            say(line)
        if condition(experiment_now) in ("Succeeded", "Failed"):
            return experiment_now, views
        if timeout_s and time.monotonic() - started > timeout_s:
            raise TimeoutError(f"stopped following after {timeout_s:.0f} s")
        time.sleep(POLL_S)


def table(views: list[TrialView], objective: str) -> str:
    names = sorted({name for view in views for name in view.params})
    header = ["trial", *names, objective, "state", "seconds"]
    rows = [
        [
            view.name,
            *(view.params.get(n, "") for n in names),
            "" if view.objective is None else f"{view.objective:.4g}",
            view.state,
            "" if view.seconds is None else f"{view.seconds:.0f}",
        ]
        for view in views
    ]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)) for row in [header, *rows]
    )


def select_job(best: str, image: str, settings: Mapping[str, str], replace: bool = False) -> dict[str, Any]:
    """Model selection over the best trial's model dir, publishing where make serve-cluster serves from (unless the
    model published there is as good, or replace); as restricted as the job's own pods."""
    container = {
        "name": "select",
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": select_command(settings, [best], replace),
        "securityContext": RESTRICTED_CONTAINER,
        "resources": {"requests": {"cpu": settings["SERVE_CPU_REQUEST"], "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        "volumeMounts": [{"name": "volume", "mountPath": settings["MOUNT_PATH"]}, {"name": "tmp", "mountPath": "/tmp"}],
    }
    volumes = [
        {"name": "volume", "persistentVolumeClaim": {"claimName": settings["VOLUME_CLAIM"]}},
        {"name": "tmp", "emptyDir": {}},
    ]
    pod = {"restartPolicy": "Never", "automountServiceAccountToken": False, "securityContext": RESTRICTED_POD,
           "containers": [container], "volumes": volumes}  # fmt: skip
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": f"{best}-publish", "labels": {"app.kubernetes.io/part-of": "tf-multiworker-trainer"}},
        "spec": {"backoffLimit": 0, "ttlSecondsAfterFinished": 3600, "template": {"spec": pod}},
    }


def publish(best: str, image: str, settings: Mapping[str, str], namespace: str, replace: bool) -> None:
    job = select_job(best, image, settings, replace)
    name = job["metadata"]["name"]
    kubectl("delete", "job", name, "-n", namespace, "--ignore-not-found", "--wait=true")
    kube_apply([job], namespace, FIELD_MANAGER)
    deadline = time.monotonic() + SELECT_TIMEOUT_S
    while time.monotonic() < deadline:
        status = (get("job", name, namespace) or {}).get("status", {})
        if status.get("succeeded") or status.get("failed"):
            print(kubectl("logs", f"job/{name}", "-n", namespace, check=False).stdout, end="", flush=True)
            if status.get("failed"):
                raise ClusterStepError(f"model selection refused to publish trial {best}'s model (its lines above)")
            return
        time.sleep(POLL_S)
    raise ClusterStepError(f"model selection (Job {name}) did not finish in {SELECT_TIMEOUT_S} s")


def fetch(best: str, image: str) -> None:
    """The best trial's model to ./artifacts/, as make fetch-model copies a job's."""
    script = project_settings.ROOT / "scripts" / "cluster" / "fetch-model.sh"
    subprocess.run([str(script)], env={**os.environ, "JOB_NAME": best, "IMAGE": image}, check=True)


def build(args: argparse.Namespace, settings: Mapping[str, str]) -> tuple[spaces.SearchSpace, list, str, dict]:
    """The search space, the rendered objects, the engine's katib.py and the Experiment, each checked before any
    cluster call (TuneClusterError and the space's SpaceError name the problem and the fix)."""
    every_trial = [*arguments.dataset_flags(args), "--epochs", str(args.epochs)]
    space = spaces.load(args.search_space, [*args.trainer_flags, *every_trial])
    trials = args.trials or space.trials
    parallel = min(args.parallel or space.parallel, trials)  # Katib refuses more at once than in all
    space = dataclasses.replace(space, trials=trials, parallel=parallel)
    objects = manifest.customize(
        render(args.kustomize, args.study),
        image=args.image,
        workers=args.workers,
        dataset=args.dataset,
        epochs=args.epochs,
        trainer_args=args.trainer_flags,
    )
    part = katib_part(objects)
    spec = trial_spec(objects, part, space, settings)
    body = experiment(args.study, settings["NAMESPACE"], space, part, spec)
    check_words(body, part)
    return space, objects, part, body


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        settings = project_settings.load()
        space, objects, part, body = build(args, settings)
    except (UserError, manifest.ManifestError, project_settings.SettingsError) as error:
        print(f"tune-cluster: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        print(json.dumps(body, indent=2))
        return EXIT_PUBLISHED
    for parameter, declared in zip(space.parameters, body["spec"]["parameters"], strict=True):
        if parameter.log:
            values = declared["feasibleSpace"]["list"]
            say(
                f"{parameter.name}: Katib's goptuna has no log scale, so it searches {len(values)} values spread "
                f"evenly on it: {', '.join(values)}"
            )
    if space.prune:
        say(
            "trials are not pruned on the cluster (Katib's early stopping service is not installed): each runs "
            f"its {args.epochs} epoch(s)"
        )
    namespace, started = settings["NAMESPACE"], False
    try:
        started = start(body, objects, namespace)
        final, views = follow(args.study, part, namespace, space.objective.key, args.timeout)
        print(table(views, space.objective.key), flush=True)
        best = (final.get("status", {}).get("currentOptimalTrial") or {}).get("bestTrialName")
        if condition(final) != "Succeeded" or not best:
            reason = next((c.get("message", "") for c in reversed(final.get("status", {}).get("conditions") or [])), "")
            say(f"no trial succeeded, so nothing is published ({condition(final)}: {reason})")
            return EXIT_NO_MODEL
        winner = next(view for view in views if view.name == best)
        say(f"best: trial {best} ({winner.shown_params()}), {space.objective.key} {winner.objective:.4g}")
        publish(best, args.image, settings, namespace, args.replace)
        if not args.no_fetch:
            fetch(best, args.image)
    except (KeyboardInterrupt, TimeoutError) as stopped:
        why = str(stopped) or "stopped"
        if not started:
            say(f"{why} before Experiment {args.study} was created: nothing of the search runs in the cluster")
            return EXIT_STILL_RUNNING
        say(
            f"{why}; Experiment {args.study} goes on in the cluster: the same command follows it and publishes its best"
        )
        return EXIT_STILL_RUNNING
    except TuneClusterError as error:
        print(f"tune-cluster: error: {error}", file=sys.stderr)
        return EXIT_USAGE
    except (ClusterStepError, volume_claim.VolumeClaimError, KubectlError, subprocess.CalledProcessError) as error:
        print(f"tune-cluster: error: {error}", file=sys.stderr)
        return EXIT_CLUSTER
    say(f"published trial {best}'s model on the volume: make serve-cluster serves it")
    return EXIT_PUBLISHED


def render(kustomization: str, study: str) -> list[dict[str, Any]]:
    """The overlay rendered under the study's name: the objects every trial shares are named after it."""

    previous = os.environ.get("JOB_NAME")
    os.environ["JOB_NAME"] = study
    try:
        return manifest.render(pathlib.Path(kustomization))
    finally:
        if previous is None:
            os.environ.pop("JOB_NAME", None)
        else:
            os.environ["JOB_NAME"] = previous


if __name__ == "__main__":
    sys.exit(main())
