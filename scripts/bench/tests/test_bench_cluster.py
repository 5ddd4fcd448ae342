"""make bench-cluster (scripts/bench/cluster_links.py) without a cluster: the commands each run issues, answered by a
stand-in for the local two-node cluster and a stand-in for the network namespaces; the link set back and the
namespace deleted however the phase ends; the refusals that name the fix; the table's arithmetic."""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import tempfile

import pytest

from scripts.bench import cluster_links, links
from scripts.bench.runs import BenchError

ROOT = pathlib.Path(__file__).resolve().parents[3]
CONTEXT, NAMESPACE = "node-distml", "bench-links"
NODES = ("distml", "distml-agent")
TBF = {"1gbit": "rate 1Gbit burst 125000b lat 100ms", "100mbit": "rate 100Mbit burst 64Kb lat 100ms"}
# Examples/s each stand-in run reports: (side, rate, workers) -> figure.
SPEEDS = {
    ("cluster", "unlimited", 1): 5000.0,
    ("cluster", "unlimited", 2): 8000.0,
    ("cluster", "100mbit", 1): 5000.0,
    ("cluster", "100mbit", 2): 2500.0,
    ("netns", "unlimited", 1): 5500.0,
    ("netns", "unlimited", 2): 9350.0,
    ("netns", "100mbit", 1): 5500.0,
    ("netns", "100mbit", 2): 2750.0,
}


def variables(argv: list[str]) -> dict[str, str]:
    return dict(word.split("=", 1) for word in argv if "=" in word and not word.startswith("-"))


class FakeCluster:
    """Answers the bench's make and kubectl calls as the local two-node cluster would, and records each argv. fail:
    (a word of the argv, an exit code or an exception) for the call that fails; ready: the nodes that are Ready."""

    def __init__(self, fetched: pathlib.Path, fail: tuple[str, int | BaseException] | None = None) -> None:
        self.fetched = fetched
        self.fail = fail
        self.ready = NODES
        self.contexts = [CONTEXT, "k3d-distml"]
        self.one_node_for_two = False
        self.calls: list[list[str]] = []

    def __call__(self, argv: list[str], log: pathlib.Path, timeout: float) -> int:
        self.calls.append(argv)
        if self.fail and self.fail[0] in argv:
            failure = self.fail[1]
            if isinstance(failure, BaseException):
                raise failure
            log.write_text("error: it failed\n")
            return failure
        log.write_text(self.answer(argv))
        return 0

    def answer(self, argv: list[str]) -> str:
        given = variables(argv)
        if argv[0] == "kubectl":
            words = argv[3:] if argv[1] == "--context" else argv[1:]
            if words[:2] == ["config", "get-contexts"]:
                return "".join(f"{name}\n" for name in self.contexts)
            if words[:2] == ["get", "nodes"]:
                return json.dumps({"items": [node(name) for name in self.ready]})
            if words[:2] == ["get", "serviceaccount"]:
                return "serviceaccount/default\n"
            if words[:2] == ["get", "pods"]:
                job = words[words.index("-l") + 1].rsplit("=", 1)[1]
                on = [NODES[0]] * 2 if self.one_node_for_two else list(NODES)
                return json.dumps({"items": [{"spec": {"nodeName": name}} for name in on[: workers_of(job)]]})
            return ""  # get namespace (none), create and delete namespace
        target = argv[-1 - len(given)]
        if target == "link-rate":
            rate = given["NODE_LINK_RATE"]
            ends = ("distml-agent", "eth0")
            if not rate:
                return "the link: unlimited\n" + "".join("qdisc noqueue 0: root refcnt 2\n" for _ in ends)
            return f"the link: {rate}\n" + "".join(f"qdisc tbf 8001: root refcnt 2 {TBF[rate]}\n" for _ in ends)
        if target == "fetch-model":
            job = given["JOB_NAME"]
            rate, workers = job.split("-")[1], workers_of(job)
            self.fetched.mkdir(parents=True, exist_ok=True)
            (self.fetched / "metrics.json").write_text(
                json.dumps(
                    {
                        "examples_per_second": SPEEDS[("cluster", rate, workers)],
                        "time_to_first_step_seconds": 6.0,
                        "workers": workers,
                        "global_batch_size": 64 * workers,
                        "config": {"model_dir": f"/mnt/training/models/{job}", "threads": 1},
                    }
                )
            )
        return ""


