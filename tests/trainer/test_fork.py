"""The fork proof: in a copy of the project, one new file outside trainer/ (examples/regression.py: a regression
with MSE loss and MAE metric on generated features) trains on two workers through `make run-local` and the real
manifests, resumes after a worker is SIGKILLed, is followed by the evaluator in the async shape, and exports a
SavedModel that `saved_model_cli run` answers with the task's signature. No file under trainer/ changes."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import signal
import subprocess
import time

import psutil
import pytest

from project_copy import VENV, copy_project

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODULE = "modules.regression"  # the fork's file in modules/, the folder the image copies and puts on PYTHONPATH
# The three flags a fork passed before --module; still public, so the async run below keeps them.
TASK_FLAGS = f"--task-module {MODULE} --task regression --dataset-module {MODULE}"


def copy_for_run_local(target: pathlib.Path) -> pathlib.Path:
    """What make run-local needs: the Makefile, the manifests, the tools, the trainer and modules/ (no tests, no
    examples)."""
    folders = tuple(path.name for path in ROOT.iterdir() if path.is_dir() and path.name.startswith("k8s"))
    return copy_project(target, files=("Makefile", "Dockerfile"), folders=("trainer", "scripts", "modules", *folders))


def digests(folder: pathlib.Path) -> dict[str, str]:
    return {
        path.relative_to(folder).as_posix(): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(folder.rglob("*.py"))
        if "__pycache__" not in path.parts
    }


def make_run_local(project: pathlib.Path, console: pathlib.Path, *variables: str) -> subprocess.Popen:
    # -o: the venv running this test is the one installed; make must not reinstall into it from the copy.
    command = ["make", "-o", f"{VENV}/.installed", "run-local", f"VENV={VENV}", *variables]
    with console.open("w") as out:
        return subprocess.Popen(
            command, cwd=project, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ), start_new_session=True
        )


def finish(proc: subprocess.Popen, console: pathlib.Path, timeout: float) -> None:
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
        raise AssertionError(f"make run-local did not finish in {timeout} s:\n{console.read_text()[-5000:]}") from None
    assert code == 0, console.read_text()[-5000:]


def run_local_status(project: pathlib.Path) -> dict:
    """The training job's run-local status (the data-preparation Job has its own beside it)."""
    found = [json.loads(path.read_text()) for path in project.glob("runs/*/run-local/*.status.json")]
    (training,) = [status for status in found if {"worker-0", "chief-0"} & set(status.get("replicas", {}))]
    return training


def replica(proc: subprocess.Popen, task_type: str, index: int) -> psutil.Process:
    for child in psutil.Process(proc.pid).children(recursive=True):
        try:
            task = json.loads(child.environ().get("TF_CONFIG", "{}")).get("task", {})
        except (psutil.Error, ValueError):
            continue
        if task == {"type": task_type, "index": index} and "trainer" in " ".join(child.cmdline()):
            return child
    raise AssertionError(f"no {task_type}-{index} replica is running")


@pytest.mark.slow
def test_a_regression_task_in_one_file_outside_trainer_trains_resumes_is_evaluated_and_served(tmp_path):
    project = copy_for_run_local(tmp_path / "project")
    shutil.copy2(ROOT / "examples" / "regression.py", project / "modules" / "regression.py")  # the one new file
    trainer_before = digests(project / "trainer")
    # Nor does the image's recipe change: it already ships modules/ on PYTHONPATH.
    assert (project / "Dockerfile").read_bytes() == (ROOT / "Dockerfile").read_bytes()

    # Two all-reduce workers of the real manifest; worker 1 is killed mid-run and recreated, and the group resumes.
    # The fork comes in by one setting (TRAINER_MODULE, as trainer.env carries it); its one task and its one dataset
    # are the defaults, for the trainer and the data preparation alike.
    console = tmp_path / "sync.txt"
    flags = "--train-examples 8192 --test-examples 1024 --checkpoint-every 16 --log-every 16"
    variables = (f"TRAINER_MODULE={MODULE}", "WORKERS=2", "EPOCHS=4", f"ARGS={flags}")
    proc = make_run_local(project, console, *variables)
    deadline = time.monotonic() + 240
    while "step 32/" not in "".join(p.read_text() for p in project.glob("runs/*/run-local/logs/worker-0.log")):
        assert proc.poll() is None and time.monotonic() < deadline, console.read_text()[-5000:]
        time.sleep(0.2)
    os.kill(replica(proc, "worker", 1).pid, signal.SIGKILL)
    finish(proc, console, timeout=420)
    result = run_local_status(project)
    assert result["state"] == "Succeeded" and result["replicas"]["worker-1"]["exit_codes"][0] == 137
    (chief_log,) = project.glob("runs/*/run-local/logs/worker-0.log")
    assert "resumed from" in chief_log.read_text()
    model_dir = pathlib.Path(result["model_dir"])
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["workers"] == 2 and metrics["test_mae"] < 0.5 and metrics["test_loss"] < 0.4, metrics
    assert "test_accuracy" not in metrics and metrics["test_examples_evaluated"] == 1024

    # The export answers `saved_model_cli run` with the task's signature: features in, prediction out.
    (version,) = (model_dir / "serving").iterdir()
    assert int(version.name) == metrics["steps"]
    served = subprocess.run(
        [
            str(VENV / "bin" / "saved_model_cli"),
            "run",
            "--dir",
            str(version),
            "--tag_set",
            "serve",
            "--signature_def",
            "serve",
            "--input_exprs",
            "features=[[0.5, 0, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0.5]]",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert served.returncode == 0, served.stderr[-3000:]
    assert "Result for output key prediction:" in served.stdout, served.stdout[-2000:]

    # The async shape: a chief, a ps task, two workers and the evaluator following the checkpoints; in bfloat16, so
    # the async loop and the evaluator run the task under a mixed --precision too.
    console = tmp_path / "async.txt"
    # 768 steps: long enough that the evaluator, which starts with the group, follows at least one checkpoint on a
    # loaded machine (with 256 steps the chief once finished before the evaluator had read any).
    async_examples = 24576
    flags = f"{TASK_FLAGS} --train-examples {async_examples} --test-examples 512 --precision mixed_bfloat16"
    variables = ("STRATEGY=async", "WORKERS=2", "DATASET=linear_features", "EPOCHS=2", "CLEAN=1", f"ARGS={flags}")
    finish(make_run_local(project, console, *variables), console, timeout=420)
    result = run_local_status(project)
    assert result["state"] == "Succeeded"
    model_dir = pathlib.Path(result["model_dir"])
    metrics = json.loads((model_dir / "metrics.json").read_text())
    assert metrics["strategy"] == "async" and metrics["steps"] == 2 * async_examples // 64 and metrics["test_mae"] < 0.6
    # The job ends when the chief does (the operator's success policy), so the evaluator may miss the last one.
    evaluations = json.loads((model_dir / "evaluations.json").read_text())["evaluations"]
    assert evaluations and all(e["test_examples_evaluated"] == 512 and "test_mae" in e for e in evaluations)

    assert digests(project / "trainer") == trainer_before  # the fork changed no file under trainer/
