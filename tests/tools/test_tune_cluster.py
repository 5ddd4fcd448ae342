"""make tune-cluster's Experiment (scripts/tune/cluster.py), rendered offline with --dry-run: the search space the
local tuner reads becomes Katib's parameters, each trial is the project's TFJob or TrainJob under its own name and
model dir with the searched flags, and what Katib cannot search is refused or said; a claim the trials cannot share
is refused before anything is made. The real Katib runs it in scripts/node/tests/test_tuning.py."""

from __future__ import annotations

import importlib
import json
import math
import pathlib
import re
import subprocess

import pytest

import claim_cluster
from k8s.engines.tfjob import customize as tfjob_customize
from scripts.common import kubectl as project_kubectl
from scripts.common import manifest
from scripts.common.settings import ROOT, load
from scripts.tune import cluster
from scripts.tune import space as spaces

EXAMPLE = ROOT / "scripts" / "tune" / "search_space.yaml"
PLACEHOLDER = re.compile(r"\$\{trialParameters\.(.+?)\}")  # Katib's TrialTemplateParamReplaceFormatRegex
# The trial kinds Katib takes whose engine folder this checkout holds.
OVERLAYS = {
    kind: overlay
    for kind, overlay in {"TFJob": "k8s/engines/tfjob/sync", "TrainJob": "k8s/engines/trainjob/sync"}.items()
    if kind in manifest.ENGINE_KINDS
}


def tool_argv(space: pathlib.Path = EXAMPLE, kind: str = "TFJob") -> list[str]:
    """make tune-cluster's arguments for the study tune-x."""
    return ["--search-space", str(space), "--study", "tune-x", "--kustomize", OVERLAYS[kind], "--image", "img:1",
            "--dataset", "synthetic", "--epochs", "2"]  # fmt: skip


def dry_run(capsys, *extra: str, space: pathlib.Path = EXAMPLE, kind: str = "TFJob") -> tuple[int, str, str]:
    code = cluster.main([*tool_argv(space, kind), "--dry-run", *extra])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("kind", sorted(OVERLAYS))
def test_each_trial_is_the_project_s_job_with_the_searched_flags_its_own_name_and_model_dir(capsys, kind):
    code, out, err = dry_run(capsys, "--", "--train-examples", "1024", kind=kind)
    assert code == 0, err
    experiment = json.loads(out)
    spec = experiment["spec"]
    template = spec["trialTemplate"]
    assert spec["objective"] == {"type": "maximize", "objectiveMetricName": "test_accuracy"}
    assert spec["algorithm"] == {"algorithmName": "tpe", "algorithmSettings": [{"name": "random_state", "value": "0"}]}
    assert (spec["maxTrialCount"], spec["parallelTrialCount"]) == (8, 1)
    assert spec["metricsCollectorSpec"] == {"collector": {"kind": "StdOut"}}
    assert template["trialSpec"]["kind"] == kind and "name" not in template["trialSpec"]["metadata"]

    # Katib refuses a trial parameter its template does not use, and a placeholder it does not declare.
    declared = {parameter["name"] for parameter in template["trialParameters"]}
    used = set(PLACEHOLDER.findall(json.dumps(template["trialSpec"])))
    assert used == declared == {"learning-rate", "model", "warmup-steps", cluster.TRIAL_NAME}

    settings = load()
    if kind == "TFJob":
        containers = [
            container
            for replica in template["trialSpec"]["spec"]["tfReplicaSpecs"].values()
            for container in replica["template"]["spec"]["containers"]
        ]
        assert [c["name"] for c in containers] == [template["primaryContainerName"]]
        (trainer,) = containers
        command, args, env = trainer["command"], trainer["args"], trainer["env"]
    else:
        trainer = template["trialSpec"]["spec"]["trainer"]
        command, args, env = trainer["command"], trainer["args"], trainer["env"]
        # The primary pod is what our runtime names its replicated job and container.
        objects = cluster.render(OVERLAYS[kind], "tune-x")
        runtime = next(obj for obj in objects if obj["kind"] == "TrainingRuntime")
        (replicated,) = runtime["spec"]["template"]["spec"]["replicatedJobs"]
        labels = template["primaryPodLabels"]
        assert labels["jobset.sigs.k8s.io/replicatedjob-name"] == replicated["name"]
        containers = replicated["template"]["spec"]["template"]["spec"]["containers"]
        assert template["primaryContainerName"] in [c["name"] for c in containers]
    assert command == list(manifest.IMAGE_ENTRYPOINT)  # Katib would look it up in a registry otherwise
    assert args[-6:] == [
        "--learning-rate",
        "${trialParameters.learning-rate}",
        "--model",
        "${trialParameters.model}",
        "--warmup-steps",
        "${trialParameters.warmup-steps}",
    ]
    assert "--train-examples" in args
    # Katib's collector joins the chief's command into `sh -c "..."`: no word may need quoting.
    assert all(re.fullmatch(r"[\w${}.:/=+-]+", word) for word in [*command, *args]), args
    named = {entry["name"]: entry.get("value") for entry in env}
    assert named["JOB_NAME"] == "${trialParameters.trial-name}"
    assert named["TRAINER_MODEL_DIR"] == f"{settings['MODEL_ROOT']}/${{trialParameters.trial-name}}"


