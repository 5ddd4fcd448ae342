"""Who this process is in the training group, read from TF_CONFIG or from what a JobSet gives its pods.

Pure Python on purpose: a bad TF_CONFIG stops the program before TensorFlow
starts. The Kubeflow operator v1.9 writes
  {"cluster": {"worker": ["job-worker-0.ns.svc:2222", ...]},
   "task": {"type": "worker", "index": 0}, "environment": "cloud"}
with optional "chief", "ps" and "evaluator" lists; people write the same shape
by hand with 127.0.0.1 addresses.

JobSet (kubernetes-sigs/jobset v0.12.0), alone or under Kubeflow Trainer v2, sets no TF_CONFIG and no variable
of its own. Without TF_CONFIG, a pod with JOBSET_NAME builds the same cluster from (see from_jobset):
  JOBSET_NAME, JOBSET_REPLICATED_JOB, JOBSET_JOB_INDEX   the pod's metadata jobset.sigs.k8s.io/jobset-name,
        replicatedjob-name and job-index, read through the downward API (JobSet puts them on every pod:
        labelAndAnnotateObject in pkg/controllers/jobset_controller.go);
  JOB_COMPLETION_INDEX   the pod's index in its Job, set by Kubernetes for Indexed Jobs (JobSet's default mode);
  JOBSET_TASKS           the group's shape, which no label exposes (a Job's parallelism is not on its pods):
        <replicatedJob>=<pods per Job>[x<Jobs>], comma-separated, e.g. worker=2 or chief=1,ps=1,worker=2,evaluator=1.
        A replicated job is named after its task type; Trainer v2's trainer Job, `node`, holds the workers;
  JOBSET_SUBDOMAIN       optional: the JobSet's network.subdomain (JobSet's default: the JobSet's name);
  JOBSET_PORT            optional: the port every task listens on (default 2222).
Each task's address is its pod's DNS name, <jobset>-<replicatedJob>-<jobIndex>-<podIndex>.<subdomain>:<port>:
the Indexed Job gives pod i the hostname <job>-<i>, the Job is <jobset>-<replicatedJob>-<jobIndex>
(placement.GenJobName), and the subdomain is the JobSet's headless Service (network.enableDNSHostnames). Task
indexes follow (jobIndex, podIndex). Trainer v2 (v2.3.0, pkg/runtime/framework/plugins/jobset/jobset.go
IdentifyPodNetwork) names its endpoints the same way. JOBSET_LOCAL_ADDRESSES, a JSON object mapping those
addresses to others, is run-local's stand-in for cluster DNS (every task on 127.0.0.1, each on its own port).

Two strategies, chosen by --strategy or by the shape of TF_CONFIG (auto):
  sync   all-reduce (MultiWorkerMirroredStrategy): chief and workers train together, rank 0 reports.
  async  parameter servers (ParameterServerStrategy): chosen when the cluster lists `ps` tasks. The chief
         is the coordinator (it schedules steps, checkpoints and saves); `worker` and `ps` tasks run a
         tf.distribute.Server and wait for work. It needs exactly one chief, at least one worker and one ps.
In both, an `evaluator` task trains nothing: it follows the chief's checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from trainer.base.errors import ClusterConfigError
from trainer.settings.config import STRATEGIES

DEFAULT_PORT = 2222  # the Kubeflow TFJob's default port, used by the JobSet source when JOBSET_PORT is unset
# The replicated job names the JobSet source knows, and their task types: Trainer v2's trainer Job is `node`.
JOBSET_TASK_TYPES = {"chief": "chief", "worker": "worker", "ps": "ps", "evaluator": "evaluator", "node": "worker"}

TRAINING_TYPES = ("chief", "worker")
KNOWN_TYPES = ("chief", "worker", "evaluator", "ps")
# The tasks of an async cluster that tf.distribute connects (the evaluator is not one of them).
ASYNC_TYPES = ("chief", "worker", "ps")


@dataclasses.dataclass(frozen=True)
class Cluster:
    task_type: str
    task_index: int
    members: Mapping[str, tuple[str, ...]]
    strategy: str = "sync"

    @property
    def is_async(self) -> bool:
        return self.strategy == "async"

    @property
    def training_addresses(self) -> tuple[str, ...]:
        """The training group in rank order: the chief first, then the workers."""
        return tuple(self.members.get("chief", ())) + tuple(self.members.get("worker", ()))

    @property
    def num_workers(self) -> int:
        """Processes whose batches make one step: chief + workers in sync, the workers in async; at least 1."""
        if self.is_async:
            return len(self.members["worker"])
        return max(1, len(self.training_addresses))

    @property
    def num_ps(self) -> int:
        return len(self.members.get("ps", ()))

    @property
    def is_distributed(self) -> bool:
        return self.is_async or self.num_workers > 1

    @property
    def role(self) -> str:
        """What this process does: trainer (sync), coordinator (async chief), server (async worker or ps),
        or evaluator."""
        if self.is_evaluator:
            return "evaluator"
        if not self.is_async:
            return "trainer"
        return "coordinator" if self.task_type == "chief" else "server"

    @property
    def is_evaluator(self) -> bool:
        return self.task_type == "evaluator"

    @property
    def rank(self) -> int:
        """0 for the chief (or worker 0 when there is no chief), then the workers in order."""
        if self.task_type == "chief":
            return 0
        return len(self.members.get("chief", ())) + self.task_index

    @property
    def is_chief(self) -> bool:
        return self.task_type in TRAINING_TYPES and self.rank == 0

    @property
    def tasks_on_this_host(self) -> int:
        """Members of TF_CONFIG (every task type) whose host is this task's: co-located processes share its cores."""
        if not self.members:
            return 1
        host = self.members[self.task_type][self.task_index].rsplit(":", 1)[0]
        return sum(address.rsplit(":", 1)[0] == host for addresses in self.members.values() for address in addresses)

    @property
    def chief_address(self) -> str | None:
        return self.training_addresses[0] if self.training_addresses else None

    @property
    def name(self) -> str:
        """A short label for log lines, e.g. 'worker-1'."""
        return f"{self.task_type}-{self.task_index}"


