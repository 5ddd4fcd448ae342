"""make tune end to end, in a copy of the project: every trial is the real 2-worker (or 1-worker) job that
`make run-local` runs. A search over the learning rate publishes a model at least as good as the default
configuration's, and a learning rate that diverges is recorded failed with the trainer's exit-4 reason and never
chosen; a study stopped by Ctrl-C, or killed mid-trial, resumes without rerunning a finished trial and runs the
interrupted one again; two trials at once share neither a model directory nor a port; IMAGES= trains every trial on
that folder as run-local does, and DATASET=image_folder without it is refused before any trial."""

from __future__ import annotations

import ctypes
import json
import os
import pathlib
import platform
import re
import signal
import subprocess
import time

import optuna
import psutil
import pytest
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import TrialState

import image_folders
from project_copy import VENV, copy_project

SMALL_JOB = "--train-examples 512 --test-examples 256 --per-worker-batch-size 32"


def copy(tmp_path: pathlib.Path) -> pathlib.Path:
    return copy_project(tmp_path / "project", files=("Makefile",), folders=("trainer", "scripts", "modules", "k8s"))


def make_command(project: pathlib.Path, goal: str, space: str, *variables: str) -> list[str]:
    """make GOAL with the small synthetic job unless the variables say otherwise (IMAGES= picks its own DATASET)."""
    (project / "space.yaml").write_text(space)
    given = {variable.split("=")[0] for variable in variables}
    defaults = {"DATASET": "synthetic", "ARGS": SMALL_JOB}
    if "IMAGES" in given:
        del defaults["DATASET"]
    # -o: the venv running this test is the one installed; make must not reinstall into it from the copy.
    return [
        "make",
        "-o",
        f"{VENV}/.installed",
        goal,
        f"VENV={VENV}",
        "SEARCH_SPACE=space.yaml",
        *(f"{name}={value}" for name, value in defaults.items() if name not in given),
        *variables,
    ]


def tune(project: pathlib.Path, space: str, *variables: str) -> subprocess.CompletedProcess:
    command = make_command(project, "tune", space, *variables)
    return subprocess.run(command, cwd=project, capture_output=True, text=True, timeout=900)


def trials_of(project: pathlib.Path, study: str) -> list[optuna.trial.FrozenTrial]:
    """The study as Optuna itself reads it from the journal."""
    storage = JournalStorage(JournalFileBackend(str(project / "runs" / f"{study}.study" / "study.journal")))
    return optuna.load_study(study_name=study, storage=storage).get_trials()


def metrics(model_dir: str | pathlib.Path) -> dict:
    return json.loads((pathlib.Path(model_dir) / "metrics.json").read_text())