def test_a_log_scale_range_is_searched_as_values_spread_evenly_on_it(capsys):
    code, out, _ = dry_run(capsys)
    assert code == 0
    (rate,) = [p for p in json.loads(out)["spec"]["parameters"] if p["name"] == "learning-rate"]
    values = [float(value) for value in rate["feasibleSpace"]["list"]]
    assert rate["parameterType"] == "discrete" and values[0] == 3e-4 and values[-1] == 1e-2
    steps = [math.log10(b / a) for a, b in zip(values, values[1:], strict=False)]
    assert len(values) >= cluster.LOG_POINTS * math.log10(1e-2 / 3e-4) and max(steps) - min(steps) < 0.01
    assert cluster.log_points(spaces.Parameter("filters", "int", 1, 1000, log=True)) == [
        1, 2, 3, 6, 10, 18, 32, 56, 100, 178, 316, 562, 1000
    ]  # fmt: skip
    # goptuna's random search never draws an int range's top, and its TPE steps past it: every value is listed.
    (warmup,) = [p for p in json.loads(out)["spec"]["parameters"] if p["name"] == "warmup-steps"]
    assert warmup == {
        "name": "warmup-steps",
        "parameterType": "discrete",
        "feasibleSpace": {"list": ["0", "16", "32", "48", "64"]},
    }
    assert cluster.step_points(spaces.Parameter("clip-norm", "float", 0.5, 2.0, step=0.5)) == [0.5, 1.0, 1.5, 2.0]
    assert cluster.step_points(spaces.Parameter("warmup-steps", "int", 0, 10, step=4)) == [0, 4, 8]


def test_the_log_scale_note_names_the_values(capsys, tmp_path, monkeypatch):
    """Said before anything is submitted: the Experiment is not created here (no cluster), so the command stops at
    the first cluster call, after the notes."""
    monkeypatch.setattr(cluster, "start", lambda *_: (_ for _ in ()).throw(cluster.ClusterStepError("no cluster")))
    argv = ["--search-space", str(EXAMPLE), "--study", "tune-x", "--kustomize", OVERLAYS["TFJob"], "--image", "i:1"]
    code = cluster.main([*argv, "--dataset", "synthetic", "--epochs", "2"])
    out, err = capsys.readouterr()
    assert code == cluster.EXIT_CLUSTER and "no cluster" in err
    assert "learning-rate: Katib's goptuna has no log scale, so it searches 8 values spread evenly on it" in out
    assert "trials are not pruned on the cluster" in out


