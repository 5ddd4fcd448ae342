"""make submit-pipeline's command line, its check of the volume claim, and how it follows a Workflow
(scripts/pipeline/submit.py), without a cluster: the Workflow's status is fed in as Argo writes it. The real Argo is
scripts/node/tests/test_serving_pipeline.py's."""

from __future__ import annotations

import pytest

import claim_cluster
from scripts.common import kubectl as project_kubectl
from scripts.common import manifest
from scripts.common.settings import load
from scripts.pipeline import cluster, submit


def test_the_trainers_flags_after_the_separator_reach_the_workflow():
    # Before: argparse gave the "*" positional nothing and refused `-- --train-examples 8` as unrecognized.
    args = submit.parse(["workflow", "--image", "img:1", "--epochs", "1", "--", "--train-examples", "8", "--x"])
    assert args.what == "workflow" and args.epochs == 1
    assert args.trainer_args == ["--train-examples", "8", "--x"]
    assert submit.parse(["serving", "--image", "img:1"]).trainer_args == []


def test_an_unknown_flag_of_ours_is_refused_before_anything_runs(capsys):
    with pytest.raises(SystemExit) as refused:
        submit.parse(["workflow", "--image", "img:1", "--bogus"])
    assert refused.value.code == 2 and "--bogus" in capsys.readouterr().err


def node(name: str, phase: str, start: str, end: str | None = None, message: str = "") -> dict:
    return {"displayName": name, "type": "Pod", "phase": phase, "startedAt": start, "finishedAt": end,
            "message": message}  # fmt: skip


def follow_through(monkeypatch, states: list[dict]) -> int:
    feed = iter(states)
    monkeypatch.setattr(submit, "status", lambda name, namespace: next(feed))
    return submit.follow("wf", "ns", timeout_s=60, poll_s=0)


def test_each_step_is_printed_as_it_changes_and_a_success_ends_with_each_steps_time(monkeypatch, capsys):
    running = {"phase": "Running", "nodes": {"a": node("prepare-data", "Running", "2026-12-02T06:00:00Z")}}
    done = {
        "phase": "Succeeded",
        "startedAt": "2026-12-02T06:00:00Z",
        "finishedAt": "2026-12-02T06:02:00Z",
        "nodes": {
            "a": node("prepare-data", "Succeeded", "2026-12-02T06:00:00Z", "2026-12-02T06:00:12Z"),
            "b": node("select", "Succeeded", "2026-12-02T06:01:00Z", "2026-12-02T06:01:03Z"),
        },
    }
    assert follow_through(monkeypatch, [running, running, done]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed.count("  prepare-data: Running") == 1 and "  prepare-data: Succeeded" in printed
    assert "Workflow wf: Succeeded in 120 s" in printed
    assert "     12.0 s  prepare-data" in printed and "      3.0 s  select" in printed


def test_a_failed_workflow_exits_1_naming_the_failed_step_and_argos_message(monkeypatch, capsys):
    failed = {
        "phase": "Failed",
        "message": "child failed",
        "nodes": {"a": node("train-x", "Failed", "2026-12-02T06:00:00Z", "2026-12-02T06:00:09Z", "TFJob failed")},
    }
    assert follow_through(monkeypatch, [failed]) == 1
    captured = capsys.readouterr()
    assert "  train-x: Failed: TFJob failed" in captured.out
    assert "error: the Workflow wf failed: child failed; train-x: TFJob failed" in captured.err


def test_a_claim_the_variants_cannot_share_over_the_nodes_is_refused_before_anything_is_made(monkeypatch, capsys):
    calls: list[tuple[str, ...]] = []
    two_nodes = claim_cluster.cluster([claim_cluster.node("a"), claim_cluster.node("b")])
    kubectl = claim_cluster.project_kubectl(two_nodes, calls)
    monkeypatch.setattr(project_kubectl, "kubectl", kubectl)
    monkeypatch.setattr(submit, "kubectl", kubectl)
    monkeypatch.setattr(submit, "follow", lambda name, namespace, timeout_s: 0)
    argv = ["workflow", "--image", "img:1", "--models", "cnn", "dropout"]
    assert submit.main(argv) == 2
    err = capsys.readouterr().err
    assert "error: the claim training-volume is ReadWriteOnce" in err and "SPREAD_OVER_NODES=0" in err, err
    assert calls == [], "the service account or the Workflow was created before the claim's check"
    # The settings' mode and class reach the claim the Workflow applies; a ReadWriteMany one passes.
    monkeypatch.setenv("VOLUME_ACCESS_MODE", "ReadWriteMany")
    monkeypatch.setenv("VOLUME_STORAGE_CLASS", "local-path-shared")
    (claim,) = manifest.of_kind(
        cluster.created_objects(cluster.workflow_of(submit.parse(argv), load())), "PersistentVolumeClaim"
    )
    assert (claim["spec"]["accessModes"], claim["spec"]["storageClassName"]) == (["ReadWriteMany"], "local-path-shared")
    assert submit.main(argv) == 0
    assert [call[0] for call in calls] == ["apply", "create"], calls