SINGLE_PROCESS = Cluster(task_type="worker", task_index=0, members={})


def _fail(field: str, problem: str, fix: str) -> ClusterConfigError:
    return ClusterConfigError(f"TF_CONFIG {field}: {problem}. Fix: {fix}")


def _jobset_fail(variable: str, problem: str, fix: str) -> ClusterConfigError:
    return ClusterConfigError(f"JobSet pod, {variable}: {problem}. Fix: {fix}")


def parse_tf_config(text: str | None, strategy: str = "auto") -> Cluster:
    """Parses the TF_CONFIG text for --strategy `strategy` (auto, sync or async); None or blank means one
    process without distribution."""
    if text is None or not text.strip():
        _choose_strategy({}, strategy)
        return SINGLE_PROCESS
    config = _json_object(text)
    members = _members(config.get("cluster") or {})
    chosen = _choose_strategy(members, strategy)
    training = len(members.get("chief", ())) + len(members.get("worker", ()))
    task = config.get("task")
    if task is None:
        if chosen == "sync" and sum(len(a) for a in members.values()) <= 1:
            return SINGLE_PROCESS
        raise _fail("task", "missing", 'add "task": {"type": "worker", "index": <this process\'s index>}')
    task_type, index = _task(task, members)
    if chosen == "sync" and task_type in TRAINING_TYPES and training <= 1:
        return SINGLE_PROCESS
    return Cluster(task_type=task_type, task_index=index, members=members, strategy=chosen)


