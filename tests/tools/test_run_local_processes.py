"""run-local against real processes: restarts, failures, signals and crashes, and nothing left behind.

The replicas are a small script (tests/tools/fixtures/run_local/replica.py) that records each start on the
job's volume and then exits, sleeps or waits as told, so these runs take about a second each.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest
import yaml

ROOT = pathlib.Path(__file__).resolve().parents[2]
RUNNER = ["-m", "scripts.localrun.run_local"]
REPLICA = ROOT / "tests" / "tools" / "fixtures" / "run_local" / "replica.py"


def manifest(
    tmp_path: pathlib.Path,
    args: list[str],
    workers: int = 2,
    policy: str = "ExitCode",
    run_policy: dict | None = None,
    success_policy: str | None = None,
    grace_s: int = 5,
    chief: bool = False,
    prepare_args: list[str] | None = None,
) -> pathlib.Path:
    """A rendered-manifest file like the project's: ConfigMap-fed env, a PVC at /mnt/work, a TFJob."""

    def pod(container_args):
        return {
            "spec": {
                "terminationGracePeriodSeconds": grace_s,
                "containers": [
                    {
                        "name": "tensorflow",
                        "image": "img",
                        "command": ["python", str(REPLICA)],
                        "args": container_args,
                        "envFrom": [{"configMapRef": {"name": "settings"}}],
                        "volumeMounts": [{"name": "work", "mountPath": "/mnt/work"}],
                    }
                ],
                "volumes": [{"name": "work", "persistentVolumeClaim": {"claimName": "work"}}],
            }
        }

    specs = {"Worker": {"replicas": workers, "restartPolicy": policy, "template": pod(args)}}
    if chief:
        specs["Chief"] = {"replicas": 1, "restartPolicy": policy, "template": pod(args)}
    spec = {"runPolicy": run_policy or {}, "tfReplicaSpecs": specs}
    if success_policy:
        spec["successPolicy"] = success_policy
    docs = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings"},
            "data": {"STATE_DIR": "/mnt/work/state", "TRAINER_DATASET": "fashion_mnist"},
        },
        {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": "demo"}, "spec": spec},
    ]
    if prepare_args is not None:
        job_pod = pod(prepare_args)
        job_pod["spec"]["containers"][0]["name"] = "prepare"
        docs.append(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "demo-prepare-data"},
                "spec": {"template": job_pod},
            }
        )
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


class Run:
    """The runner as a user starts it, its console going to a file (a pipe would outlive a killed runner)."""

    def __init__(self, tmp_path: pathlib.Path, manifest_path: pathlib.Path, *extra: str):
        self.job_dir = tmp_path / "job"
        self.state = self.job_dir / "state"
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.console_path = tmp_path / "console.txt"
        with self.console_path.open("w") as console:
            self.proc = subprocess.Popen(
                [sys.executable, *RUNNER, "--manifest", str(manifest_path), "--job-dir", str(self.job_dir), *extra],
                stdout=console,
                stderr=subprocess.STDOUT,
                cwd=ROOT,
            )

    def wait(self, timeout: float = 60) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"runner still running after {timeout} s:\n{self.console}") from None

    @property
    def console(self) -> str:
        return self.console_path.read_text()

    @property
    def status(self) -> dict:
        return json.loads((self.job_dir / "run-local" / "demo.status.json").read_text())

    def pid(self, task: str, kind: str = "pid", timeout: float = 30) -> int:
        path = self.state / f"{task}.{kind}"
        deadline = time.monotonic() + timeout
        while not (path.exists() and path.read_text().strip()):
            assert time.monotonic() < deadline, f"{task} never wrote {path.name}:\n{self.console}"
            time.sleep(0.02)
        return int(path.read_text())

    def starts(self, task: str) -> int:
        path = self.state / f"{task}.starts"
        return len(path.read_text().split()) if path.exists() else 0

    def recorded_pids(self) -> list[int]:
        """Every replica process and child process any start of this job recorded."""
        pids = [int(p) for f in self.state.glob("*.starts") for p in f.read_text().split()]
        return pids + [int(f.read_text()) for f in self.state.glob("*.child.pid")]


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def live_group_members(pgid: int) -> list[int]:
    """Processes of a process group that still run (this machine's init may leave zombies unreaped)."""
    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            pass
    return members


def assert_all_gone(pids: list[int], within_s: float = 10) -> None:
    assert pids, "the test recorded no process to check"
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if alive(p)]}"
        time.sleep(0.05)