def node(name: str) -> dict:
    return {"metadata": {"name": name}, "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}


def workers_of(job: str) -> int:
    return int(job.split("-")[2].removesuffix("w"))


class FakeLink:
    """The linked namespaces: the rates set, whether the phase is inside them."""

    addresses = ("10.213.0.1", "10.213.0.2")

    def __init__(self) -> None:
        self.rates: list[float | None] = []
        self.inside = False

    def set_rate(self, rate_bits: float | None) -> None:
        self.rates.append(rate_bits)

    def qdiscs(self) -> list[str]:
        return [f"qdisc at {self.rates[-1]}"] * 2

    def run_in(self, index: int, argv: list[str]) -> list[str]:
        return ["in", str(index), *argv]

    @contextlib.contextmanager
    def linked(self):
        self.inside = True
        try:
            yield self
        finally:
            self.inside = False


class FakeMachine:
    """The namespace runs: each trainer run's workers, flags and placement, at the rate the link has then."""

    def __init__(self, link: FakeLink, fail: BaseException | None = None) -> None:
        self.link = link
        self.fail = fail
        self.runs: list[dict] = []

    def trainer_run(self, program, workers, per_worker, args, run_dir, extra_flags=None, placement=None) -> dict:
        rate = next(name for name, bits in links.RATES.items() if bits == self.link.rates[-1])
        self.runs.append({"workers": workers, "per_worker": per_worker, "flags": extra_flags, "placement": placement})
        if self.fail is not None:
            raise self.fail
        argv = placement.wrap(workers - 1, ["python"])
        return {"examples_per_second": SPEEDS[("netns", rate, workers)], "background_cpu_share": 0.0, "argv": argv}

    def side(self) -> cluster_links.NetnsSide:
        return cluster_links.NetnsSide(lambda: None, self.link.linked, self.trainer_run)


@pytest.fixture
def stand_ins(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    fake = FakeCluster(tmp_path / "artifacts" / "model")
    cluster = cluster_links.Cluster(CONTEXT, NAMESPACE, logs, fetched=fake.fetched, run=fake)
    link = FakeLink()
    return fake, cluster, link, FakeMachine(link)


def tiny_args(*extra: str):
    return cluster_links.parse_args(["--rates", "unlimited,100mbit", "--steps", "400", *extra])


def make_call(target: str, **given: str) -> list[str]:
    return ["make", "--no-print-directory", *(["-o", "image"] if target == "submit" else []), target] + [
        f"{key}={value}" for key, value in given.items()
    ]


def claim() -> dict[str, str]:
    return {
        "VOLUME_CLAIM": "bench-volume",
        "VOLUME_ACCESS_MODE": "ReadWriteMany",
        "VOLUME_STORAGE_CLASS": "local-path-shared",
    }


def submit_call(job: str, workers: int, steps: int = 400) -> list[str]:
    flags = f"--train-examples {steps * 64 * workers} --test-examples {64 * workers} --per-worker-batch-size 64 "
    flags += "--log-every 48 --checkpoint-every 0 --threads 1"
    return make_call(
        "submit", KUBE_CONTEXT=CONTEXT, NAMESPACE=NAMESPACE, JOB_NAME=job, **claim(), STRATEGY="sync",
        WORKERS=str(workers), WORKER_CPU_REQUEST="1", SPREAD_OVER_NODES="1", DATASET="synthetic", EPOCHS="1",
        ARGS=flags,
    )  # fmt: skip


def kubectl(*words: str) -> list[str]:
    return ["kubectl", "--context", CONTEXT, *words]


def test_a_round_sets_each_rate_then_runs_one_worker_and_two_on_the_cluster_then_in_the_namespaces(stand_ins):
    fake, cluster, link, machine = stand_ins
    phase = cluster_links.run_phase(tiny_args("--repeats", "1"), cluster, machine.side())

    per_rate = []
    for rate, tc in (("unlimited", ""), ("100mbit", "100mbit")):
        jobs = [f"links-{rate}-1w-0", f"links-{rate}-2w-0"]
        per_rate += [make_call("link-rate", NODE_LINK_RATE=tc)]
        for job, workers in zip(jobs, (1, 2), strict=True):
            per_rate += [
                submit_call(job, workers),
                make_call("fetch-model", KUBE_CONTEXT=CONTEXT, NAMESPACE=NAMESPACE, JOB_NAME=job, **claim()),
                kubectl("get", "pods", "-n", NAMESPACE, "-l",
                        f"app.kubernetes.io/component=training,app.kubernetes.io/instance={job}", "-o", "json"),
            ]  # fmt: skip
    assert fake.calls == [
        ["kubectl", "config", "get-contexts", "-o", "name"],
        kubectl("get", "nodes", "-o", "json"),
        kubectl("get", "namespace", NAMESPACE, "--ignore-not-found", "-o", "name"),
        make_call("image"),
        kubectl("create", "namespace", NAMESPACE),
        kubectl("get", "serviceaccount", "default", "-n", NAMESPACE, "--ignore-not-found", "-o", "name"),
        *per_rate,
        make_call("link-rate", NODE_LINK_RATE=""),
        kubectl("delete", "namespace", NAMESPACE, "--timeout=300s"),
    ]
    # Beside each rate's cluster runs, the namespaces at the same rate: the trainer alone on core 0, then two workers
    # each in its namespace on its own core, at the trainer's defaults and one thread, the same per-worker batch.
    assert link.rates == [None, 100e6] and not link.inside
    assert [(run["workers"], run["per_worker"], run["flags"]) for run in machine.runs] == [
        (1, 64, ["--threads", "1"]),
        (2, 64, ["--threads", "1"]),
    ] * 2
    assert machine.runs[0]["placement"] is links.ALONE_ON_CORE
    assert [run["argv"] for run in phase["runs"] if run["variant"] == "netns_two_namespaces"] == [
        ["in", "1", "taskset", "-c", "1", "python"]
    ] * 2
    assert [(run["rate"], run["variant"]) for run in phase["runs"]] == [
        (rate, variant)
        for rate in ("unlimited", "100mbit")
        for variant in ("cluster_alone", "cluster_two_nodes", "netns_alone", "netns_two_namespaces")
    ]
    two_nodes = phase["runs"][1]
    assert two_nodes["nodes"] == list(NODES) and two_nodes["examples_per_second"] == 8000.0
    assert two_nodes["job"] == "links-unlimited-2w-0" and two_nodes["round"] == 0
    assert phase["qdiscs"]["cluster"]["100mbit"] == [f"qdisc tbf 8001: root refcnt 2 {TBF['100mbit']}"] * 2
    assert phase["qdiscs"]["netns"]["100mbit"] == ["qdisc at 100000000.0"] * 2
    assert phase["left"] == []


def test_the_submit_variables_reach_make_submits_command_line():
    """make itself, dry run: the bench's variables become the job's settings and the trainer's flags."""
    args = tiny_args()
    cluster = cluster_links.Cluster(CONTEXT, NAMESPACE, pathlib.Path("unused"))
    given = cluster_links.submit_variables(cluster, args, "links-1gbit-2w-0", 2)
    argv = ["make", "--no-print-directory", "-n", "-o", "image", "submit", *(f"{k}={v}" for k, v in given.items())]
    planned = subprocess.run(argv, cwd=ROOT, env=cluster_links.make_environment(), capture_output=True, text=True)
    assert planned.returncode == 0, planned.stderr
    line = next(line for line in planned.stdout.splitlines() if "scripts.cluster.submit" in line)
    words = shlex.split(line)
    for setting in ("KUBE_CONTEXT=node-distml", "NAMESPACE=bench-links", "JOB_NAME=links-1gbit-2w-0",
                    "WORKER_CPU_REQUEST=1", "SPREAD_OVER_NODES=1", "VOLUME_CLAIM=bench-volume",
                    "VOLUME_ACCESS_MODE=ReadWriteMany", "VOLUME_STORAGE_CLASS=local-path-shared"):  # fmt: skip
        assert setting in words, setting
    assert line.split("scripts.cluster.submit ")[1].split() == [
        "--kustomize", "k8s/engines/tfjob/sync", "--image", line.split("--image ")[1].split()[0], "--workers", "2",
        "--dataset", "synthetic", "--epochs", "1", "--",
        "--train-examples", "51200", "--test-examples", "128", "--per-worker-batch-size", "64", "--log-every", "48",
        "--checkpoint-every", "0", "--threads", "1",
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("fail", "says"),
    [
        (
            ("JOB_NAME=links-unlimited-2w-0", 1),
            "cluster, unlimited cluster_two_nodes, round 1 (job links-unlimited-2w-0): make submit exited with code 1; "
            "its log is {logs}/links-unlimited-2w-0-submit.log",
        ),
        (
            ("JOB_NAME=links-unlimited-1w-0", 124),
            "cluster, unlimited cluster_alone, round 1 (job links-unlimited-1w-0): make submit did not finish within "
            "900 s; its log is {logs}/links-unlimited-1w-0-submit.log",
        ),
        (("JOB_NAME=links-unlimited-1w-0", KeyboardInterrupt()), None),
        ("netns", "separate machines, unlimited netns_alone: worker 0 exited with code 1"),
        ("one node", "the two workers ran on distml, distml, not on two nodes: is each node schedulable?"),
    ],
    ids=["a failed submit", "a hung submit", "ctrl-c", "a failed namespace run", "both workers on one node"],
)
def test_however_the_phase_ends_the_link_is_unlimited_again_and_the_namespace_deleted(stand_ins, fail, says):
    fake, cluster, link, machine = stand_ins
    if fail == "netns":
        machine.fail = BenchError("worker 0 exited with code 1")
    elif fail == "one node":
        fake.one_node_for_two = True
    else:
        fake.fail = fail
    expected = KeyboardInterrupt if says is None else BenchError
    with pytest.raises(expected) as stopped:
        cluster_links.run_phase(tiny_args(), cluster, machine.side())
    if says is not None:
        message = str(stopped.value)
        assert says.format(logs=cluster.logs) in message and "\n" not in message, message
    assert fake.calls[-2:] == [
        make_call("link-rate", NODE_LINK_RATE=""),
        kubectl("delete", "namespace", NAMESPACE, "--timeout=300s"),
    ]
    assert not link.inside


def test_a_link_that_cannot_be_set_back_is_said_with_the_command_and_fails_the_bench_after_its_figures(
    stand_ins, tmp_path, monkeypatch, capsys
):
    fake, cluster, link, machine = stand_ins
    answer = fake.answer

    def unlimited_fails(argv):
        if "NODE_LINK_RATE=" in argv:
            return "qdisc tbf 8001: root refcnt 2 rate 1Gbit\n" * 2
        return answer(argv)

    fake.answer = unlimited_fails
    phase = cluster_links.run_phase(tiny_args("--rates", "100mbit", "--repeats", "1"), cluster, machine.side())
    (left,) = phase["left"]
    assert left.startswith("the link at unlimited: make link-rate left") and len(phase["runs"]) == 4
    assert left.endswith("; set it back as root: make link-rate NODE_LINK_RATE=")
    assert f"warning: {left}" in capsys.readouterr().err
    assert fake.calls[-1] == kubectl("delete", "namespace", NAMESPACE, "--timeout=300s")
    # The figures are written all the same, and the bench exits 1 keeping its logs.
    monkeypatch.setattr(cluster_links, "run_phase", lambda args, cluster: phase)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(signal, "signal", lambda *_: None)
    assert cluster_links.main(["--rates", "100mbit", "--output-dir", str(tmp_path / "out")]) == 1
    assert (tmp_path / "out" / "cluster-links.json").exists() and list(tmp_path.glob("bench-cluster-*"))
    assert "error: the bench did not clean up after itself" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ("no context", "no kube context node-distml in your kubeconfig: the local cluster is not up. Bring it up with "
                       "two nodes first, as root: make cluster-up NODES=2"),
        ("one node", "the cluster at node-distml has 1 ready node(s) (distml); two workers on two nodes need two: "
                     "make cluster-up NODES=2 (as root) adds the agent node"),
        ("no root", "the namespace runs and the link rate cannot be set here: making network namespaces needs root"),
        ("a link rate", "NODE_LINK_RATE=1gbit: the bench sets the link's rate itself"),
        ("namespace there", "the namespace bench-links exists already (an earlier bench-cluster stopped before its "
                            "cleanup?): delete it (kubectl --context node-distml delete namespace bench-links)"),
    ],
)  # fmt: skip
def test_the_phase_refuses_before_it_changes_anything_naming_the_fix(stand_ins, monkeypatch, change, says):
    fake, cluster, link, machine = stand_ins
    side = machine.side()
    answer = fake.answer
    if change == "no context":
        fake.contexts = ["k3d-distml"]
    elif change == "one node":
        fake.ready = NODES[:1]
    elif change == "no root":
        side = cluster_links.NetnsSide(lambda: "making network namespaces needs root", link.linked, machine.trainer_run)
    elif change == "a link rate":
        monkeypatch.setenv("NODE_LINK_RATE", "1gbit")
    else:
        fake.answer = lambda argv: "namespace/bench-links\n" if "namespace" in argv[3:5] else answer(argv)
    with pytest.raises(BenchError) as stopped:
        cluster_links.run_phase(tiny_args(), cluster, side)
    assert says in str(stopped.value)
    assert not [call for call in fake.calls if call[0] == "make" or "create" in call or "delete" in call]
    assert link.rates == [] and machine.runs == []