def _json_object(text: str) -> dict[str, Any]:
    """TF_CONFIG's JSON object."""
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise _fail(
            "(whole value)",
            f"not valid JSON ({error.msg} at line {error.lineno} column {error.colno})",
            'set it to JSON such as {"cluster": {"worker": ["host:2222"]}, "task": {"type": "worker", "index": 0}}',
        ) from None
    if not isinstance(config, dict):
        raise _fail(
            "(whole value)",
            f"expected a JSON object, got {type(config).__name__}",
            "set TF_CONFIG to an object with 'cluster' and 'task' keys",
        )
    return config


def _members(cluster: Any) -> dict[str, tuple[str, ...]]:
    """TF_CONFIG's cluster: each task type's addresses."""
    if not isinstance(cluster, dict):
        raise _fail(
            "cluster", "must be an object mapping task types to address lists", 'use {"worker": ["host:port", ...]}'
        )
    members: dict[str, tuple[str, ...]] = {}
    for task_type, addresses in cluster.items():
        if task_type == "master":
            raise _fail(
                "cluster.master",
                "MultiWorkerMirroredStrategy rejects the task type 'master'",
                "rename it to 'chief' (in a TFJob: use a Chief replica, or Workers only)",
            )
        if task_type not in KNOWN_TYPES:
            raise _fail(f"cluster.{task_type}", "unknown task type", f"use only {', '.join(KNOWN_TYPES)}")
        if not isinstance(addresses, list) or not all(isinstance(a, str) and a for a in addresses):
            raise _fail(
                f"cluster.{task_type}", "must be a list of 'host:port' strings", f'use "{task_type}": ["host:2222"]'
            )
        members[task_type] = tuple(addresses)
    if len(members.get("chief", ())) > 1:
        raise _fail(
            "cluster.chief",
            f"has {len(members['chief'])} entries; a group has at most one chief",
            "list one chief and put the rest under 'worker'",
        )
    return members


def _task(task: Any, members: Mapping[str, tuple[str, ...]]) -> tuple[str, int]:
    """TF_CONFIG's task: this process's type and index in the cluster."""
    if not isinstance(task, dict):
        raise _fail("task", "must be an object", 'use "task": {"type": "worker", "index": 0}')
    task_type = task.get("type")
    index = task.get("index", 0)
    if task_type == "master":
        raise _fail(
            "task.type",
            "'master' is rejected by MultiWorkerMirroredStrategy",
            "use 'chief' (TFJob: a Chief replica) or 'worker'",
        )
    if not isinstance(task_type, str) or task_type not in KNOWN_TYPES:
        raise _fail("task.type", f"{task_type!r} is not a task type", f"use one of {', '.join(KNOWN_TYPES)}")
    if task_type not in members:
        raise _fail(
            "task.type",
            f"'{task_type}' has no list in cluster (cluster has {', '.join(members) or 'nothing'})",
            f'add "{task_type}": ["host:port"] to cluster, or fix task.type',
        )
    if isinstance(index, bool) or not isinstance(index, int):
        raise _fail(
            "task.index", f"must be an integer, got {index!r}", "use the position of this task in its cluster list"
        )
    if not 0 <= index < len(members[task_type]):
        raise _fail(
            "task.index",
            f"{index} is out of range: cluster.{task_type} has {len(members[task_type])} entries",
            f"use 0..{len(members[task_type]) - 1}",
        )
    return task_type, index