def test_replica_exiting_1_under_exit_code_fails_the_job_and_leaves_no_process(tmp_path):
    run = Run(
        tmp_path,
        manifest(tmp_path, ["--exit-always", "worker-1=1", "--sleep", "60", "--sleep-task", "worker-1=0", "--child"]),
    )
    assert run.wait() == 1
    status = run.status
    assert status["state"] == "Failed"
    assert status["condition"]["message"] == "TFJob default/demo has failed because 1 Worker replica(s) failed."
    assert status["failed_replica"] == "worker-1"
    assert status["replicas"]["worker-0"]["phase"] == "Stopped"
    assert "last 20 lines of worker-1's log" in run.console
    assert re.search(r"^worker-1 +\| worker-1 exiting with 1$", run.console, re.M)
    assert_all_gone(run.recorded_pids(), within_s=2)


@pytest.mark.parametrize("ignores_sigterm, stopped_with", [(False, 128 + signal.SIGTERM), (True, 128 + signal.SIGKILL)])
def test_clean_pod_policy_running_stops_the_peers_of_a_worker_that_exits_2(tmp_path, ignores_sigterm, stopped_with):
    # The operator deletes a failed job's running pods under cleanPodPolicy Running: SIGTERM, then SIGKILL.
    args = ["--exit-always", "worker-1=2", "--sleep", "60", "--sleep-task", "worker-1=0.5", "--child"]
    run = Run(
        tmp_path,
        manifest(
            tmp_path,
            args + (["--ignore-sigterm"] if ignores_sigterm else []),
            grace_s=1,
            run_policy={"cleanPodPolicy": "Running"},
        ),
    )
    assert run.wait(timeout=30) == 1
    status = run.status
    assert status["state"] == "Failed" and status["failed_replica"] == "worker-1"
    assert "cleanPodPolicy Running: deleting the running replicas worker-0" in run.console
    assert ("did not stop within its grace period; SIGKILL" in run.console) == ignores_sigterm
    assert status["replicas"]["worker-0"]["phase"] == "Stopped"
    assert status["replicas"]["worker-0"]["last_exit"] == stopped_with, status
    assert_all_gone(run.recorded_pids(), within_s=2)


def test_replica_killed_with_sigkill_under_exit_code_is_recreated_and_the_job_succeeds(tmp_path):
    # worker-0 finishes only once worker-1 has started twice; worker-1's first start would wait forever.
    run = Run(tmp_path, manifest(tmp_path, ["--wait-starts", "worker-1=2"], success_policy="AllWorkers"))
    os.kill(run.pid("worker-1"), signal.SIGKILL)
    assert run.wait() == 0, run.console
    status = run.status
    assert status["state"] == "Succeeded"
    assert status["replicas"]["worker-1"]["recreations"] == 1
    assert status["replicas"]["worker-1"]["exit_codes"] == [137, 0]
    assert "Restarting: TFJob demo is restarting because Worker replica(s) failed." in run.console
    assert run.starts("worker-0") == 1 and run.starts("worker-1") == 2


def test_replica_killed_with_sigkill_under_on_failure_is_restarted_in_place(tmp_path):
    run = Run(
        tmp_path,
        manifest(tmp_path, ["--wait-starts", "worker-1=2"], policy="OnFailure", run_policy={"backoffLimit": 3}),
    )
    os.kill(run.pid("worker-1"), signal.SIGKILL)
    assert run.wait() == 0, run.console
    replica = run.status["replicas"]["worker-1"]
    assert replica["in_place_restarts"] == 1 and replica["recreations"] == 0
    assert "restarted in place by the kubelet (OnFailure)" in run.console
    assert (
        "--- container restarted by the kubelet (restart 1) ---"
        in (run.job_dir / "run-local/logs/worker-1.log").read_text()
    )


def test_backoff_limit_stops_a_crash_looping_job(tmp_path):
    run = Run(
        tmp_path,
        manifest(
            tmp_path,
            ["--exit-always", "worker-1=1", "--sleep", "30", "--sleep-task", "worker-1=0"],
            policy="OnFailure",
            run_policy={"backoffLimit": 1},
        ),
    )
    assert run.wait() == 1
    assert (
        run.status["condition"]["message"] == "Job demo has failed because it has reached the specified backoff limit"
    )
    assert_all_gone(run.recorded_pids(), within_s=2)


def test_active_deadline_fails_a_job_that_runs_too_long(tmp_path):
    run = Run(tmp_path, manifest(tmp_path, ["--sleep", "60"], run_policy={"activeDeadlineSeconds": 1}))
    assert run.wait() == 1
    assert (
        run.status["condition"]["message"] == "Job demo has failed because it was active longer than specified deadline"
    )
    assert_all_gone(run.recorded_pids(), within_s=2)


def test_success_policies_default_and_all_workers(tmp_path):
    # worker-0 succeeds at once; worker-1 fails a second later.
    args = ["--sleep-task", "worker-1=1", "--exit-always", "worker-1=7"]
    default = Run(tmp_path / "a", manifest(tmp_path, args))
    assert default.wait() == 0 and default.status["state"] == "Succeeded"
    all_workers = Run(tmp_path / "b", manifest(tmp_path, args, success_policy="AllWorkers"))
    assert all_workers.wait() == 1 and all_workers.status["failed_replica"] == "worker-1"


