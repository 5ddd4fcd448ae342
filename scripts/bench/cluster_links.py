"""`make bench-cluster`: the separate-machines phase (scripts/bench/links.py) on the local two-node cluster (make
cluster-up NODES=2): one trainer worker alone against two workers, one on each node, over the agent node's link at
each rate, beside the same phase's network namespaces on this machine.

Per round (`--repeats`, default 2), for each rate of `--rates` (default unlimited, 1 Gbit/s, 100 Mbit/s): the agent's
link set to the rate (`make link-rate`: tbf each way, as cluster-up sets it) and the namespaces' veth pair to the same
(netns.py), then, interleaved:
  cluster_alone         make submit WORKERS=1: one worker pod, on whichever node the scheduler picks
  cluster_two_nodes     make submit WORKERS=2: a worker pod on each node (spread), on a ReadWriteMany claim
  netns_alone           the trainer alone on core 0, as links.py runs it
  netns_two_namespaces  two workers, each in its own namespace and on its own core, over the veth pair at the rate
all at the trainer's defaults (links.py's defaults variant), on synthetic data, for the same steps at the same
per-worker batch. Every figure is the chief's steady examples/s, the warm-up (the first --warmup-steps) left out: a
cluster run's from the metrics.json `make fetch-model` copies out, so the pods' start-up is not in it. Efficiency =
two workers' examples/s / (2 x one alone), within each round and rate; the table gives its median and range over the
rounds, for the cluster and for the namespaces.

One CPU per worker on both sides, as near as the template allows: each pod requests 1 CPU (WORKER_CPU_REQUEST=1) and
runs TensorFlow's pools at one thread (--threads 1, the namespace runs' flag, which the bench checks in the fetched
metrics.json); each namespace worker is pinned to its core (taskset). What still differs:
- the pods are not pinned: a request is a share, not a bound, and their CPU limit stays the template's 2
  (k8s/base/trainer-pod.yaml; no setting changes it), so a worker's threads outside TensorFlow's pools (tf.data's,
  gRPC's) may use the other core, and while more than two cores' work waits the nodes' cgroups share the cores out;
  the cluster's control plane runs beside both sides' runs;
- the path: pod, bridge, the node's routes and rules (kube-proxy's, kube-router's policy), the link, and the same on
  the other node, against one veth pair between two namespaces; the tbf settings are the same;
- the pods run the image's TensorFlow build (tensorflow-cpu by default), the namespace runs this venv's;
- the cluster runs are minutes apart (a submit, then a fetch), the namespace runs seconds.

The cluster side keeps to a namespace of its own (`--namespace`: created, and deleted with everything in it at the
end), a fresh JOB_NAME per run, and a claim of its own on local-path-shared; the image is built once (`make image`)
and every submit takes it as built. `make fetch-model` replaces ./artifacts/model on each run. The link goes back to
unlimited at the end, whatever happens. Needs root (the link and the namespaces), the cluster's context (`--context`,
default node-CLUSTER_NAME) with two Ready nodes, and NODE_LINK_RATE empty; refuses otherwise, naming the fix.
Writes OUTPUT_DIR/cluster-links.json. Trainer flags for every run go after `--`:

    sudo make bench-cluster BENCH_ARGS="--repeats 3"
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from scripts.common import settings as project_settings
from scripts.common.cli import split_trainer_flags
from scripts.common.processes import inherited_environment, signal_group, spawn
from scripts.common.settings import ROOT
from scripts.common.volume_claim import schedulable_nodes
from trainer.base.atomic_file import write_json

from . import links, netns
from .bench import provenance
from .runs import BenchError, add_run_arguments, check_runs, command, read_report, run_once, spread

RATES = ("unlimited", "1gbit", "100mbit")
CLUSTER_ALONE, CLUSTER_PAIR = "cluster_alone", "cluster_two_nodes"
NETNS_ALONE, NETNS_PAIR = "netns_alone", "netns_two_namespaces"
# Each side's (one worker alone, two workers) runs.
SIDES = {"cluster": (CLUSTER_ALONE, CLUSTER_PAIR), "netns": (NETNS_ALONE, NETNS_PAIR)}
# The pods' CPU request: one core each, as each namespace worker is pinned to one.
CPU_REQUEST = "1"
# A claim both nodes mount (make cluster-up NODES=2's shared class), in the bench's namespace.
CLAIM = {
    "VOLUME_CLAIM": "bench-volume",
    "VOLUME_ACCESS_MODE": "ReadWriteMany",
    "VOLUME_STORAGE_CLASS": "local-path-shared",
}
# What make submit sets itself: DATASET=, EPOCHS= and the pod's TRAINER_MODEL_DIR (the job's folder on the claim).
SET_BY_SUBMIT = ("--dataset", "--epochs", "--model-dir")
# The pods of a job's workers, by the labels k8s/base/trainer-pod.yaml gives every engine's.
WORKER_PODS = "app.kubernetes.io/component=training,app.kubernetes.io/instance={job}"
MAKE = ["make", "--no-print-directory"]
# Seconds: a cached image build; a fetch; the namespace's default service account, which pods need, to appear; the
# namespace's deletion (its pods' grace, its claim's volume).
IMAGE_TIMEOUT, FETCH_TIMEOUT, ACCOUNT_TIMEOUT, DELETE_TIMEOUT = 1800.0, 300.0, 60.0, 300.0
TIMED_OUT, NOT_FOUND = 124, 127
# The environment make's own command line leaves for a make it runs; the bench's make calls start afresh.
MAKE_VARIABLES = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")

Runner = Callable[[list[str], pathlib.Path, float], int]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    argv = sys.argv[1:] if argv is None else list(argv)
    settings = project_settings.load()
    parser = argparse.ArgumentParser(
        prog="python -m scripts.bench.cluster_links",
        description=__doc__.split("\n\n")[0],
        epilog="Everything after -- is appended to every run's trainer flags, the cluster's and the namespaces'.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_run_arguments(
        parser,
        steps=800,
        repeats=2,
        batch_help="two workers' batch: each worker, alone too, gets half",
        repeats_help="rounds; each runs every rate's four runs in turn",
    )
    parser.add_argument(
        "--rates", default=",".join(RATES), help=f"comma-separated link rates, from {', '.join(links.RATES)}"
    )
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds before a run (a whole make submit) counts as hung"
    )
    parser.add_argument(
        "--context", default=f"node-{settings['CLUSTER_NAME']}", help="the local cluster's kube context"
    )
    parser.add_argument(
        "--namespace", default="bench-links", help="the bench's own namespace: made at the start, deleted at the end"
    )
    parser.add_argument(
        "--cpu-request",
        default=CPU_REQUEST,
        help="each worker pod's CPU request (lower it where the add-ons' controllers hold node 0's CPUs)",
    )
    parser.add_argument("--output-dir", type=pathlib.Path, default=ROOT / "bench", help="where cluster-links.json goes")
    ours, trainer_flags = split_trainer_flags(argv)
    args = parser.parse_args(ours)
    args.trainer_flags = trainer_flags
    check_runs(parser, args)
    rates = args.rates.split(",")
    unknown = [rate for rate in rates if rate not in links.RATES]
    if unknown or not args.rates:
        parser.error(f"--rates: unknown {', '.join(unknown) or 'empty list'}; choose from {', '.join(links.RATES)}")
    args.rates = rates
    # links.measure's: no run is repeated (the cluster's control plane is always among the other processes).
    args.link_quiet_retries = 0
    return args


# ---- the cluster's side: make targets and kubectl, each logged ---------------------------------------------------


def make_environment() -> dict[str, str]:
    """This shell's environment for a make the bench runs, as a user's shell would hand it: no TF_CONFIG or TRAINER_*
    (the settings files' values stand), nor the calling make's own command line."""
    return {key: value for key, value in inherited_environment().items() if key not in MAKE_VARIABLES}


def run_logged(argv: list[str], log: pathlib.Path, timeout: float) -> int:
    """argv from the repository's root in a session of its own, its output in LOG; its exit code (TIMED_OUT past
    TIMEOUT seconds, NOT_FOUND without the program). Killed with its children when it runs over or the bench stops;
    what it left on the cluster goes with the bench's namespace."""
    with log.open("w") as output:
        try:
            process = spawn(argv, make_environment(), str(ROOT), output)
        except FileNotFoundError:
            return NOT_FOUND
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return TIMED_OUT
        finally:
            if process.poll() is None:
                signal_group(process.pid, signal.SIGKILL)
                process.wait()


