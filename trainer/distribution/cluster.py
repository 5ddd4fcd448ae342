"""Who this process is in the training group, read from TF_CONFIG.

Pure Python on purpose: a bad TF_CONFIG stops the program before TensorFlow
starts. The Kubeflow operator v1.9 writes
  {"cluster": {"worker": ["job-worker-0.ns.svc:2222", ...]},
   "task": {"type": "worker", "index": 0}, "environment": "cloud"}
with optional "chief", "ps" and "evaluator" lists; people write the same shape
by hand with 127.0.0.1 addresses.

A task type's list may also be written as a range, {"count": N, "address": "...{index}..."}: N addresses that
differ only by their index, 0 to N-1. An engine whose pod template writes TF_CONFIG with Kubernetes' $(VAR)
references (the JobSet overlays do) needs it: no reference can repeat an address N times.
  "worker": {"count": 3, "address": "job-worker-0-{index}.job:2222"}
is the same list as the three addresses written out.

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
import re
from collections.abc import Mapping
from typing import Any

from trainer.base.errors import ClusterConfigError
from trainer.settings.config import STRATEGIES

TRAINING_TYPES = ("chief", "worker")
KNOWN_TYPES = ("chief", "worker", "evaluator", "ps")
# The tasks of an async cluster that tf.distribute connects (the evaluator is not one of them).
ASYNC_TYPES = ("chief", "worker", "ps")
# What the trainer once built a JobSet pod's cluster from, without TF_CONFIG (k8s/README.md documented it until
# 2026-12): a pod template that still sets them and no TF_CONFIG would start every pod as a group of one.
RETIRED_CLUSTER_VARIABLES = ("JOBSET_TASKS", "JOBSET_LOCAL_ADDRESSES")


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


def parse_tf_config(text: str | None, strategy: str = "auto") -> Cluster:
    """Parses the TF_CONFIG text for --strategy `strategy` (auto, sync or async); None or blank means one
    process without distribution."""
    if text is None or not text.strip():
        _choose_strategy({}, strategy)
        return SINGLE_PROCESS
    config = _json_object(text)
    members = cluster_members(config.get("cluster") or {})
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
    unexpanded = re.search(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", text)
    if unexpanded:
        raise _fail(
            "(whole value)",
            f"$({unexpanded[1]}) was not expanded: the container has no variable {unexpanded[1]} defined before "
            "TF_CONFIG",
            f"define {unexpanded[1]} earlier in the container's env than TF_CONFIG, or in its envFrom",
        )
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


def cluster_members(cluster: Any) -> dict[str, tuple[str, ...]]:
    """TF_CONFIG's cluster: each task type's addresses, a range written out (the local runner reads it too)."""
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
        if isinstance(addresses, dict):
            addresses = _address_range(task_type, addresses)
        if not isinstance(addresses, list) or not all(isinstance(a, str) and a for a in addresses):
            raise _fail(
                f"cluster.{task_type}",
                'must be a list of \'host:port\' strings, or a range {"count": N, "address": "...{index}..."}',
                f'use "{task_type}": ["host:2222"]',
            )
        members[task_type] = tuple(addresses)
    if len(members.get("chief", ())) > 1:
        raise _fail(
            "cluster.chief",
            f"has {len(members['chief'])} entries; a group has at most one chief",
            "list one chief and put the rest under 'worker'",
        )
    return members


def _address_range(task_type: str, spec: dict[str, Any]) -> list[str]:
    """A range's addresses: its address with {index} replaced by 0 to count - 1."""
    count, address = spec.get("count"), spec.get("address")
    example = f'"{task_type}": {{"count": 2, "address": "job-{task_type}-{{index}}.job:2222"}}'
    if set(spec) != {"count", "address"}:
        raise _fail(
            f"cluster.{task_type}", f"a range has exactly count and address, got {sorted(spec)}", f"use {example}"
        )
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise _fail(
            f"cluster.{task_type}.count", f"must be a whole number of tasks, 1 or more, got {count!r}", f"use {example}"
        )
    if (
        not isinstance(address, str)
        or address.count("{index}") != 1
        or re.search(r"[{}]", address.replace("{index}", ""))
    ):
        raise _fail(
            f"cluster.{task_type}.address",
            f"must hold {{index}} once and no other braces, got {address!r}",
            f"use {example}",
        )
    return [address.replace("{index}", str(index)) for index in range(count)]


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


def from_environment(environ: Mapping[str, str] | None = None, strategy: str = "auto") -> Cluster:
    """TF_CONFIG when set (the TFJob operator's, an engine's pod template's, or one written by hand), else one
    process."""
    environ = os.environ if environ is None else environ
    retired = [name for name in RETIRED_CLUSTER_VARIABLES if environ.get(name)]
    if retired and not (environ.get("TF_CONFIG") or "").strip():
        raise ClusterConfigError(
            f"{retired[0]} is set but TF_CONFIG is not: the trainer no longer builds a JobSet pod's cluster from the "
            "JOBSET_* variables, and alone it would train as a group of one. Fix: write TF_CONFIG in the pod "
            "template, as k8s/engines/jobset/sync/jobset.yaml does (k8s/README.md)"
        )
    return parse_tf_config(environ.get("TF_CONFIG"), strategy)
