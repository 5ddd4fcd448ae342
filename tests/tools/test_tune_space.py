"""The search space make tune reads (scripts/tune/space.py): every parameter is held to the trainer's own options
before any trial runs, and each problem is one line naming the file, the parameter, the option's bounds and the fix;
the tuner refuses a second tuner on one study and a study resumed with another space. In process: no trial runs."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys

import optuna
import pytest

from scripts.common.settings import ROOT
from scripts.tune import space as spaces
from scripts.tune import study as studies

EVERY_TRIAL = ["--dataset", "synthetic", "--epochs", "1"]


def write(tmp_path: pathlib.Path, parameters: str, head: str = "") -> pathlib.Path:
    path = tmp_path / "space.yaml"
    path.write_text(f"{head}parameters:\n" + "".join(f"  {line}\n" for line in parameters.splitlines()))
    return path


def refusal(tmp_path: pathlib.Path, parameters: str, head: str = "", argv: list[str] = EVERY_TRIAL) -> str:
    path = write(tmp_path, parameters, head)
    with pytest.raises(spaces.SpaceError) as refused:
        spaces.load(path, argv, environ={})
    message = str(refused.value)
    assert message.startswith(f"search space {path}") or "trainer refuses the flags" in message, message
    return message


def test_the_example_space_searches_the_default_task_toward_its_objective():
    space = spaces.load(ROOT / "scripts" / "tune" / "search_space.yaml", EVERY_TRIAL, environ={})
    assert space.objective.key == "test_accuracy" and space.direction == "maximize"
    assert [p.name for p in space.parameters] == ["learning-rate", "model", "warmup-steps"]
    study = optuna.create_study(direction=space.direction, sampler=optuna.samplers.RandomSampler(seed=1))
    for _ in range(20):
        values = space.suggest(study.ask())
        assert 3e-4 <= values["learning-rate"] <= 1e-2 and values["model"] in ("cnn", "dropout", "batch_norm")
        assert values["warmup-steps"] in (0, 16, 32, 48, 64)


@pytest.mark.parametrize(
    ("parameter", "expected"),
    [
        ("learning-rat: {type: float, min: 0.001, max: 0.1}", "learning-rat is not an option of the trainer"),
        ("learning_rate: {type: float, min: 0.001, max: 0.1}", "name parameters by their flag, learning-rate"),
        (
            "learning-rate: {type: float, min: 0, max: 0.1}",
            "learning-rate at 0.0: the trainer refuses it: --learning-rate must be positive",
        ),
        (
            "conv-dropout: {type: float, min: 0.1, max: 1.5}",
            "conv-dropout at 1.5: the trainer refuses it: --conv-dropout must be in [0, 1)",
        ),
        (
            "per-worker-batch-size: {type: int, min: 0, max: 64}",
            "per-worker-batch-size at 0: the trainer refuses it: --per-worker-batch-size must be at least 1",
        ),
        (
            "per-worker-batch-size: {type: float, min: 16, max: 64}",
            "a float range, but --per-worker-batch-size takes an int of at least 1; use type: int",
        ),
        (
            "model: {type: categorical, values: [cnn, resnet]}",
            "model at 'resnet': the trainer refuses it: --model: unknown model 'resnet'",
        ),
        ("model: {type: float, min: 1, max: 2}", "a float range, but --model takes a str"),
        (
            "verbose-workers: {type: categorical, values: [true, 3]}",
            "value 3 is an int, but --verbose-workers takes true or false",
        ),
        ("collective: {type: categorical, values: [ring, mpi]}", "value 'mpi' is not one of one of auto, ring, nccl"),
        ("learning-rate: {type: float, min: 0.1, max: 0.01}", "min 0.1 must be below max 0.01"),
        ("learning-rate: {type: float, min: 1e-4, max: 0.1, step: 0.01, log: true}", "either log or stepped"),
        ("warmup-steps: {type: int, min: 0.5, max: 8}", "an int range has whole min, max and step"),
        ("seed: {type: int, min: 1, max: 9}", "seed cannot be searched: a generated dataset's test split"),
        ("epochs: {type: int, min: 1, max: 9}", "epochs cannot be searched: set EPOCHS="),
        ("model-dir: {type: categorical, values: [a, b]}", "model-dir cannot be searched"),
        ("learning-rate: 0.01", "expected {type: ..., min: ..., max: ...}"),
    ],
)
def test_a_parameter_the_trainer_would_refuse_is_refused_before_any_trial(tmp_path, parameter, expected):
    assert expected in refusal(tmp_path, parameter)


def test_the_top_level_keys_are_checked(tmp_path):
    line = "learning-rate: {type: float, min: 0.001, max: 0.1}"
    assert "unknown key(s) trails" in refusal(tmp_path, line, "trails: 4\n")
    assert "sampler 'bayes'; choose one of tpe, random, grid" in refusal(tmp_path, line, "sampler: bayes\n")
    assert "trials must be a whole number of at least 1, got 0" in refusal(tmp_path, line, "trials: 0\n")
    assert (
        "objective 'test_loss', but the task image_classification is judged by test_accuracy (higher is better)"
        in refusal(tmp_path, line, "objective: test_loss\n")
    )
    assert "the grid sampler takes listed values only" in refusal(tmp_path, line, "sampler: grid\n")


def test_a_parameter_also_given_in_args_is_refused(tmp_path):
    message = refusal(
        tmp_path, "learning-rate: {type: float, min: 0.001, max: 0.1}", argv=[*EVERY_TRIAL, "--learning-rate", "0.01"]
    )
    assert "learning-rate is searched and also given in ARGS" in message


def test_args_the_trainer_refuses_are_named(tmp_path):
    message = refusal(
        tmp_path, "learning-rate: {type: float, min: 0.001, max: 0.1}", argv=[*EVERY_TRIAL, "--epochs", "0"]
    )
    assert "the trainer refuses the flags every trial gets: --epochs must be at least 1" in message


def test_a_task_option_is_searched_and_the_grid_is_every_combination(tmp_path):
    path = write(
        tmp_path,
        "dense-units: {type: int, min: 32, max: 96, step: 32}\n"
        "verbose-workers: {type: categorical, values: [true, false]}",
        "sampler: grid\n",
    )
    space = spaces.load(path, EVERY_TRIAL, environ={})
    assert len(space.grid_points()) == 6 and {"dense-units": 64, "verbose-workers": False} in space.grid_points()
    assert spaces.trainer_flags({"dense-units": 64, "verbose-workers": False, "learning-rate": 0.003}) == [
        "--dense-units",
        "64",
        "--no-verbose-workers",
        "--learning-rate",
        "0.003",
    ]


def run_a_trial(study: optuna.Study, state: optuna.trial.TrialState) -> None:
    trial = study.ask()
    trial.suggest_float("learning-rate", 0.001, 0.1)
    if state == optuna.trial.TrialState.COMPLETE:
        study.tell(trial, 0.5)
    else:
        study.tell(trial, state=state)


def test_a_resumed_study_with_a_finished_trial_must_search_the_same_space_with_the_same_flags(tmp_path):
    first = spaces.load(write(tmp_path, "learning-rate: {type: float, min: 0.001, max: 0.1}"), EVERY_TRIAL, environ={})
    study, _ = studies.open_study(tmp_path / "study", "s", first, EVERY_TRIAL, print)
    run_a_trial(study, optuna.trial.TrialState.PRUNED)
    other = spaces.load(write(tmp_path, "learning-rate: {type: float, min: 0.001, max: 0.2}"), EVERY_TRIAL, environ={})
    with pytest.raises(spaces.SpaceError, match="made from another search space or objective"):
        studies.open_study(tmp_path / "study", "s", other, EVERY_TRIAL, print)
    # Other epochs or another test split: the trials would not compare.
    with pytest.raises(spaces.SpaceError, match="ran its trials with --dataset synthetic --epochs 1, not"):
        studies.open_study(tmp_path / "study", "s", first, [*EVERY_TRIAL, "--test-examples", "32"], print)
    study, _ = studies.open_study(tmp_path / "study", "s", first, EVERY_TRIAL, print)  # the same ones resume
    assert len(study.trials) == 1


def test_a_study_with_no_finished_trial_starts_again_with_new_settings(tmp_path):
    first = spaces.load(write(tmp_path, "learning-rate: {type: float, min: 0.001, max: 0.1}"), EVERY_TRIAL, environ={})
    study, _ = studies.open_study(tmp_path / "study", "s", first, EVERY_TRIAL, print)
    run_a_trial(study, optuna.trial.TrialState.FAIL)
    run_a_trial(study, optuna.trial.TrialState.FAIL)
    lines: list[str] = []
    changed = [*EVERY_TRIAL, "--test-examples", "32"]
    study, _ = studies.open_study(tmp_path / "study", "s", first, changed, lines.append)
    assert study.trials == [] and study.user_attrs["shared_flags"] == changed
    assert lines == [
        f"the study in {tmp_path / 'study'} ran its trials with --dataset synthetic --epochs 1, not "
        "--dataset synthetic --epochs 1 --test-examples 32, but none of its trials completed or was pruned "
        "(2 failed), so it has nothing to compare with: it starts again with these settings"
    ]
    run_a_trial(study, optuna.trial.TrialState.COMPLETE)
    with pytest.raises(spaces.SpaceError, match="would not compare"):  # now it has a trial to compare with
        studies.open_study(tmp_path / "study", "s", first, EVERY_TRIAL, lines.append)


def test_a_study_whose_trials_all_failed_starts_again_with_the_same_settings(tmp_path):
    first = spaces.load(write(tmp_path, "learning-rate: {type: float, min: 0.001, max: 0.1}"), EVERY_TRIAL, environ={})
    study, storage = studies.open_study(tmp_path / "study", "s", first, EVERY_TRIAL, print)
    trial = study.ask()  # stopped by Ctrl-C: queued to run again, as a resume runs it
    studies.give_up(study, storage, trial.number, {}, "interrupted: the tuner was stopped during this trial")
    lines: list[str] = []
    study, _ = studies.open_study(tmp_path / "study", "s", first, EVERY_TRIAL, lines.append)
    assert len(study.trials) == 2 and lines == []
    run_a_trial(study, optuna.trial.TrialState.FAIL)  # e.g. a broken file in the data, since fixed
    study, _ = studies.open_study(tmp_path / "study", "s", first, EVERY_TRIAL, lines.append)
    assert study.trials == [] and studies.counted(study) == 0
    assert lines == [
        f"the study in {tmp_path / 'study'}: none of its trials completed or was pruned (2 failed), so it has "
        "nothing to compare with: it starts again with these settings"
    ]
    run_a_trial(study, optuna.trial.TrialState.FAIL)
    run_a_trial(study, optuna.trial.TrialState.PRUNED)  # one to keep: its failed trials count in the budget
    study, _ = studies.open_study(tmp_path / "study", "s", first, EVERY_TRIAL, lines.append)
    assert studies.counted(study) == 2 and len(lines) == 1


def test_a_resumed_seeded_study_does_not_draw_its_first_trials_again(tmp_path):
    space = spaces.load(write(tmp_path, "learning-rate: {type: float, min: 0.001, max: 0.1}", "seed: 0\n"), EVERY_TRIAL)
    drawn = []
    for _ in range(2):  # two tuner runs of one trial each on one study
        study, _ = studies.open_study(tmp_path / "study", "s", space, EVERY_TRIAL, print)
        trial = study.ask()
        drawn.append(space.suggest(trial)["learning-rate"])
        study.tell(trial, 0.5)
    assert drawn[0] != drawn[1]


@pytest.mark.parametrize(
    "name, complaint",
    [("My_Study", "a study is named as a job is"), ("../escaped", "a study is named as a job is")],
)
def test_a_study_name_that_no_job_could_have_is_refused(name, complaint):
    with pytest.raises(spaces.SpaceError, match=complaint):
        studies.study_dir(name)


def test_a_study_lives_where_no_run_local_job_can(tmp_path):
    # A job name has no dot, so run-local's CLEAN=1 of any job never reaches a study.
    assert studies.study_dir("multi-worker").name == "multi-worker.study"


@pytest.mark.parametrize(
    "head, parameters, complaint",
    [
        ("", "learning-rate: {type: float, min: 0.001, max: 0.1, step: 0}", "step must be above 0, got 0"),
        ("", "dense-units: {type: int, min: 32, max: 96, step: -32}", "step must be above 0, got -32"),
        ("", "learning-rate: {type: float, min: 0.001, max: 0.1, log: 'false'}", "log must be true or false"),
        ("prune: 'false'\n", "learning-rate: {type: float, min: 0.001, max: 0.1}", "prune must be true or false"),
        ("seed: -1\n", "learning-rate: {type: float, min: 0.001, max: 0.1}", "seed must be a whole number from 0"),
        ("seed: 99999999999999999999\n", "learning-rate: {type: float, min: 0.001, max: 0.1}", "from 0 to 4294967295"),
        ("1: 2\n", "learning-rate: {type: float, min: 0.001, max: 0.1}", "unknown key(s) 1;"),
        ("", "model: {type: categorical, values: [cnn], min: 3}", "unknown key(s) min; a categorical parameter"),
        ("", "validation-split: {type: float, min: 0.1, max: 0.3}", "trials are compared on one test split"),
        ("", "image-dir: {type: categorical, values: [a, b]}", "trials are compared on one test split"),
    ],
)
def test_each_review_finding_is_exit_2_naming_it(tmp_path, head, parameters, complaint):
    assert complaint in refusal(tmp_path, parameters, head)


def test_a_file_that_is_not_text_is_refused(tmp_path):
    path = tmp_path / "space.yaml"
    path.write_bytes(b"parameters:\n  \xff\xfe: 1\n")
    with pytest.raises(spaces.SpaceError, match="not UTF-8 text"):
        spaces.load(path, EVERY_TRIAL, environ={})


def test_a_categorical_float_written_1e_3_is_the_number(tmp_path):
    space = spaces.load(write(tmp_path, "learning-rate: {type: categorical, values: [1e-3, 0.01]}"), EVERY_TRIAL)
    assert space.parameters[0].values == (0.001, 0.01)


def test_an_abbreviated_flag_in_args_counts_as_given(tmp_path):
    # The trainer's parser takes a unique prefix: --warmup 500 sets --warmup-steps, which the search would override.
    message = refusal(tmp_path, "warmup-steps: {type: int, min: 0, max: 500}", argv=[*EVERY_TRIAL, "--warmup", "500"])
    assert "warmup-steps is searched and also given in ARGS" in message


def test_a_second_tuner_on_one_study_exits_2_naming_the_first(tmp_path):
    study = f"tune-lock-test-{os.getpid()}"
    study_dir = studies.study_dir(study)
    try:
        with studies.locked(study_dir):
            done = subprocess.run(
                [sys.executable, "-m", "scripts.tune.tune", "--search-space", "scripts/tune/search_space.yaml"]
                + ["--study", study, "--dataset", "synthetic", "--epochs", "1", "--publish-to", str(tmp_path)],
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
    finally:
        shutil.rmtree(study_dir)
    assert done.returncode == 2, done.stderr
    assert f"another make tune is running the study in {study_dir}" in done.stderr
