"""The TF_CONFIG the JobSet overlays write into their pod template, as Kubernetes expands it in each pod (the
downward API's label and completion index, the settings' WORKERS and TFJOB_PORT), read by the trainer: every shape
the overlays ship, under JobSet and under Trainer v2, at the settings' worker count and at one make gives."""

from __future__ import annotations

import pytest

import engines_here
from k8s.engines.jobset import local_run
from scripts.common.manifest import customize, overlay, render
from scripts.common.settings import load
from scripts.localrun import manifests
from scripts.localrun.envvars import Problems
from scripts.localrun.podplan import Planner
from trainer.distribution.cluster import parse_tf_config


def pods_as_the_cluster_expands_them(engine, strategy, workers, tmp_path, monkeypatch):
    """Each pod's (hostname, variables) as run-local plans them, but with TF_CONFIG left as the pod would hold it on a
    cluster, before run-local puts its addresses on 127.0.0.1."""
    monkeypatch.setattr(local_run, "local_tf_configs", lambda *args: None)
    objects = render(overlay(engine, strategy))
    if workers is not None:
        objects = customize(objects, workers=workers)
    problems = Problems()
    planned, _ = local_run.plan(Planner(manifests.parse(objects, engine), tmp_path, problems))
    assert not problems.errors, problems.errors
    return [(plan.env["HOSTNAME"], plan.env) for _, plan in planned]


@pytest.mark.parametrize("engine", [e for (e,) in engines_here.present(("jobset",), ("trainjob",))])
@pytest.mark.parametrize("strategy", ["sync", "async"])
@pytest.mark.parametrize("workers", [None, 3])
def test_every_pod_reads_the_group_of_the_pods_dns_names_and_finds_itself_in_it(
    engine, strategy, workers, tmp_path, monkeypatch
):
    settings = load()
    pods = pods_as_the_cluster_expands_them(engine, strategy, workers, tmp_path, monkeypatch)
    addresses = {f"{hostname}.{settings['JOB_NAME']}:{settings['TFJOB_PORT']}" for hostname, _ in pods}
    clusters = {hostname: parse_tf_config(env["TF_CONFIG"]) for hostname, env in pods}
    for hostname, cluster in clusters.items():
        assert {a for listed in cluster.members.values() for a in listed} == addresses
        own = cluster.members[cluster.task_type][cluster.task_index]
        assert own == f"{hostname}.{settings['JOB_NAME']}:{settings['TFJOB_PORT']}", (hostname, cluster)
    first = next(iter(clusters.values()))
    assert len(first.members["worker"]) == (workers or int(settings["WORKERS"]))
    assert first.strategy == strategy
    if strategy == "async":
        roles = sorted(cluster.role for cluster in clusters.values())
        assert roles == sorted(["coordinator", "evaluator", "server"] + ["server"] * len(first.members["worker"]))
