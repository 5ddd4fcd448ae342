"""What JobSet's admission webhook (and its CRD's CEL rules) rejects, read from its source at the pinned tag (this
folder's settings.env), applied before anything reaches a cluster (make submit, and the offline tests).

JobSet v0.12.0: `pkg/webhooks/jobset_webhook.go` (Default, then ValidateCreate with the default feature gates:
InPlaceRestart and RestartJob off, `pkg/features/features.go`), `pkg/util/placement/placement.go` (GenJobName,
GenPodName), and the CEL rule of `config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml`.
Rules that need the cluster or that only apply to updates are left out.
"""

from __future__ import annotations

import re
from typing import Any

Manifest = dict[str, Any]

# apimachinery's IsDNS1035Label / IsDNS1123Subdomain / IsValidLabelValue.
DNS_1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL_MAX, DNS_SUBDOMAIN_MAX = 63, 253
INT32_MAX = 2**31 - 1
# jobset_webhook.go: ruleNameFmt, min/maxRuleNameLength, validOnJobFailureReasons, the actions behind RestartJob.
RULE_NAME = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")
RULE_NAME_MAX = 128
JOB_FAILURE_REASONS = (
    "BackoffLimitExceeded",
    "DeadlineExceeded",
    "FailedIndexes",
    "MaxFailedIndexesExceeded",
    "PodFailurePolicy",
)
GATED_ACTIONS = ("RestartJob", "RestartJobAndIgnoreMaxRestarts")
# The pod name suffix Kubernetes appends, counted by the webhook as "-abcde".
POD_SUFFIX = "-abcde"


def dns_1035_problems(value: str) -> list[str]:
    problems = []
    if len(value) > DNS_LABEL_MAX:
        problems.append(f"must be no more than {DNS_LABEL_MAX} characters")
    if not DNS_1035_LABEL.match(value):
        problems.append("must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter)")
    return problems


def defaulted(spec: Manifest) -> Manifest:
    """The fields JobSet's mutating webhook fills in before validation (jobset_webhook.go Default), as read here."""
    replicated = []
    for rjob in spec.get("replicatedJobs") or []:
        job_spec = rjob.get("template", {}).get("spec", {})
        replicated.append(
            {
                **rjob,
                "groupName": rjob.get("groupName", "default"),  # the CRD's default
                "replicas": rjob.get("replicas", 1),  # the CRD's default
                "completionMode": job_spec.get("completionMode", "Indexed"),
            }
        )
    return {**spec, "replicatedJobs": replicated, "successPolicy": spec.get("successPolicy") or {"operator": "All"}}


def jobset_problems(name: str, spec: Manifest) -> list[str]:
    """What JobSet v0.12.0's webhook and CRD rules reject in a JobSet of this name and spec (create)."""
    spec = defaulted(spec)
    problems = [f"JobSet name {name!r}: {p}" for p in dns_1035_problems(name)]
    replicated = spec["replicatedJobs"]
    if replicated and replicated[0].get("dependsOn"):
        problems.append("DependsOn can't be set for the first ReplicatedJob")
    subdomain = (spec.get("network") or {}).get("subdomain") or ""
    if subdomain:
        if len(subdomain) > DNS_SUBDOMAIN_MAX or not DNS_1123_SUBDOMAIN.match(subdomain):
            problems.append(f"spec.network.subdomain {subdomain!r} is not a DNS-1123 subdomain")
        problems += [
            f"spec.network.subdomain {subdomain!r} (also the service name): {p}" for p in dns_1035_problems(subdomain)
        ]
    manager = spec.get("managedBy")
    if manager is not None:
        domain, _, path = manager.partition("/")
        if len(manager) > DNS_LABEL_MAX or not path or not DNS_1123_SUBDOMAIN.match(domain):
            problems.append(f"spec.managedBy {manager!r} must be a domain-prefixed path of at most 63 characters")
    names: list[str] = []
    for rjob in replicated:
        rname = rjob.get("name", "")
        if rname in names:
            problems.append(f"replicatedJob name {rname!r} appears twice (the CRD's list is keyed by name)")
        names.append(rname)
        job_spec = rjob.get("template", {}).get("spec", {})
        if job_spec.get("parallelism", 1) * rjob["replicas"] > INT32_MAX:
            problems.append(f"replicatedJob {rname!r}: replicas x parallelism exceeds {INT32_MAX}")
        problems += [f"replicatedJob {rname!r} groupName: {p}" for p in dns_1035_problems(rjob["groupName"])]
        longest_job = f"{name}-{rname}-{rjob['replicas'] - 1}"
        problems += [
            f"job name {longest_job!r} of replicatedJob {rname!r}: {p}" for p in dns_1035_problems(longest_job)
        ]
        if rjob["completionMode"] == "Indexed" and "completions" in job_spec:
            longest_pod = f"{longest_job}-{job_spec['completions'] - 1}{POD_SUFFIX}"
            problems += [
                f"pod name {longest_pod!r} of replicatedJob {rname!r}: {p}" for p in dns_1035_problems(longest_pod)
            ]
        for dependency in rjob.get("dependsOn") or []:
            if dependency.get("name") not in names[:-1]:
                problems.append(f"replicatedJob {rname!r} cannot depend on replicatedJob {dependency.get('name')!r}")
    for target in spec["successPolicy"].get("targetReplicatedJobs") or []:
        if target not in names:
            problems.append(f"successPolicy targetReplicatedJobs: {target!r} does not appear in spec.replicatedJobs")
    problems += failure_policy_problems(spec.get("failurePolicy"), names)
    startup = (spec.get("startupPolicy") or {}).get("startupPolicyOrder")
    if startup == "InOrder" and any("dependsOn" in rjob for rjob in replicated):
        problems.append("StartupPolicy and DependsOn APIs are mutually exclusive")  # the CRD's CEL rule
    if spec.get("coordinator"):
        problems += coordinator_problems(spec["coordinator"], replicated)
    return problems


