"""The local runner's TrainJob (k8s/engines/trainjob/local_run.py): the JobSet Kubeflow Trainer v2 makes of a
TrainJob and its runtime, and what run-local does not emulate of a TrainJob."""

from __future__ import annotations

import copy
import json

import pytest

from k8s.engines.trainjob.local_run import jobset_for
from scripts.common.manifest import ManifestError, overlay, render
from scripts.localrun import manifests


def trainjob_and_runtime():
    objects = render(overlay("trainjob", "async"))
    trainjob = next(o for o in objects if o["kind"] == "TrainJob")
    runtime = next(o for o in objects if o["kind"] == "TrainingRuntime")
    return copy.deepcopy(trainjob), copy.deepcopy(runtime)


def test_the_trainjob_runs_as_the_jobset_overlays_jobset_renamed_as_trainer_v2_names_it():
    trainjob, runtime = trainjob_and_runtime()
    made = jobset_for(trainjob, runtime)
    shipped = next(o for o in render(overlay("jobset", "async")) if o["kind"] == "JobSet")
    renamed = json.loads(json.dumps(shipped["spec"]).replace('"worker"', '"node"').replace('"trainer"', '"node"'))
    renamed["replicatedJobs"][2]["template"]["metadata"] = {
        "labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    }
    for rjob in renamed["replicatedJobs"]:
        for entry in rjob["template"]["spec"]["template"]["spec"]["containers"][0]["env"]:
            if entry["name"] == "TF_CONFIG":  # the workers' addresses name the node Job; their task type is worker
                entry["value"] = entry["value"].replace("-worker-0-", "-node-0-")
            if entry["name"] == "TF_TASK_TYPE" and entry["value"] == "node":
                entry["value"] = "worker"
    assert made["metadata"]["name"] == trainjob["metadata"]["name"]
    assert made["spec"] == renamed


def test_the_trainjobs_overrides_apply_as_trainer_v2_applies_them():
    trainjob, runtime = trainjob_and_runtime()
    trainjob["spec"]["trainer"].update(
        numNodes=4,
        image="mine:2",
        command=["python", "-m", "trainer"],
        args=["--epochs", "9"],
        env=[{"name": "TRAINER_THREADS", "value": "1"}, {"name": "EXTRA", "value": "x"}],
        resourcesPerNode={"limits": {"memory": "8Gi"}},
    )
    made = jobset_for(trainjob, runtime)
    jobs = {rjob["name"]: rjob for rjob in made["spec"]["replicatedJobs"]}
    node = jobs["node"]["template"]["spec"]
    assert (jobs["node"]["replicas"], node["parallelism"], node["completions"]) == (1, 4, 4)
    container = node["template"]["spec"]["containers"][0]
    assert (container["image"], container["command"], container["args"]) == (
        "mine:2",
        ["python", "-m", "trainer"],
        ["--epochs", "9"],
    )
    env = [(e["name"], e.get("value")) for e in container["env"]]
    assert ("TRAINER_THREADS", "1") in env and env[-1] == ("EXTRA", "x")
    assert [name for name, _ in env].count("TRAINER_THREADS") == 1  # upserted in place
    # Merged over the runtime's limits (the ephemeral storage of its read-only pods stays).
    assert container["resources"]["limits"] == {"cpu": "2", "ephemeral-storage": "4Gi", "memory": "8Gi"}
    chief = jobs["chief"]["template"]["spec"]
    assert chief["parallelism"] == 1 and chief["template"]["spec"]["containers"][0]["image"] != "mine:2"


@pytest.mark.parametrize(
    "change, says",
    [
        (lambda tj, rt: tj["spec"].update(initializer={"dataset": {}}), "not supported locally: spec.initializer"),
        (lambda tj, rt: tj["spec"]["trainer"].update(numProcPerNode=2), "spec.trainer.numProcPerNode"),
        (lambda tj, rt: rt["spec"]["mlPolicy"].update(torch={}), "mlPolicy.torch (only plainML)"),
        (lambda tj, rt: tj["spec"]["runtimeRef"].update(name="elsewhere"), "which the manifests do not hold"),
    ],
)
def test_what_run_local_does_not_emulate_of_a_trainjob_stops_it(change, says):
    objects = render(overlay("trainjob", "sync"))
    trainjob = next(o for o in objects if o["kind"] == "TrainJob")
    runtime = next(o for o in objects if o["kind"] == "TrainingRuntime")
    change(trainjob, runtime)
    with pytest.raises(ManifestError) as error:
        manifests.parse(objects, "x")
    assert says in str(error.value)