def _choose_strategy(members: Mapping[str, tuple[str, ...]], requested: str) -> str:
    """sync or async: the flag when given, else async exactly when the cluster lists ps tasks; refuses shapes
    the chosen strategy cannot run."""
    if requested not in STRATEGIES:
        raise ClusterConfigError(f"--strategy {requested!r} is unknown; use one of {', '.join(STRATEGIES)}")
    has_ps = bool(members.get("ps"))
    if requested == "sync" and has_ps:
        raise _fail(
            "cluster.ps",
            "lists parameter servers, but --strategy sync (all-reduce) uses none",
            "remove the PS replicas, or use --strategy async (or auto, which picks async when ps tasks exist)",
        )
    chosen = "async" if requested == "async" or (requested == "auto" and has_ps) else "sync"
    if chosen == "sync":
        return chosen
    if not has_ps:
        raise _fail(
            "cluster.ps",
            "missing: --strategy async keeps the variables on parameter servers",
            'add PS replicas (TF_CONFIG "ps": ["host:port"]), or use --strategy sync',
        )
    if not members.get("chief"):
        raise _fail(
            "cluster.chief",
            "missing: in async mode the chief is the coordinator that schedules the steps",
            'add one Chief replica (TF_CONFIG "chief": ["host:port"])',
        )
    if not members.get("worker"):
        raise _fail(
            "cluster.worker",
            "missing: in async mode the workers run the steps the chief schedules",
            'add Worker replicas (TF_CONFIG "worker": ["host:port", ...])',
        )
    return chosen


@dataclasses.dataclass(frozen=True)
class JobSetShape:
    """One entry of JOBSET_TASKS: a replicated job of `jobs` Jobs with `pods` pods each."""

    replicated_job: str
    pods: int
    jobs: int = 1

    @property
    def task_type(self) -> str:
        return JOBSET_TASK_TYPES[self.replicated_job]


def parse_jobset_tasks(text: str) -> tuple[JobSetShape, ...]:
    """JOBSET_TASKS (<replicatedJob>=<pods per Job>[x<Jobs>], comma-separated) as shapes, in order."""
    example = "e.g. worker=2, or chief=1,ps=1,worker=2,evaluator=1 (see k8s/engines/jobset/*)"
    shapes: list[JobSetShape] = []
    for entry in (e.strip() for e in text.split(",")):
        name, sep, size = entry.partition("=")
        pods_text, _, jobs_text = size.partition("x")
        if not sep or not pods_text.isdigit() or not (jobs_text or "1").isdigit():
            raise _jobset_fail(
                "JOBSET_TASKS", f"{entry!r} is not <replicatedJob>=<pods per Job>[x<Jobs>]", f"write {example}"
            )
        if name not in JOBSET_TASK_TYPES:
            raise _jobset_fail(
                "JOBSET_TASKS",
                f"replicated job {name!r} is not named after a task type",
                f"name the replicated jobs {', '.join(JOBSET_TASK_TYPES)} (node: Trainer v2's trainer Job, the "
                "workers)",
            )
        shape = JobSetShape(name, int(pods_text), int(jobs_text or "1"))
        if shape.pods < 1 or shape.jobs < 1:
            raise _jobset_fail("JOBSET_TASKS", f"{entry!r} has no pod", f"give every replicated job a pod, {example}")
        if any(s.replicated_job == name for s in shapes):
            raise _jobset_fail("JOBSET_TASKS", f"lists {name!r} twice", "list each replicated job once")
        same_type = [s.replicated_job for s in shapes if s.task_type == shape.task_type]
        if same_type:
            raise _jobset_fail(
                "JOBSET_TASKS",
                f"{same_type[0]!r} and {name!r} both hold {shape.task_type} tasks",
                f"keep one replicated job of {shape.task_type} tasks",
            )
        shapes.append(shape)
    return tuple(shapes)


def _index(environ: Mapping[str, str], variable: str, below: int, fix: str) -> int:
    text = environ.get(variable, "")
    if not text.isdigit():
        raise _jobset_fail(variable, f"{text!r} is not an index" if text else "missing", fix)
    if int(text) >= below:
        raise _jobset_fail(variable, f"{text} is out of range (0..{below - 1} by JOBSET_TASKS)", fix)
    return int(text)