@pytest.mark.parametrize(
    ("head", "parameters", "complaint"),
    [
        ("sampler: grid\n", "model: {type: categorical, values: [cnn, dropout]}", "has no grid search; use sampler"),
        (
            "",
            "scale-learning-rate: {type: categorical, values: [true, false]}",
            "a true/false switch is a flag of its own",
        ),
        ("", "learning-rat: {type: float, min: 0.001, max: 0.1}", "learning-rat is not an option of the trainer"),
        ("", "data-dir: {type: categorical, values: ['/data/a', '/data/my data']}", "'/data/my data' in the trainer's"),
        ("", "warmup-steps: {type: int, min: 0, max: 100000}", "at most 1000: give it a larger step"),
    ],
)
def test_what_katib_cannot_search_is_exit_2_naming_it_and_the_fix(capsys, tmp_path, head, parameters, complaint):
    path = tmp_path / "space.yaml"
    path.write_text(f"{head}parameters:\n  {parameters}\n")
    code, _, err = dry_run(capsys, space=path)
    assert code == cluster.EXIT_USAGE and complaint in err, err


def test_the_same_command_follows_its_experiment_and_another_is_refused(capsys, monkeypatch):
    code, out, _ = dry_run(capsys)
    body = json.loads(out)
    prepared = []
    monkeypatch.setattr(cluster, "prepare", lambda *args: prepared.append(args))
    monkeypatch.setattr(cluster, "get", lambda *_: body)
    cluster.start(body, [], "default")
    assert "Experiment tune-x exists: following it" in capsys.readouterr().out and not prepared
    changed = json.loads(json.dumps(body))
    changed["metadata"]["annotations"][cluster.MADE_FROM] = "another"
    monkeypatch.setattr(cluster, "get", lambda *_: changed)
    with pytest.raises(cluster.TuneClusterError, match="kubectl delete experiment tune-x -n default"):
        cluster.start(body, [], "default")
    code, other, _ = dry_run(capsys, "--", "--train-examples", "2048")
    assert json.loads(other)["metadata"]["annotations"] != body["metadata"]["annotations"]


@pytest.mark.parametrize(
    ("overlay", "complaint"),
    [
        (overlay, complaint)
        for overlay, complaint in (
            ("k8s/engines/jobset/sync", f"ENGINE=jobset: Katib v0.19.0 takes {' and '.join(OVERLAYS)} trials"),
            ("k8s/engines/tfjob/async", "STRATEGY=async"),
            ("k8s/engines/trainjob/async", "STRATEGY=async"),
        )
        if overlay.split("/")[2] in manifest.ENGINES
    ],
)
def test_an_engine_or_strategy_katib_cannot_run_as_trials_is_refused(capsys, monkeypatch, overlay, complaint):
    monkeypatch.setitem(OVERLAYS, "other", overlay)
    code, _, err = dry_run(capsys, kind="other")
    assert code == cluster.EXIT_USAGE and complaint in err, err


@pytest.mark.parametrize("words", [["--data-dir", "/mnt/training/my data"], ["--class-names", "cat;dog"]])
def test_flags_the_shell_would_split_or_run_are_refused_before_anything_is_made(capsys, words):
    code, _, err = dry_run(capsys, "--", *words)
    assert code == cluster.EXIT_USAGE and f"{words[1]!r} in the trainer's flags" in err and "sh -c" in err, err


def test_more_trials_at_once_than_in_all_is_the_budget(capsys):
    code, out, _ = dry_run(capsys, "--trials", "2", "--parallel", "4")
    spec = json.loads(out)["spec"]
    assert code == 0 and (spec["maxTrialCount"], spec["parallelTrialCount"]) == (2, 2)