@dataclasses.dataclass
class Cluster:
    """The cluster's side: make targets with the bench's variables and kubectl on its context, each run by `run`
    (argv, log, timeout) -> exit code with its output in a log under `logs`. fetched: where make fetch-model copies
    a job's model directory."""

    context: str
    namespace: str
    logs: pathlib.Path
    fetched: pathlib.Path = ROOT / "artifacts" / "model"
    run: Runner = run_logged

    def make(self, target: str, variables: dict[str, str], log_name: str, what: str, timeout: float) -> str:
        """The target's output; a one-line BenchError naming WHAT and the log when it fails."""
        # The image is built once, first: each submit takes it as built, as the cluster suite's make calls do.
        as_built = ["-o", "image"] if target == "submit" else []
        argv = [*MAKE, *as_built, target, *(f"{key}={value}" for key, value in variables.items())]
        return self._run(argv, log_name, what, timeout, f"make {target}")

    def kubectl(
        self, *args: str, log_name: str, what: str, on_context: bool = True, timeout: float = FETCH_TIMEOUT
    ) -> str:
        argv = ["kubectl", *(["--context", self.context] if on_context else []), *args]
        return self._run(argv, log_name, what, timeout, f"kubectl {args[0]}")

    def get_json(self, *args: str, log_name: str, what: str) -> Any:
        """kubectl's JSON answer (a warning it printed beside it is skipped)."""
        output = self.kubectl(*args, "-o", "json", log_name=log_name, what=what)
        try:
            return json.JSONDecoder().raw_decode(output[output.index("{") :])[0]
        except ValueError:
            raise BenchError(f"{what}: no JSON in kubectl's answer; its log is {self.log(log_name)}") from None

    def log(self, log_name: str) -> pathlib.Path:
        return self.logs / f"{log_name}.log"

    def _run(self, argv: list[str], log_name: str, what: str, timeout: float, name: str) -> str:
        log = self.log(log_name)
        code = self.run(argv, log, timeout)
        if code == NOT_FOUND:
            raise BenchError(f"{what}: {argv[0]} is not installed or not on PATH")
        if code == TIMED_OUT:
            raise BenchError(f"{what}: {name} did not finish within {timeout:.0f} s; its log is {log}")
        if code != 0:
            raise BenchError(f"{what}: {name} exited with code {code}; its log is {log}")
        return log.read_text(errors="replace") if log.exists() else ""

    def common(self, job: str) -> dict[str, str]:
        """Every make call's variables for a job: the context, the bench's namespace and claim."""
        return {"KUBE_CONTEXT": self.context, "NAMESPACE": self.namespace, "JOB_NAME": job, **CLAIM}


