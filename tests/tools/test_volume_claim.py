"""The check of the job's volume against the cluster, before a command creates anything: the claim's class must
exist, an existing claim must be the one asked for, and a ReadWriteOnce claim must not serve pods spread over nodes.
The cluster is a fake kubectl answering as the API server does (its JSON); the job is the real rendered overlay."""

from __future__ import annotations

import pathlib

import pytest

from claim_cluster import cluster, node
from scripts.common import manifest, volume_claim

ROOT = pathlib.Path(__file__).resolve().parents[2]
OVERLAY = ROOT / "k8s/engines/tfjob/sync"


def job(monkeypatch, **settings: str) -> list[dict]:
    for key, value in settings.items():
        monkeypatch.setenv(key, value)
    return manifest.render(OVERLAY)


def test_a_read_write_once_claim_is_refused_where_the_job_spreads_over_several_nodes_naming_each_fix(monkeypatch):
    with pytest.raises(volume_claim.VolumeClaimError) as refused:
        volume_claim.check(job(monkeypatch), "default", cluster([node("a"), node("b")]))
    message = str(refused.value)
    assert "the claim training-volume is ReadWriteOnce" in message and "2 nodes (a, b)" in message
    assert "VOLUME_ACCESS_MODE=ReadWriteMany" in message and "local-path-shared" in message
    assert "SPREAD_OVER_NODES=0" in message


def test_one_node_a_read_write_many_claim_or_no_spread_is_accepted(monkeypatch):
    volume_claim.check(job(monkeypatch), "default", cluster([node("a")]))
    # A node that is not Ready or is cordoned takes no pod: one node remains.
    volume_claim.check(
        job(monkeypatch), "default", cluster([node("a"), node("b", ready=False), node("c", cordoned=True)])
    )
    shared = job(monkeypatch, VOLUME_ACCESS_MODE="ReadWriteMany", VOLUME_STORAGE_CLASS="local-path-shared")
    assert manifest.the_one(shared, "PersistentVolumeClaim")["spec"]["accessModes"] == ["ReadWriteMany"]
    volume_claim.check(shared, "default", cluster([node("a"), node("b")]))
    on_purpose = job(monkeypatch, VOLUME_ACCESS_MODE="ReadWriteOnce", SPREAD_OVER_NODES="0")
    assert not volume_claim.spreads_over_nodes(on_purpose)
    volume_claim.check(on_purpose, "default", cluster([node("a"), node("b")]))


def test_a_class_the_cluster_lacks_is_named_with_the_ones_it_has(monkeypatch):
    objects = job(monkeypatch, VOLUME_STORAGE_CLASS="standard-rwx")
    with pytest.raises(volume_claim.VolumeClaimError, match=r"VOLUME_STORAGE_CLASS=standard-rwx: this cluster has no"):
        volume_claim.check(objects, "default", cluster([node("a")], classes=("gp2", "efs")))
    with pytest.raises(volume_claim.VolumeClaimError, match=r"\(it has: efs, gp2\)"):
        volume_claim.check(objects, "default", cluster([node("a")], classes=("gp2", "efs")))


def test_an_existing_claim_of_another_mode_or_class_is_refused_naming_both_ways_out(monkeypatch):
    held = {
        "metadata": {"name": "training-volume"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "local-path"},
    }
    objects = job(monkeypatch, VOLUME_ACCESS_MODE="ReadWriteMany", VOLUME_STORAGE_CLASS="local-path-shared")
    with pytest.raises(volume_claim.VolumeClaimError) as refused:
        volume_claim.check(objects, "default", cluster([node("a"), node("b")], claim=held))
    message = str(refused.value)
    assert "exists as ReadWriteOnce on class local-path" in message
    assert "ReadWriteMany on local-path-shared" in message and "VOLUME_CLAIM=another-name" in message
    assert "kubectl delete pvc training-volume -n default" in message
    # The same claim, asked for as it is, passes on one node.
    volume_claim.check(
        job(monkeypatch, VOLUME_ACCESS_MODE="ReadWriteOnce", VOLUME_STORAGE_CLASS="local-path"),
        "default",
        cluster([node("a")], claim=held),
    )
