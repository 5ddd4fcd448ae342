"""Who this process is in the training group, read from TF_CONFIG.

Pure Python on purpose: a bad TF_CONFIG stops the program before TensorFlow
starts. The Kubeflow operator v1.9 writes
  {"cluster": {"worker": ["job-worker-0.ns.svc:2222", ...]},
   "task": {"type": "worker", "index": 0}, "environment": "cloud"}
with optional "chief", "ps" and "evaluator" lists; people write the same shape
by hand with 127.0.0.1 addresses.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping

from trainer.errors import ClusterConfigError

TRAINING_TYPES = ("chief", "worker")
KNOWN_TYPES = ("chief", "worker", "evaluator", "ps")


@dataclasses.dataclass(frozen=True)
class Cluster:
    task_type: str
    task_index: int
    members: Mapping[str, tuple[str, ...]]

    @property
    def training_addresses(self) -> tuple[str, ...]:
        """The training group in rank order: the chief first, then the workers."""
        return tuple(self.members.get("chief", ())) + tuple(self.members.get("worker", ()))

    @property
    def num_workers(self) -> int:
        """Processes that train together (chief + workers); at least 1."""
        return max(1, len(self.training_addresses))

    @property
    def is_distributed(self) -> bool:
        return self.num_workers > 1

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
    def chief_address(self) -> str | None:
        return self.training_addresses[0] if self.training_addresses else None

    @property
    def name(self) -> str:
        """A short label for log lines, e.g. 'worker-1'."""
        return f"{self.task_type}-{self.task_index}"


SINGLE_PROCESS = Cluster(task_type="worker", task_index=0, members={})


def _fail(field: str, problem: str, fix: str) -> ClusterConfigError:
    return ClusterConfigError(f"TF_CONFIG {field}: {problem}. Fix: {fix}")


def parse_tf_config(text: str | None) -> Cluster:
    """Parses the TF_CONFIG text; None or blank means one process without distribution."""
    if text is None or not text.strip():
        return SINGLE_PROCESS
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise _fail("(whole value)", f"not valid JSON ({error.msg} at line {error.lineno} column {error.colno})",
                    'set it to JSON such as {"cluster": {"worker": ["host:2222"]}, '
                    '"task": {"type": "worker", "index": 0}}') from None
    if not isinstance(config, dict):
        raise _fail("(whole value)", f"expected a JSON object, got {type(config).__name__}",
                    "set TF_CONFIG to an object with 'cluster' and 'task' keys")
    cluster = config.get("cluster") or {}
    if not isinstance(cluster, dict):
        raise _fail("cluster", "must be an object mapping task types to address lists",
                    'use {"worker": ["host:port", ...]}')
    members: dict[str, tuple[str, ...]] = {}
    for task_type, addresses in cluster.items():
        if task_type == "master":
            raise _fail("cluster.master", "MultiWorkerMirroredStrategy rejects the task type 'master'",
                        "rename it to 'chief' (in a TFJob: use a Chief replica, or Workers only)")
        if task_type not in KNOWN_TYPES:
            raise _fail(f"cluster.{task_type}", "unknown task type", f"use only {', '.join(KNOWN_TYPES)}")
        if not isinstance(addresses, list) or not all(isinstance(a, str) and a for a in addresses):
            raise _fail(f"cluster.{task_type}", "must be a list of 'host:port' strings",
                        f'use "{task_type}": ["host:2222"]')
        members[task_type] = tuple(addresses)
    if len(members.get("chief", ())) > 1:
        raise _fail("cluster.chief", f"has {len(members['chief'])} entries; a group has at most one chief",
                    "list one chief and put the rest under 'worker'")

    training = len(members.get("chief", ())) + len(members.get("worker", ()))
    task = config.get("task")
    if task is None:
        if sum(len(a) for a in members.values()) <= 1:
            return SINGLE_PROCESS
        raise _fail("task", "missing", 'add "task": {"type": "worker", "index": <this process\'s index>}')
    if not isinstance(task, dict):
        raise _fail("task", "must be an object", 'use "task": {"type": "worker", "index": 0}')
    task_type = task.get("type")
    index = task.get("index", 0)
    if task_type == "master":
        raise _fail("task.type", "'master' is rejected by MultiWorkerMirroredStrategy",
                    "use 'chief' (TFJob: a Chief replica) or 'worker'")
    if task_type == "ps":
        raise _fail("task.type", "'ps' (parameter server) is not supported by this trainer, which trains with "
                    "MultiWorkerMirroredStrategy (all-reduce, no parameter servers)",
                    "remove the PS replicas from the job and use Worker (and optionally one Chief) replicas")
    if not isinstance(task_type, str) or task_type not in KNOWN_TYPES:
        raise _fail("task.type", f"{task_type!r} is not a task type",
                    f"use one of {', '.join(TRAINING_TYPES)} or evaluator")
    if task_type not in members:
        raise _fail("task.type",
                    f"'{task_type}' has no list in cluster (cluster has {', '.join(members) or 'nothing'})",
                    f'add "{task_type}": ["host:port"] to cluster, or fix task.type')
    if isinstance(index, bool) or not isinstance(index, int):
        raise _fail("task.index", f"must be an integer, got {index!r}",
                    "use the position of this task in its cluster list")
    if not 0 <= index < len(members[task_type]):
        raise _fail("task.index", f"{index} is out of range: cluster.{task_type} has {len(members[task_type])} entries",
                    f"use 0..{len(members[task_type]) - 1}")
    if task_type in TRAINING_TYPES and training <= 1:
        return SINGLE_PROCESS
    return Cluster(task_type=task_type, task_index=index, members=members)


def from_environment(environ: Mapping[str, str] | None = None) -> Cluster:
    return parse_tf_config((os.environ if environ is None else environ).get("TF_CONFIG"))