def check_cluster(cluster: Cluster, unavailable: Callable[[], str | None]) -> None:
    """A BenchError naming the fix unless the context is in the kubeconfig, its cluster has two schedulable nodes, the
    namespaces can be made here (root, iproute2) and NODE_LINK_RATE is empty."""
    contexts = cluster.kubectl(
        "config", "get-contexts", "-o", "name", log_name="contexts", what="the cluster", on_context=False
    )
    if cluster.context not in contexts.split():
        raise BenchError(
            f"no kube context {cluster.context} in your kubeconfig: the local cluster is not up. Bring it up with two "
            f"nodes first, as root: make cluster-up NODES=2 (or name its context with --context)"
        )
    nodes = schedulable_nodes(cluster.get_json("get", "nodes", log_name="nodes", what="the cluster's nodes"))
    if len(nodes) < 2:
        raise BenchError(
            f"the cluster at {cluster.context} has {len(nodes)} ready node(s) ({', '.join(nodes) or 'none'}); two "
            f"workers on two nodes need two: make cluster-up NODES=2 (as root) adds the agent node"
        )
    reason = unavailable()
    if reason:
        raise BenchError(f"the namespace runs and the link rate cannot be set here: {reason}")
    rate = project_settings.load().get("NODE_LINK_RATE")
    if rate:
        raise BenchError(
            f"NODE_LINK_RATE={rate}: the bench sets the link's rate itself, and an empty one (unlimited) falls back to "
            f"the setting; leave it empty (scripts/node/settings.env, the environment)"
        )