def failure_policy_problems(policy: Manifest | None, names: list[str]) -> list[str]:
    """jobset_webhook.go validateFailurePolicy, with the default feature gates (RestartJob off)."""
    if not policy:
        return []
    problems = []
    if policy.get("restartStrategy") == "InPlaceRestart":
        problems.append("restartStrategy InPlaceRestart needs the InPlaceRestart feature gate (off by default)")
    rules = policy.get("rules") or []
    if any(rule.get("action") in GATED_ACTIONS for rule in rules):
        return problems + [f"failurePolicy actions {' and '.join(GATED_ACTIONS)} need the RestartJob feature gate"]
    # Default names rules without one failurePolicyRule<i>.
    rule_names = [rule.get("name") or f"failurePolicyRule{i}" for i, rule in enumerate(rules)]
    for rule, rule_name in zip(rules, rule_names, strict=True):
        if not 1 <= len(rule_name) <= RULE_NAME_MAX or not RULE_NAME.match(rule_name):
            problems.append(
                f"failurePolicy rule name {rule_name!r}: must be 1-{RULE_NAME_MAX} characters, start with a letter, "
                f"then letters, digits or '_,:', and end with a letter, digit or '_' (no '-')"
            )
        for target in rule.get("targetReplicatedJobs") or []:
            if target not in names:
                problems.append(f"failurePolicy rule {rule_name!r}: replicatedJob {target!r} does not exist")
        for reason in rule.get("onJobFailureReasons") or []:
            if reason not in JOB_FAILURE_REASONS:
                problems.append(f"failurePolicy rule {rule_name!r}: {reason!r} is not a job failure reason")
    for duplicate in sorted({n for n in rule_names if rule_names.count(n) > 1}):
        problems.append(f"failurePolicy rule names are not unique: {duplicate!r}")
    return problems


def coordinator_problems(coordinator: Manifest, replicated: list[Manifest]) -> list[str]:
    by_name = {rjob.get("name"): rjob for rjob in replicated}
    rjob = by_name.get(coordinator.get("replicatedJob"))
    if rjob is None:
        return [f"coordinator replicatedJob {coordinator.get('replicatedJob')!r} does not exist"]
    if not 0 <= coordinator.get("jobIndex", 0) < rjob["replicas"]:
        return [f"coordinator job index {coordinator.get('jobIndex')} is invalid"]
    completions = rjob.get("template", {}).get("spec", {}).get("completions")
    if rjob["completionMode"] != "Indexed" or completions is None:
        return ["job for coordinator pod must be indexed completion mode, and completions number must be set"]
    if not 0 <= coordinator.get("podIndex", 0) < completions:
        return [f"coordinator pod index {coordinator.get('podIndex')} is invalid"]
    return []