@pytest.mark.parametrize("study", ["1tune", "Tune_X", "tune-", "x" * 41])
def test_a_study_katib_could_not_name_an_experiment_after_is_refused(capsys, study):
    with pytest.raises(SystemExit) as exited:
        cluster.parse_args(["--search-space", "s", "--study", study, "--kustomize", "k", "--image", "i:1",
                            "--dataset", "synthetic", "--epochs", "1"])  # fmt: skip
    assert exited.value.code == 2 and f"STUDY={study}: Katib names the Experiment" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("created", "said"),
    [
        (False, "stopped before Experiment tune-x was created: nothing of the search runs in the cluster"),
        (True, "stopped; Experiment tune-x goes on in the cluster: the same command follows it and publishes its best"),
    ],
)
def test_ctrl_c_says_whether_the_experiment_goes_on_in_the_cluster(capsys, monkeypatch, created, said):
    """Ctrl-C before the Experiment exists must not say it goes on in the cluster (it once did)."""

    def start(*_):
        if not created:
            raise KeyboardInterrupt
        return True

    def follow(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(cluster, "start", start)
    monkeypatch.setattr(cluster, "follow", follow)
    code = cluster.main(tool_argv())
    assert code == cluster.EXIT_STILL_RUNNING and said in capsys.readouterr().out


def test_a_failed_trials_reason_is_the_trainers_line_not_a_peer_the_engine_stopped(monkeypatch):
    def pod(exit_code: int, message: str) -> dict:
        terminated = {"state": {"terminated": {"exitCode": exit_code, "message": message}}}
        return {"status": {"containerStatuses": [{"name": tfjob_customize.TRAINER_CONTAINER, **terminated}]}}

    diverged = "error: training diverged at step 4 (epoch 1): the loss went non-finite"
    stopped = "E1205 12:00:01 collective_ops.cc:123] Collective ops aborted: peer worker-0 gone, an error long after"
    pods = {"items": [pod(4, diverged), pod(137, f"step 3\n{stopped}\n"), pod(0, "")]}
    monkeypatch.setattr(cluster, "kubectl", lambda *_, **__: subprocess.CompletedProcess([], 0, json.dumps(pods), ""))
    tfjob = importlib.import_module("k8s.engines.tfjob.katib")
    assert cluster.exit_reason("tune-x-1", tfjob, "default") == f"exit 4: {diverged}"
    pods["items"] = [pod(137, f"step 3\n{stopped}\n")]  # the trainer's own replica already deleted
    assert cluster.exit_reason("tune-x-1", tfjob, "default") == f"exit 137: {stopped}"


def test_an_image_folder_on_the_volume_is_not_looked_for_on_this_machine(capsys):
    # The folder is the trials' on the cluster: only make tune, whose trials read it here, checks it before any trial.
    code, out, err = dry_run(capsys, "--dataset", "image_folder", "--", "--image-dir", "/mnt/volume/images/pets")
    assert code == 0, err
    assert "/mnt/volume/images/pets" in out


def test_a_claim_the_trials_cannot_share_over_the_nodes_is_refused_before_anything_is_made(capsys, monkeypatch):
    calls: list[tuple[str, ...]] = []
    two_nodes = claim_cluster.cluster([claim_cluster.node("a"), claim_cluster.node("b")])
    kubectl = claim_cluster.project_kubectl(two_nodes, calls)
    monkeypatch.setattr(project_kubectl, "kubectl", kubectl)
    monkeypatch.setattr(cluster, "kubectl", kubectl)
    monkeypatch.setattr(cluster, "DATA_TIMEOUT_S", 0)  # a data Job created unchecked is not waited for
    code = cluster.main(tool_argv())
    err = capsys.readouterr().err
    assert code == cluster.EXIT_CLUSTER and "the claim training-volume is ReadWriteOnce" in err, err
    assert "2 nodes (a, b)" in err and "SPREAD_OVER_NODES=0" in err
    # Only the question whether the Experiment exists: no label, no claim, no data Job.
    assert [call[:2] for call in calls] == [("get", "experiment")], calls
    # The claim the trials share is the settings'.
    monkeypatch.setenv("VOLUME_ACCESS_MODE", "ReadWriteMany")
    monkeypatch.setenv("VOLUME_STORAGE_CLASS", "local-path-shared")
    _, objects, _, _ = cluster.build(cluster.parse_args(tool_argv()), load())
    claim = manifest.the_one(objects, "PersistentVolumeClaim")["spec"]
    assert (claim["accessModes"], claim["storageClassName"]) == (["ReadWriteMany"], "local-path-shared")