def tc_rate(rate: str) -> str:
    """NODE_LINK_RATE for one of links.RATES: tc's units, empty for unlimited."""
    return "" if links.RATES[rate] is None else rate


def set_link_rate(cluster: Cluster, rate: str) -> list[str]:
    """The agent's link at RATE each way; each end's root qdisc as tc printed it, checked to be what was asked."""
    log_name = f"link-rate-{rate}"
    printed = cluster.make(
        "link-rate", {"NODE_LINK_RATE": tc_rate(rate)}, log_name, f"the link at {rate}", FETCH_TIMEOUT
    )
    qdiscs = [line.strip() for line in printed.splitlines() if line.startswith("qdisc ")]
    limited = [" tbf " in f"{qdisc} " for qdisc in qdiscs]
    if len(qdiscs) != 2 or any(limited) != (links.RATES[rate] is not None) or len(set(limited)) > 1:
        raise BenchError(
            f"the link at {rate}: make link-rate left {qdiscs or 'no qdisc'}; its log is {cluster.log(log_name)}"
        )
    return qdiscs


def check_namespace_free(cluster: Cluster) -> None:
    """A BenchError unless the bench's namespace is still to be made: it deletes only the one it made."""
    found = cluster.kubectl(
        "get", "namespace", cluster.namespace, "--ignore-not-found", "-o", "name", log_name="namespace",
        what=f"the namespace {cluster.namespace}",
    )  # fmt: skip
    if found.strip():
        raise BenchError(
            f"the namespace {cluster.namespace} exists already (an earlier bench-cluster stopped before its cleanup?): "
            f"delete it (kubectl --context {cluster.context} delete namespace {cluster.namespace}) or name another "
            f"with --namespace"
        )


def wait_for_account(cluster: Cluster) -> None:
    """Until the new namespace has its default service account, without which no pod is admitted."""
    what = f"the namespace {cluster.namespace}"
    deadline = time.monotonic() + ACCOUNT_TIMEOUT
    while not cluster.kubectl(
        "get", "serviceaccount", "default", "-n", cluster.namespace, "--ignore-not-found", "-o", "name",
        log_name="namespace-account", what=what,
    ).strip():  # fmt: skip
        if time.monotonic() > deadline:
            raise BenchError(f"{what} has no default service account after {ACCOUNT_TIMEOUT:.0f} s")
        time.sleep(1)


def close(cluster: Cluster, namespace_made: bool) -> list[str]:
    """The link back to unlimited and the bench's namespace deleted, with its jobs, pods and claim; what failed."""
    failed = []
    try:
        set_link_rate(cluster, "unlimited")
    except BenchError as error:
        failed.append(f"{error}; set it back as root: make link-rate NODE_LINK_RATE=")
    if namespace_made:
        try:
            cluster.kubectl(
                "delete", "namespace", cluster.namespace, f"--timeout={DELETE_TIMEOUT:.0f}s",
                log_name="namespace-delete", what=f"deleting the namespace {cluster.namespace} with the bench's jobs",
                timeout=DELETE_TIMEOUT + 60,
            )  # fmt: skip
        except BenchError as error:
            failed.append(str(error))
    return failed


