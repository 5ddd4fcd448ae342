"""A TrainJob as a Katib trial (make tune-cluster; scripts/tune/cluster.py finds it here by the engine): the sync
shape only (the runtime's one `node` job), the searched flags and the trial's own variables in the TrainJob's trainer
overrides, and which pod's output Katib reads."""

from __future__ import annotations

import copy
from collections.abc import Sequence

from k8s.engines.trainjob.local_run import NODE, RUNTIME_KINDS, runtime_of
from scripts.common import manifest
from scripts.common.manifest import Manifest

# The pod whose output Katib's collector reads: the first pod of the runtime's `node` job, its `node` container.
PRIMARY_CONTAINER = NODE
PRIMARY_LABELS = {"jobset.sigs.k8s.io/replicatedjob-name": NODE, "batch.kubernetes.io/job-completion-index": "0"}
POD_LABEL = "jobset.sigs.k8s.io/jobset-name"  # on every pod of the job (its JobSet is named after it)
SHARED_KINDS = RUNTIME_KINDS  # the runtime every trial's TrainJob names, applied once


def asynchronous(objects: list[Manifest]) -> bool:
    replicated = runtime_of(objects)["spec"]["template"]["spec"]["replicatedJobs"]
    return [job["name"] for job in replicated] != [NODE]


def trial_spec(objects: list[Manifest], flags: Sequence[str], env: list[dict[str, str]]) -> Manifest:
    """The TrainJob one trial runs. Its trainer container lives in the runtime, shared by every trial (applied once,
    so the termination message is set there): the trial's own values go into the TrainJob's trainer overrides, which
    Trainer applies to that container."""
    job = copy.deepcopy(manifest.the_one(objects, "TrainJob"))
    (template,) = manifest.pod_templates(runtime_of(objects))
    container = manifest.trainer_of(template)
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    trainer = job["spec"].setdefault("trainer", {})
    trainer["command"] = list(manifest.IMAGE_ENTRYPOINT)
    trainer["args"] = [*(container.get("args") or []), *flags]
    trainer["env"] = env
    return job


def command_words(trial: Manifest, primary: str) -> list[str]:
    """What Katib's collector joins into the chief's `sh -c` line: the TrainJob's trainer command and args."""
    return trial["spec"]["trainer"]["command"] + trial["spec"]["trainer"]["args"]
