"""A TFJob as a Katib trial (make tune-cluster; scripts/tune/cluster.py finds it here by the engine): the sync shape
only, the searched flags and the trial's own variables on every worker, and which pod's output Katib reads."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from k8s.engines.tfjob.customize import TRAINER_CONTAINER
from scripts.common import manifest
from scripts.common.manifest import Manifest

# The pod whose output Katib's collector reads: the first worker (the chief; the operator labels it master when no
# Chief replica exists), its `tensorflow` container.
PRIMARY_CONTAINER = TRAINER_CONTAINER
PRIMARY_LABELS = {"training.kubeflow.org/job-role": "master"}
POD_LABEL = "training.kubeflow.org/job-name"  # on every pod of the job, valued with its name
SHARED_KINDS: tuple[str, ...] = ()  # nothing of its own that every trial shares


def asynchronous(objects: list[Manifest]) -> bool:
    return set(manifest.the_one(objects, "TFJob")["spec"]["tfReplicaSpecs"]) != {"Worker"}


def trial_spec(objects: list[Manifest], flags: Sequence[str], env: list[dict[str, str]]) -> Manifest:
    """The TFJob one trial runs: every worker runs the image's entrypoint with the searched flags and the trial's own
    variables, its termination message falling back to its log."""
    job = copy.deepcopy(manifest.the_one(objects, "TFJob"))
    for replica in job["spec"]["tfReplicaSpecs"].values():
        for container in replica["template"]["spec"]["containers"]:
            if container["name"] == TRAINER_CONTAINER:
                container["command"] = list(manifest.IMAGE_ENTRYPOINT)
                container["terminationMessagePolicy"] = "FallbackToLogsOnError"
                container["args"] = [*(container.get("args") or []), *flags]
                names = {entry["name"] for entry in env}
                container["env"] = env + [e for e in container.get("env") or [] if e["name"] not in names]
    return job


def command_words(trial: Manifest, primary: str) -> list[str]:
    """What Katib's collector joins into the chief's `sh -c` line: its container's command and args."""
    containers = [c for t in manifest.pod_templates(trial) for c in t["spec"]["containers"]]
    return [w for c in containers if c["name"] == primary for w in c["command"] + c["args"]]