# ---- one run on each side ----------------------------------------------------------------------------------------


def pod_flags(args: argparse.Namespace, workers: int) -> list[str]:
    """The namespace runs' trainer flags (runs.command: the same steps, batch, warm-up and --threads 1) less those
    make submit sets itself: a cluster run's ARGS=."""
    argv = command("trainer", per_worker(args), workers, args, pathlib.Path("unused"), extra_flags=links.PINNED)
    flags = argv[3:]  # past `python -m trainer`
    kept, index = [], 0
    while index < len(flags):
        if flags[index] in SET_BY_SUBMIT:
            index += 2
            continue
        kept.append(flags[index])
        index += 1
    return kept


def per_worker(args: argparse.Namespace) -> int:
    return args.global_batch_size // 2


def job_name(rate: str, workers: int, round_index: int | str) -> str:
    """A fresh name per run: its claim folder (MODEL_ROOT/JOB_NAME) has no earlier run's checkpoints to resume."""
    return f"links-{rate}-{workers}w-{round_index}"


def submit_variables(cluster: Cluster, args: argparse.Namespace, job: str, workers: int) -> dict[str, str]:
    """make submit's variables for one cluster run."""
    return {
        **cluster.common(job),
        "STRATEGY": "sync",
        "WORKERS": str(workers),
        "WORKER_CPU_REQUEST": args.cpu_request,
        "SPREAD_OVER_NODES": "1",
        "DATASET": "synthetic",
        "EPOCHS": "1",
        "ARGS": shlex.join(pod_flags(args, workers)),
    }


def cluster_run(
    cluster: Cluster, args: argparse.Namespace, rate: str, workers: int, round_index: int
) -> dict[str, Any]:
    """One job to its end, its model directory fetched: the chief's figures and the node of each worker."""
    job = job_name(rate, workers, round_index)
    variant = CLUSTER_PAIR if workers == 2 else CLUSTER_ALONE
    what = f"cluster, {rate} {variant}, round {round_index + 1} (job {job})"
    print(f"[cluster round {round_index + 1}/{args.repeats}] {rate} {variant} ...", end=" ", flush=True)
    started = time.monotonic()
    cluster.make("submit", submit_variables(cluster, args, job, workers), f"{job}-submit", what, args.timeout)
    submit_seconds = time.monotonic() - started
    cluster.make("fetch-model", cluster.common(job), f"{job}-fetch-model", what, FETCH_TIMEOUT)
    if not (cluster.fetched / "metrics.json").exists():
        raise BenchError(
            f"{what}: make fetch-model left no {cluster.fetched / 'metrics.json'}; its log is "
            f"{cluster.log(f'{job}-fetch-model')}"
        )
    run_dir = cluster.logs / job
    (run_dir / "model").mkdir(parents=True)
    shutil.copy2(cluster.fetched / "metrics.json", run_dir / "model" / "metrics.json")
    report = read_report("trainer", run_dir, run_dir / "model")
    config = report.get("config", {})
    if report["workers"] != workers or not str(config.get("model_dir")).endswith(f"/{job}"):
        raise BenchError(f"{what}: the fetched metrics.json is another job's ({config.get('model_dir')})")
    if config.get("threads") != 1:
        raise BenchError(f"{what}: the pods ran {config.get('threads')} threads, not the namespace runs' 1")
    pods = cluster.get_json(
        "get", "pods", "-n", cluster.namespace, "-l", WORKER_PODS.format(job=job), log_name=f"{job}-pods", what=what
    )["items"]
    nodes = sorted(pod["spec"].get("nodeName") or "" for pod in pods)
    if workers == 2 and len(set(nodes)) != 2:
        raise BenchError(
            f"{what}: the two workers ran on {', '.join(nodes)}, not on two nodes: is each node schedulable?"
        )
    print(
        f"{report['examples_per_second']:,.0f} ex/s on {', '.join(nodes)}, make submit {submit_seconds:.0f} s",
        flush=True,
    )
    return {
        "rate": rate,
        "variant": variant,
        "job": job,
        "examples_per_second": report["examples_per_second"],
        "time_to_first_step_seconds": report["time_to_first_step_seconds"],
        "workers": report["workers"],
        "global_batch_size": report["global_batch_size"],
        "nodes": nodes,
        "submit_seconds": submit_seconds,
    }