def test_without_the_clusters_context_the_bench_says_how_to_bring_it_up_and_exits_1(tmp_path):
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n")
    environment = {**os.environ, "KUBECONFIG": str(kubeconfig), "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        [sys.executable, "-m", "scripts.bench.cluster_links"], cwd=ROOT, env=environment, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    assert "error: no kube context node-distml in your kubeconfig: the local cluster is not up" in result.stderr
    assert "make cluster-up NODES=2" in result.stderr
    # Nothing ran but the question: no make, no namespace.
    (logs,) = tmp_path.glob("bench-cluster-*")
    assert sorted(path.name for path in logs.iterdir()) == ["contexts.log"]


def test_bad_rates_are_refused_with_the_choices(capsys):
    with pytest.raises(SystemExit) as stopped:
        cluster_links.parse_args(["--rates", "1gbit,2gbit"])
    assert stopped.value.code == 2
    assert "--rates: unknown 2gbit; choose from unlimited, 10gbit, 1gbit, 100mbit" in capsys.readouterr().err


def run(rate: str, variant: str, round_index: int, examples_per_second: float) -> dict:
    return {"rate": rate, "variant": variant, "round": round_index, "examples_per_second": examples_per_second}


def test_the_table_gives_each_sides_efficiency_within_each_round_as_its_median_and_range(capsys):
    runs = [
        # Listed out of round order: each round's pair is set against the same round's single worker.
        run("1gbit", "cluster_alone", 1, 1100.0),
        run("1gbit", "cluster_alone", 0, 1000.0),
        run("1gbit", "cluster_two_nodes", 0, 1800.0),
        run("1gbit", "cluster_two_nodes", 1, 1650.0),
        run("1gbit", "netns_alone", 0, 1200.0),
        run("1gbit", "netns_alone", 1, 1000.0),
        run("1gbit", "netns_two_namespaces", 0, 2160.0),
        run("1gbit", "netns_two_namespaces", 1, 1900.0),
    ]
    (row,) = cluster_links.summarize({"rates": ["1gbit"], "runs": runs})
    cluster, namespaces = row["cluster"], row["netns"]
    assert row["rate"] == "1gbit"
    assert cluster["alone_examples_per_second"]["values"] == [1000.0, 1100.0]
    assert cluster["two_examples_per_second"]["median"] == pytest.approx(1725.0)
    assert cluster["efficiency"]["values"] == pytest.approx([0.9, 0.75])
    assert (cluster["efficiency"]["median"], cluster["efficiency"]["min"], cluster["efficiency"]["max"]) == (
        pytest.approx(0.825), pytest.approx(0.75), pytest.approx(0.9)
    )  # fmt: skip
    assert namespaces["efficiency"]["values"] == pytest.approx([0.9, 0.95])
    assert namespaces["efficiency"]["median"] == pytest.approx(0.925)
    cluster_links.print_table([row])
    printed = capsys.readouterr().out.splitlines()
    assert printed[-1].split() == [
        "1gbit", "1,050", "(1,000-1,100)", "1,725", "(1,650-1,800)", "0.82", "(0.75-0.90)", "0.93", "(0.90-0.95)"
    ]  # fmt: skip


def test_the_phases_figures_from_stand_in_runs_are_what_they_reported(stand_ins):
    fake, cluster, link, machine = stand_ins
    phase = cluster_links.run_phase(tiny_args("--repeats", "2"), cluster, machine.side())
    table = {row["rate"]: row for row in cluster_links.summarize(phase)}
    assert table["unlimited"]["cluster"]["efficiency"]["values"] == [0.8, 0.8]
    assert table["unlimited"]["netns"]["efficiency"]["median"] == pytest.approx(0.85)
    assert table["100mbit"]["cluster"]["efficiency"]["median"] == pytest.approx(0.25)
    assert table["100mbit"]["netns"]["two_examples_per_second"]["values"] == [2750.0, 2750.0]
    assert [run["job"] for run in phase["runs"] if "job" in run] == [
        f"links-{rate}-{workers}w-{round_index}"
        for round_index in (0, 1)
        for rate in ("unlimited", "100mbit")
        for workers in (1, 2)
    ]


def test_the_bench_writes_the_table_its_settings_and_every_run_then_removes_its_logs(
    stand_ins, tmp_path, monkeypatch, capsys
):
    fake, cluster, link, machine = stand_ins
    phase = cluster_links.run_phase(tiny_args("--repeats", "1"), cluster, machine.side())
    monkeypatch.setattr(cluster_links, "run_phase", lambda args, cluster: phase)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # this process's handlers stay pytest's
    assert cluster_links.main(["--rates", "unlimited,100mbit", "--output-dir", str(tmp_path / "out")]) == 0
    written = json.loads((tmp_path / "out" / "cluster-links.json").read_text())
    assert [row["rate"] for row in written["table"]] == ["unlimited", "100mbit"]
    assert written["table"][1]["cluster"]["efficiency"]["median"] == pytest.approx(0.25)
    assert len(written["runs"]) == 8 and written["qdiscs"] == phase["qdiscs"]
    submit = written["config"]["cluster"]["make_submit"]["2"]
    assert submit["JOB_NAME"] == "links-<rate>-2w-<round>" and submit["WORKER_CPU_REQUEST"] == "1"
    assert written["config"]["netns"]["trainer_flags"] == ["--threads", "1"]
    assert "cluster efficiency" in capsys.readouterr().out
    assert not list(tmp_path.glob("bench-cluster-*"))


def test_the_pods_cpu_request_is_a_flag_for_a_cluster_whose_node_0_holds_the_add_ons(tmp_path):
    cluster = cluster_links.Cluster("node-distml", "bench-links", tmp_path)
    assert cluster_links.submit_variables(cluster, tiny_args(), "job", 2)["WORKER_CPU_REQUEST"] == "1"
    lowered = cluster_links.submit_variables(cluster, tiny_args("--cpu-request", "500m"), "job", 2)
    assert lowered["WORKER_CPU_REQUEST"] == "500m"