def from_jobset(environ: Mapping[str, str], strategy: str = "auto") -> Cluster:
    """The cluster of a JobSet pod, from the variables the module docstring lists; exits 2 (ClusterConfigError)
    naming the variable and the fix when they cannot describe a group this trainer runs."""
    name = environ.get("JOBSET_NAME", "")
    tasks_text = environ.get("JOBSET_TASKS", "")
    if not tasks_text:
        raise _jobset_fail(
            "JOBSET_TASKS",
            "missing: no label gives a pod the size of its group",
            "set env JOBSET_TASKS in the pod template, e.g. worker=$(WORKERS) (k8s/engines/jobset/sync)",
        )
    shapes = {shape.replicated_job: shape for shape in parse_jobset_tasks(tasks_text)}
    downward = "from the pod's label jobset.sigs.k8s.io/{label} (env valueFrom fieldRef, k8s/engines/jobset/sync)"
    own = environ.get("JOBSET_REPLICATED_JOB", "")
    if not own:
        raise _jobset_fail("JOBSET_REPLICATED_JOB", "missing", "set it " + downward.format(label="replicatedjob-name"))
    if own not in shapes:
        raise _jobset_fail(
            "JOBSET_REPLICATED_JOB",
            f"{own!r} is not in JOBSET_TASKS ({tasks_text})",
            f"add {own}=<pods> to JOBSET_TASKS, or name the replicated job as JOBSET_TASKS does",
        )
    shape = shapes[own]
    job_index = _index(environ, "JOBSET_JOB_INDEX", shape.jobs, "set it " + downward.format(label="job-index"))
    pod_index = _index(
        environ,
        "JOB_COMPLETION_INDEX",
        shape.pods,
        "run the pod in an Indexed Job (JobSet's default completionMode) with parallelism and completions equal "
        f"to the pods JOBSET_TASKS gives {own!r}",
    )
    port_text = environ.get("JOBSET_PORT") or str(DEFAULT_PORT)
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise _jobset_fail("JOBSET_PORT", f"{port_text!r} is not a port", "set a port number, e.g. 2222")
    subdomain = environ.get("JOBSET_SUBDOMAIN") or name
    local = _local_addresses(environ.get("JOBSET_LOCAL_ADDRESSES"))
    members: dict[str, tuple[str, ...]] = {}
    for rjob, rshape in shapes.items():
        addresses = [
            f"{name}-{rjob}-{job}-{pod}.{subdomain}:{port_text}"
            for job in range(rshape.jobs)
            for pod in range(rshape.pods)
        ]
        missing = [a for a in addresses if local is not None and a not in local]
        if missing:
            raise _jobset_fail("JOBSET_LOCAL_ADDRESSES", f"has no address for {missing[0]}", "map every task's address")
        members[rshape.task_type] = tuple(local[a] if local is not None else a for a in addresses)
    config = {"cluster": members, "task": {"type": shape.task_type, "index": job_index * shape.pods + pod_index}}
    try:
        return parse_tf_config(json.dumps(config), strategy)
    except ClusterConfigError as error:
        raise ClusterConfigError(
            f"JobSet pod: the group that JOBSET_TASKS={tasks_text} describes cannot run: {error}. In a JobSet, each "
            f"TF_CONFIG list is a replicated job of that name (k8s/engines/jobset/async has the async shape)"
        ) from None


def _local_addresses(text: str | None) -> dict[str, str] | None:
    if not text:
        return None
    try:
        mapping = json.loads(text)
    except json.JSONDecodeError as error:
        raise _jobset_fail("JOBSET_LOCAL_ADDRESSES", f"not valid JSON ({error.msg})", "unset it on a cluster") from None
    if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
        raise _jobset_fail("JOBSET_LOCAL_ADDRESSES", "must map addresses to addresses", "unset it on a cluster")
    return mapping


def from_environment(environ: Mapping[str, str] | None = None, strategy: str = "auto") -> Cluster:
    """TF_CONFIG when set (the TFJob's, or one written by hand), else a JobSet pod's variables, else one process."""
    environ = os.environ if environ is None else environ
    if not (environ.get("TF_CONFIG") or "").strip() and environ.get("JOBSET_NAME"):
        return from_jobset(environ, strategy)
    return parse_tf_config(environ.get("TF_CONFIG"), strategy)