@dataclasses.dataclass(frozen=True)
class NetnsSide:
    """This machine's side, as links.py runs it (tests put stand-ins here): whether namespaces can be made, the
    linked namespaces, and one trainer run (runs.run_once's signature)."""

    unavailable: Callable[[], str | None] = netns.unavailable
    linked: Callable[[], contextlib.AbstractContextManager[Any]] = netns.linked_namespaces
    trainer_run: Callable[..., dict[str, Any]] = run_once


def netns_runs(
    side: NetnsSide, link: Any, args: argparse.Namespace, rate: str, round_index: int, scratch: pathlib.Path
) -> list[dict[str, Any]]:
    """The trainer alone on core 0, then two workers in the namespaces over the link at RATE (links.py's runs)."""
    tag = f"[netns round {round_index + 1}/{args.repeats}] {rate}"
    alone = partial(
        side.trainer_run, "trainer", 1, per_worker(args), args, extra_flags=links.PINNED, placement=links.ALONE_ON_CORE
    )
    pair = partial(
        side.trainer_run, "trainer", 2, per_worker(args), args, extra_flags=links.PINNED, placement=links.apart(link)
    )
    return [
        links.measure(f"{tag} {name}", run, args, scratch / f"netns-{rate}-{name}-{round_index}", rate, name, "trainer")
        for name, run in ((NETNS_ALONE, alone), (NETNS_PAIR, pair))
    ]


def run_phase(args: argparse.Namespace, cluster: Cluster, side: NetnsSide | None = None) -> dict[str, Any]:
    """The checks, the image, the namespace, then every round; the link back to unlimited and the namespace deleted
    at the end, whatever happens ("left": what of that failed, each with its fix)."""
    side = side or NetnsSide()
    check_cluster(cluster, side.unavailable)
    check_namespace_free(cluster)
    cluster.make("image", {}, "image", "the image", IMAGE_TIMEOUT)
    runs: list[dict[str, Any]] = []
    qdiscs: dict[str, dict[str, list[str]]] = {"cluster": {}, "netns": {}}
    namespace_made = False
    try:
        cluster.kubectl(
            "create", "namespace", cluster.namespace, log_name="namespace-create",
            what=f"the namespace {cluster.namespace}",
        )  # fmt: skip
        namespace_made = True
        wait_for_account(cluster)
        with side.linked() as link:
            for round_index in range(args.repeats):
                for rate in args.rates:
                    qdiscs["cluster"][rate] = set_link_rate(cluster, rate)
                    link.set_rate(links.RATES[rate])
                    qdiscs["netns"][rate] = link.qdiscs()
                    measured = [cluster_run(cluster, args, rate, workers, round_index) for workers in (1, 2)]
                    measured += netns_runs(side, link, args, rate, round_index, cluster.logs)
                    for run in measured:
                        run["round"] = round_index
                    runs += measured
    finally:
        left = close(cluster, namespace_made)
        for problem in left:
            print(f"warning: {problem}", file=sys.stderr)
    # A cleanup that failed after the last run costs no figure: main writes them, then fails.
    return {"runs": runs, "rates": args.rates, "qdiscs": qdiscs, "left": left}


# ---- the figures ---------------------------------------------------------------------------------------------------