@pytest.mark.slow
def test_a_search_over_the_learning_rate_publishes_at_least_the_default_and_a_diverging_trial_fails(tmp_path):
    project = copy(tmp_path)
    # One worker per job: the search and the publishing are under test here; the other tests' trials have two.
    default = subprocess.run(
        ["make", "-o", f"{VENV}/.installed", "run-local", f"VENV={VENV}", "JOB_NAME=default", "DATASET=synthetic"]
        + ["WORKERS=1", "EPOCHS=2", f"ARGS={SMALL_JOB}"],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert default.returncode == 0, default.stdout[-3000:] + default.stderr[-3000:]
    default_accuracy = metrics(project / "runs/default/models/default")["test_accuracy"]
    # The grid: one rate that overflows float32 in its first steps, and two around the default (1e-3).
    space = "sampler: grid\nparameters:\n  learning-rate: {type: categorical, values: [1.0e+30, 3.0e-3, 1.0e-2]}\n"
    done = tune(project, space, "STUDY=lr", "WORKERS=1", "EPOCHS=2", "JOB_NAME=default")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trials = {trial.params["learning-rate"]: trial for trial in trials_of(project, "lr")}
    assert len(trials) == 3
    diverged = trials[1e30]
    assert diverged.state == TrialState.FAIL
    assert diverged.user_attrs["reason"].startswith("diverged, exit 4: training diverged"), diverged.user_attrs
    assert "trial 0 failed in" in done.stdout and "exit 4" in done.stdout
    complete = [trial for trial in trials.values() if trial.state == TrialState.COMPLETE]
    best = max(complete, key=lambda trial: trial.value)
    assert best.value >= default_accuracy, (best.params, best.value, default_accuracy)
    # Selection published the best trial's model (never the failed one) where make serve reads by default.
    selection = json.loads((project / "runs/default-selected/selection.json").read_text())
    assert selection["winner"] == best.user_attrs["model_dir"]
    assert metrics(selection["winner"])["test_accuracy"] == best.value
    assert diverged.user_attrs["model_dir"] not in [c["model_dir"] for c in selection["candidates"]]
    served = subprocess.run(
        ["make", "-n", "serve", f"VENV={VENV}", "JOB_NAME=default"], cwd=project, capture_output=True, text=True
    )
    assert "--model-base-path runs/default-selected/serving " in served.stdout, served.stdout
    assert (project / "runs/lr.study/history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = done.stdout[done.stdout.index("trial  learning-rate") :]
    assert re.search(r"^0\s+1e\+30\s+fail\s", table, re.M) and re.search(
        r"^1\s+0\.003\s+0\.\d+\s+complete", table, re.M
    )
    # A later search whose best is worse leaves the published model served, and says why.
    published = sorted(path.name for path in (project / "runs/default-selected/serving").iterdir())
    space = "sampler: grid\nparameters:\n  learning-rate: {type: categorical, values: [1.0e-9]}\n"
    worse = tune(project, space, "STUDY=worse", "WORKERS=1", "EPOCHS=1", "JOB_NAME=default")
    assert worse.returncode == 0, worse.stdout[-3000:] + worse.stderr[-3000:]
    assert "not published: the served" in worse.stdout, worse.stdout[-3000:]
    assert sorted(path.name for path in (project / "runs/default-selected/serving").iterdir()) == published
    assert json.loads((project / "runs/default-selected/selection.json").read_text())["served"]["value"] == best.value


def as_from_a_terminal() -> None:
    """Ctrl-C as a terminal's shell leaves it, wherever pytest started: a shell ignores SIGINT in its background jobs,
    and Python keeps an ignored SIGINT ignored, so a test run in the background would see no Ctrl-C at all."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start_tune(project: pathlib.Path, space: str, *variables: str) -> subprocess.Popen:
    command = make_command(project, "tune", space, *variables)
    return subprocess.Popen(
        command, cwd=project, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=as_from_a_terminal
    )


def read_until(process: subprocess.Popen, pattern: str, lines: list[str], timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        if re.search(pattern, line):
            return
        assert time.monotonic() < deadline, "".join(lines)
    raise AssertionError(f"the tuner ended before {pattern!r}:\n" + "".join(lines))


def tuner_of(make: subprocess.Popen) -> psutil.Process:
    return next(p for p in psutil.Process(make.pid).children(recursive=True) if "scripts.tune.tune" in p.cmdline())


def interrupt_a_trial_thread(tuner: psutil.Process) -> None:
    """SIGINT to one of the tuner's other threads: the kernel may hand a Ctrl-C to any of them, and CI's once went
    to a trial's thread (tgkill: no other call signals one thread of another process)."""
    tgkill = {"x86_64": 234, "aarch64": 131}[platform.machine()]
    thread = next(thread.id for thread in tuner.threads() if thread.id != tuner.pid)
    assert ctypes.CDLL(None, use_errno=True).syscall(tgkill, tuner.pid, thread, signal.SIGINT) == 0, ctypes.get_errno()


def processes_in(folder: pathlib.Path) -> list[psutil.Process]:
    """Processes still running in the folder (a trial's run-local and its replicas run in its job directory)."""
    found = []
    for process in psutil.process_iter():
        try:
            if pathlib.Path(process.cwd()).is_relative_to(folder) or str(folder) in " ".join(process.cmdline()):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def wait_gone(folder: pathlib.Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while processes_in(folder):
        assert time.monotonic() < deadline, [p.cmdline() for p in processes_in(folder)]
        time.sleep(0.5)


SPACE = "sampler: random\nseed: 3\nparameters:\n  learning-rate: {type: float, min: 1.0e-3, max: 1.0e-2, log: true}\n"


def tuned_until(
    tmp_path: pathlib.Path, pattern: str, *variables: str
) -> tuple[pathlib.Path, subprocess.Popen, list[str]]:
    """make tune of SPACE started in a copy of the project and read up to its line matching `pattern`: the copy, the
    make process still running, and the lines read."""
    project = copy(tmp_path)
    tuner, lines = start_tune(project, SPACE, *variables), []
    read_until(tuner, pattern, lines)
    return project, tuner, lines


@pytest.mark.slow
def test_a_study_killed_mid_trial_resumes_without_rerunning_a_finished_trial(tmp_path):
    variables = ("STUDY=crash", "TRIALS=2", "EPOCHS=3")
    project, first, _ = tuned_until(tmp_path, r"trial 1 started", *variables)
    tuner_of(first).kill()  # SIGKILL: no handler runs, as in a crash or an OOM kill
    first.wait(60)
    wait_gone(project / "runs" / "crash-1")  # the trial's run-local and replicas died with the tuner
    finished = trials_of(project, "crash")[0]
    assert finished.state == TrialState.COMPLETE
    weights = metrics(finished.user_attrs["model_dir"])["weights_sha256"]

    second = tune(project, SPACE, *variables)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "trial 1 was running when the tuner ended; it is marked failed and runs again" in second.stdout
    assert "trial 0 started" not in second.stdout  # the finished trial was not run again
    trials = trials_of(project, "crash")
    assert [trial.state for trial in trials] == [TrialState.COMPLETE, TrialState.FAIL, TrialState.COMPLETE]
    assert trials[1].user_attrs["reason"] == "interrupted: the tuner ended during this trial"
    assert trials[2].user_attrs["retry_of"] == 1 and trials[2].params == trials[1].params
    assert metrics(trials[0].user_attrs["model_dir"])["weights_sha256"] == weights  # its model was left alone


@pytest.mark.slow
def test_ctrl_c_stops_the_trial_and_the_same_command_runs_it_again(tmp_path):
    variables = ("STUDY=stopped", "TRIALS=1", "EPOCHS=3")
    project, first, lines = tuned_until(tmp_path, r"trial 0 started", *variables)
    interrupt_a_trial_thread(tuner_of(first))
    rest, _ = first.communicate(timeout=120)
    output = "".join(lines) + rest
    assert first.returncode != 0 and "trial 0 stopped; it runs again when the study resumes" in output, output
    assert "stopped; the same command resumes the study" in output
    wait_gone(project / "runs" / "stopped-0")
    second = tune(project, SPACE, *variables)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    trials = trials_of(project, "stopped")
    assert [trial.state for trial in trials] == [TrialState.FAIL, TrialState.COMPLETE]
    assert trials[0].user_attrs["reason"] == "interrupted: the tuner was stopped during this trial"
    assert trials[1].user_attrs["retry_of"] == 0 and trials[1].params == trials[0].params


@pytest.mark.slow
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="two 1-worker trials at once need 2 cores")
def test_two_trials_at_once_share_neither_a_model_directory_nor_a_port(tmp_path):
    project = copy(tmp_path)
    done = tune(project, SPACE, "STUDY=pair", "TRIALS=2", "PARALLEL=2", "WORKERS=1", "EPOCHS=2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trials = trials_of(project, "pair")
    assert [trial.state for trial in trials] == [TrialState.COMPLETE, TrialState.COMPLETE]
    first, second = sorted(trials, key=lambda trial: trial.datetime_start)
    assert second.datetime_start < first.datetime_complete, "the two trials did not run at once"
    assert first.user_attrs["model_dir"] != second.user_attrs["model_dir"]
    ports = []
    for trial in trials:
        log = (project / "runs" / "pair.study" / "logs" / f"{trial.user_attrs['job']}.log").read_text()
        ports.append(set(re.findall(r"is 127\.0\.0\.1:(\d+) here", log)))
        assert metrics(trial.user_attrs["model_dir"])["config"]["learning_rate"] == trial.params["learning-rate"]
    assert ports[0] and ports[1] and not ports[0] & ports[1], ports


IMAGE_JOB = "--per-worker-batch-size 4"


@pytest.mark.slow
def test_a_search_on_an_image_folder_trains_every_trial_on_it_as_run_local_does(tmp_path):
    project = copy(tmp_path)
    folder = image_folders.write(tmp_path / "my images", per_class=8, test_per_class=2)
    done = tune(project, SPACE, "STUDY=images", "TRIALS=1", "EPOCHS=1", f"IMAGES={folder}", f"ARGS={IMAGE_JOB}")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [trial] = trials_of(project, "images")
    assert trial.state == TrialState.COMPLETE
    config = metrics(trial.user_attrs["model_dir"])["config"]
    assert config["dataset"] == "image_folder" and config["image_dir"] == str(folder), config
    selection = json.loads((project / "runs/multi-worker-selected/selection.json").read_text())
    assert selection["winner"] == trial.user_attrs["model_dir"]


def test_dataset_image_folder_without_its_folder_is_refused_before_any_trial(tmp_path):
    project = copy(tmp_path)
    refused = tune(project, SPACE, "STUDY=nofolder", "DATASET=image_folder", f"ARGS={IMAGE_JOB}")
    assert refused.returncode != 0, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert "--dataset image_folder needs --image-dir" in refused.stderr and "trial 0" not in refused.stdout


def broken_image_folder(tmp_path: pathlib.Path) -> pathlib.Path:
    """A small image folder with one file that is no image: the data check fails on it, before any training."""
    folder = image_folders.write(tmp_path / "images", per_class=8, test_per_class=2)
    (folder / "train" / "circle" / "broken.png").write_text("not an image")
    return folder


@pytest.mark.slow  # a study of real trials: make test-slow
def test_a_failed_trial_says_its_own_error_line_and_its_study_takes_other_settings(tmp_path):
    project = copy(tmp_path)
    folder = broken_image_folder(tmp_path)
    variables = ("STUDY=broken", "TRIALS=1", f"IMAGES={folder}", f"ARGS={IMAGE_JOB}")
    done = tune(project, SPACE, "EPOCHS=1", *variables)
    assert done.returncode != 0
    failed = next(line for line in done.stdout.splitlines() if line.startswith("tune: trial 0 failed"))
    assert f"prepare-data exit 2: error: the data check: {folder}/train/circle/broken.png" in failed, done.stdout
    [trial] = trials_of(project, "broken")
    assert trial.state == TrialState.FAIL and "broken.png" in trial.user_attrs["reason"]
    # Its only trial failed, so it has nothing to compare with: other settings start it again instead of a refusal.
    again = tune(project, SPACE, "EPOCHS=2", *variables)
    assert "nothing to compare with: it starts again with these settings" in again.stdout, again.stdout + again.stderr
    assert "tune: trial 0 failed" in again.stdout
    assert len(trials_of(project, "broken")) == 1  # the new trial only: the old one went with the old settings


@pytest.mark.slow
def test_a_study_whose_trials_all_failed_runs_again_once_the_user_fixed_the_folder(tmp_path):
    project = copy(tmp_path)
    folder = broken_image_folder(tmp_path)
    variables = ("STUDY=fixed", "TRIALS=1", "EPOCHS=1", "WORKERS=1", f"IMAGES={folder}", f"ARGS={IMAGE_JOB}")
    assert "tune: trial 0 failed" in tune(project, SPACE, *variables).stdout
    (folder / "train" / "circle" / "broken.png").unlink()  # as the data check's line tells
    again = tune(project, SPACE, *variables)  # the same command: its failed trial is no reason to run nothing
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "nothing to compare with: it starts again with these settings" in again.stdout
    [trial] = trials_of(project, "fixed")
    assert trial.state == TrialState.COMPLETE
    assert "make serve SERVE_FROM=runs/multi-worker-selected/serving serves it" in again.stdout, again.stdout


@pytest.mark.slow
def test_a_trial_that_ran_all_its_epochs_is_complete_never_pruned(tmp_path):
    project = copy(tmp_path)
    # Two rates that learn, then one too low to: below the median of the first two at the last (only) epoch.
    space = "sampler: grid\nparameters:\n  learning-rate: {type: categorical, values: [3.0e-3, 2.0e-3, 1.0e-7]}\n"
    done = tune(project, space, "STUDY=last", "EPOCHS=1", "WORKERS=1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    trials = trials_of(project, "last")
    assert [trial.state for trial in trials] == [TrialState.COMPLETE] * 3, done.stdout
    assert trials[2].value < (trials[0].value + trials[1].value) / 2, [trial.value for trial in trials]
    assert "pruned" not in done.stdout