def test_with_a_chief_the_chief_decides_and_a_single_replica_gets_no_tf_config(tmp_path):
    chief = Run(tmp_path / "a", manifest(tmp_path, ["--exit-always", "worker-0=0"], workers=1, chief=True))
    assert chief.wait() == 0
    assert '"cluster":{"chief":["127.0.0.1:' in chief.console and "chief-0 start 1" in chief.console
    single = Run(tmp_path / "b", manifest(tmp_path, []), "--workers", "1")
    assert single.wait() == 0
    assert "single start 1 TF_CONFIG=None" in single.console


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_sigint_or_sigterm_to_the_runner_stops_every_replica(tmp_path, signum, code):
    run = Run(tmp_path, manifest(tmp_path, ["--sleep", "60", "--child"]))
    groups = [run.pid(f"worker-{i}") for i in range(2)]
    children = [run.pid(f"worker-{i}", "child.pid") for i in range(2)]
    run.proc.send_signal(signum)
    assert run.wait(timeout=15) == code
    assert f"{signal.Signals(signum).name}: stopping every replica" in run.console
    assert_all_gone(groups + children, within_s=1)
    assert [live_group_members(pgid) for pgid in groups] == [[], []]


def test_a_replica_that_ignores_sigterm_is_killed_after_its_grace_period(tmp_path):
    run = Run(tmp_path, manifest(tmp_path, ["--sleep", "60", "--ignore-sigterm"], grace_s=1))
    pids = [run.pid(f"worker-{i}") for i in range(2)]
    run.proc.send_signal(signal.SIGINT)
    assert run.wait(timeout=15) == 130
    assert "did not stop within its grace period; SIGKILL" in run.console
    assert_all_gone(pids, within_s=1)


def test_a_crashed_runner_leaves_no_training_process_behind(tmp_path):
    run = Run(tmp_path, manifest(tmp_path, ["--sleep", "60", "--child"]))
    replicas = [run.pid(f"worker-{i}") for i in range(2)]
    # The children are not the runner's children, so PR_SET_PDEATHSIG cannot reach them: the watchdog must.
    children = [run.pid(f"worker-{i}", "child.pid") for i in range(2)]
    run.proc.kill()
    run.proc.wait()
    assert_all_gone(replicas + children, within_s=10)


def test_data_preparation_runs_first_for_a_real_dataset_and_not_for_synthetic(tmp_path):
    prepare = ["--exit-always", "single=0"]
    real = Run(tmp_path / "a", manifest(tmp_path, ["--wait-starts", "single=1"], prepare_args=prepare))
    assert real.wait() == 0, real.console
    assert real.console.index("prepare-data | single start 1") < real.console.index("| worker-0 start 1")
    synthetic = Run(tmp_path / "b", manifest(tmp_path, [], prepare_args=prepare), "--dataset", "synthetic")
    assert synthetic.wait() == 0
    assert "prepare-data |" not in synthetic.console and "DATASET=synthetic" in synthetic.console


def test_a_failed_data_preparation_stops_before_the_tfjob(tmp_path):
    run = Run(tmp_path, manifest(tmp_path, [], prepare_args=["--exit-always", "single=1"]))
    assert run.wait() == 1
    assert "did not succeed; the TFJob is not started" in run.console
    assert not re.search(r"^worker-0 +\|", run.console, re.M)


def test_an_unresolvable_reference_stops_the_run_before_anything_starts(tmp_path):
    path = manifest(tmp_path, [])
    docs = list(yaml.safe_load_all(path.read_text()))
    docs[0]["metadata"]["name"] = "settings-5fk8h2m9tc"
    path.write_text(yaml.safe_dump_all(docs))
    run = Run(tmp_path, path)
    assert run.wait() == 2
    assert "no ConfigMap named 'settings'" in run.console and "CreateContainerConfigError" in run.console
    assert not run.state.exists()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_a_replica_dies_with_its_runner_even_without_the_watchdog(tmp_path):
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import time; from scripts.common.processes import spawn; "
                "p = spawn(['sleep', '60'], {'PATH': '/usr/bin:/bin'}, '/'); print(p.pid, flush=True); time.sleep(60)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    child = int(parent.stdout.readline())
    assert alive(child)
    parent.kill()
    parent.wait()
    assert_all_gone([child], within_s=2)


def test_clean_refuses_a_directory_run_local_did_not_make(tmp_path):
    (tmp_path / "job" / "precious").mkdir(parents=True)
    run = Run(tmp_path, manifest(tmp_path, []), "--clean")
    assert run.wait() == 2
    assert "was not made by run-local" in run.console and (tmp_path / "job" / "precious").exists()