def summarize(phase: dict[str, Any]) -> list[dict[str, Any]]:
    """Per rate and side: one worker's and two workers' examples/s, and the efficiency within each round, two / (2 x
    one), each as a spread over the rounds."""
    table = []
    for rate in phase["rates"]:
        row: dict[str, Any] = {"rate": rate}
        for side, (alone_name, pair_name) in SIDES.items():
            alone, pair = (
                sorted((run for run in phase["runs"] if run["rate"] == rate and run["variant"] == name), key=_round)
                for name in (alone_name, pair_name)
            )
            row[side] = {
                "alone_examples_per_second": spread([run["examples_per_second"] for run in alone]),
                "two_examples_per_second": spread([run["examples_per_second"] for run in pair]),
                "efficiency": spread(
                    [
                        two["examples_per_second"] / (2 * one["examples_per_second"])
                        for one, two in zip(alone, pair, strict=True)
                    ]
                ),
            }
        table.append(row)
    return table


def _round(run: dict[str, Any]) -> int:
    return run["round"]


def print_table(table: list[dict[str, Any]]) -> None:
    print("\ntwo nodes on the local cluster against two network namespaces (examples/s and efficiency: median, range)")
    print(f"{'link':<11}{'cluster 1 worker':>22}{'cluster 2 workers':>24}{'cluster efficiency':>22}", end="")
    print(f"{'netns efficiency':>22}")
    for row in table:
        cluster, namespaces = row["cluster"], row["netns"]
        print(
            f"{row['rate']:<11}{_figure(cluster['alone_examples_per_second'], ',.0f'):>22}"
            f"{_figure(cluster['two_examples_per_second'], ',.0f'):>24}{_figure(cluster['efficiency'], '.2f'):>22}"
            f"{_figure(namespaces['efficiency'], '.2f'):>22}"
        )


def _figure(figures: dict[str, Any], form: str) -> str:
    return f"{figures['median']:{form}} ({figures['min']:{form}}-{figures['max']:{form}})"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # SIGTERM and SIGHUP unwind like Ctrl-C: the link is set back and the namespace deleted.
    for number in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, lambda signum, _frame: sys.exit(128 + signum))
    started = datetime.datetime.now(datetime.UTC)
    logs = pathlib.Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    print(f"logs in {logs}", flush=True)
    cluster = Cluster(args.context, args.namespace, logs)
    try:
        phase = run_phase(args, cluster)
    except BenchError as error:
        print(f"\nerror: {error}\n(the logs stay in {logs})", file=sys.stderr)
        return 1
    table = summarize(phase)
    results = {
        **provenance("scripts.bench.cluster_links", started, argv),
        "config": {
            "context": args.context,
            "engine": project_settings.load()["ENGINE"],
            "repeats": args.repeats,
            "steps": args.steps,
            "warmup_steps": args.warmup_steps,
            "per_worker_batch_size": per_worker(args),
            "trainer_variant": links.defaults_variant() or "the trainer's defaults",
            "cluster": {
                "make_submit": {
                    str(workers): {
                        **submit_variables(cluster, args, "", workers),
                        "JOB_NAME": job_name("<rate>", workers, "<round>"),
                    }
                    for workers in (1, 2)
                },
                "cpu": f"each pod requests {args.cpu_request} CPU (limit 2, the template's), --threads 1",
            },
            "netns": {
                "trainer_flags": [*links.PINNED, *args.trainer_flags],
                "cpu": "each worker pinned to one core (taskset), --threads 1",
            },
        },
        "table": table,
        "qdiscs": phase["qdiscs"],
        "cleanup_failed": phase["left"],
        "runs": phase["runs"],
    }
    args.output_dir.mkdir(parents=True, exist_ok=True)
    write_json(str(args.output_dir / "cluster-links.json"), results, sort_keys=False)
    print_table(table)
    print(f"\nwrote {args.output_dir / 'cluster-links.json'}")
    if phase["left"]:
        print(f"error: the bench did not clean up after itself (above); the logs stay in {logs}", file=sys.stderr)
        return 1
    shutil.rmtree(logs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
