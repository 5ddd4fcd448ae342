"""The local runner's part of a JobSet (scripts/localrun/ finds it here by the engine's folder): what it emulates of
a JobSet (`validate`), one process per pod with the names, labels and hostnames JobSet and Kubernetes give it
(`plan`), and the controller's rules over them (`rules`, local_rules.py's JobSetRules). Cluster DNS is not there:
each pod's TF_CONFIG, as its template writes it, has every pod's DNS name replaced by a 127.0.0.1 address."""

from __future__ import annotations

import json
from typing import Any

from scripts.common.manifest import ManifestError, trainer_of
from scripts.common.ports import free_ports
from scripts.localrun.envvars import PodMeta
from scripts.localrun.manifests import Manifests
from scripts.localrun.operator_rules import Replica
from scripts.localrun.podplan import Planner, ProcessPlan
from trainer.base.errors import ClusterConfigError
from trainer.distribution.cluster import cluster_members

from .local_rules import ACTIONS, POD_FAILURE_ACTIONS, JobSetRules, JobState, job_backoff_limit

# The Jobs of the JobSet, and each replica's (trainer container, pod name).
Planned = tuple[list[JobState], dict[str, tuple[str, str]]]

# What run-local emulates of a JobSet (fields outside these stop the run with "not supported locally").
JOBSET_SPEC_FIELDS = (
    "replicatedJobs",
    "network",
    "successPolicy",
    "failurePolicy",
    "startupPolicy",
    "suspend",
    "ttlSecondsAfterFinished",
)
JOB_SPEC_FIELDS = (
    "completionMode",
    "parallelism",
    "completions",
    "backoffLimit",
    "activeDeadlineSeconds",
    "podFailurePolicy",
    "template",
    "ttlSecondsAfterFinished",
)
JOBSET_RESTART_POLICIES = ("Never", "OnFailure")


def validate(jobset: dict[str, Any]) -> None:
    """The JobSet fields and values run-local emulates; anything else stops the run with "not supported locally"."""
    name = jobset["metadata"]["name"]
    spec = jobset.get("spec") or {}
    where = f"JobSet {name}"
    problems = [
        f"not supported locally: spec.{field} (in {where})" for field in spec if field not in JOBSET_SPEC_FIELDS
    ]
    if spec.get("suspend"):
        problems.append(f"{where} has spec.suspend: true; JobSet would start no pod")
    if (spec.get("startupPolicy") or {}).get("startupPolicyOrder", "AnyOrder") != "AnyOrder":
        problems.append(f"not supported locally: spec.startupPolicy.startupPolicyOrder InOrder (in {where})")
    network = spec.get("network") or {}
    if network.get("enableDNSHostnames") is False:
        problems.append(
            f"{where}: network.enableDNSHostnames is false, so pods get no DNS names and the trainer cannot build "
            f"its group from them; remove it (JobSet's default is true)"
        )
    for index, rule in enumerate((spec.get("failurePolicy") or {}).get("rules") or []):
        if rule.get("action") not in ACTIONS:
            problems.append(
                f"not supported locally: spec.failurePolicy.rules[{index}].action {rule.get('action')} (in {where})"
            )
    if (spec.get("failurePolicy") or {}).get("restartStrategy", "Recreate") not in ("Recreate", "BlockingRecreate"):
        problems.append(f"not supported locally: spec.failurePolicy.restartStrategy (in {where})")
    for rjob in spec.get("replicatedJobs") or []:
        path = f"{where} replicatedJobs[{rjob.get('name')}]"
        job_spec = rjob["template"]["spec"]
        problems += [f"not supported locally: {f} (in {path})" for f in job_spec if f not in JOB_SPEC_FIELDS]
        if job_spec.get("completionMode", "Indexed") != "Indexed":
            problems.append(f"not supported locally: completionMode {job_spec['completionMode']} (in {path})")
        if int(job_spec.get("completions", job_spec.get("parallelism", 1))) != int(job_spec.get("parallelism", 1)):
            problems.append(f"not supported locally: completions other than parallelism (in {path})")
        policy = job_spec["template"]["spec"].get("restartPolicy", "OnFailure")  # JobSet's webhook default
        if policy not in JOBSET_RESTART_POLICIES:
            problems.append(f"{path}: a Job's pods have restartPolicy Never or OnFailure, not {policy}")
        rules = (job_spec.get("podFailurePolicy") or {}).get("rules") or []
        if rules and policy != "Never":
            problems.append(
                f"{path}: podFailurePolicy needs the pod's restartPolicy Never (Kubernetes rejects the Job)"
            )
        for index, rule in enumerate(rules):
            if "onPodConditions" in rule or rule.get("action") not in POD_FAILURE_ACTIONS:
                problems.append(
                    f"not supported locally: podFailurePolicy.rules[{index}] (in {path}): only FailJob, "
                    f"Ignore and Count on onExitCodes are"
                )
    if problems:
        raise ManifestError(f"JobSet {name} cannot run:\n  " + "\n  ".join(problems))


def plan(self: Planner) -> tuple[list[tuple[Replica, ProcessPlan]], Planned]:
    """One process per pod of the JobSet (each replicated job: replicas Jobs x parallelism pods), with the
    names, labels, hostnames and JOB_COMPLETION_INDEX that JobSet and Kubernetes give it; the Jobs; and each
    replica's (trainer container, pod name)."""
    jobset, js = self.manifests.job, self.manifests.name
    spec = jobset["spec"]
    subdomain = (spec.get("network") or {}).get("subdomain") or js
    rjobs = spec.get("replicatedJobs") or []
    global_replicas = sum(int(rjob.get("replicas", 1)) for rjob in rjobs)
    planned: list[tuple[Replica, ProcessPlan]] = []
    jobs: list[JobState] = []
    pods: dict[str, tuple[str, str]] = {}
    hosts: dict[str, str] = {}  # each replica's pod's DNS name
    job_global_index = 0
    for rjob in rjobs:
        job_spec = rjob["template"]["spec"]
        template = job_spec["template"]
        pod_spec = template["spec"]
        container = trainer_of(template)
        for other in pod_spec.get("initContainers", []) + pod_spec["containers"]:
            if other is not container:
                self.problems.notes.append(
                    f"JobSet {js} {rjob['name']}: container {other.get('name')!r} is not run locally "
                    f"(only the trainer's, {container.get('name')!r}, is)"
                )
        parallelism = int(job_spec.get("parallelism", 1))
        for job_index in range(int(rjob.get("replicas", 1))):
            job_name = f"{js}-{rjob['name']}-{job_index}"  # placement.GenJobName
            job_pods = []
            jobset_labels = {
                "jobset.sigs.k8s.io/jobset-name": js,
                "jobset.sigs.k8s.io/replicatedjob-name": rjob["name"],
                "jobset.sigs.k8s.io/replicatedjob-replicas": str(rjob.get("replicas", 1)),
                "jobset.sigs.k8s.io/job-index": str(job_index),
                "jobset.sigs.k8s.io/job-global-index": str(job_global_index),
                "jobset.sigs.k8s.io/global-replicas": str(global_replicas),
                "jobset.sigs.k8s.io/restart-attempt": "0",
            }
            job_global_index += 1
            for pod_index in range(parallelism):
                hostname = f"{job_name}-{pod_index}"  # an Indexed Job's pod hostname
                pod_name = f"{hostname}-local"
                meta = template.get("metadata") or {}
                index_labels = {
                    "batch.kubernetes.io/job-completion-index": str(pod_index),
                    "batch.kubernetes.io/job-name": job_name,
                    "job-name": job_name,
                }
                pod = PodMeta(
                    name=pod_name,
                    namespace=self.manifests.namespace,
                    labels={**(meta.get("labels") or {}), **jobset_labels, **index_labels},
                    annotations={
                        **(meta.get("annotations") or {}),
                        **jobset_labels,
                        "batch.kubernetes.io/job-completion-index": str(pod_index),
                    },
                    unstable=frozenset({"jobset.sigs.k8s.io/restart-attempt"}),
                )
                replica = Replica(
                    rtype=rjob["name"],
                    index=job_index * parallelism + pod_index,
                    restart_policy=pod_spec.get("restartPolicy", "OnFailure"),  # JobSet's webhook default
                )
                where = f"JobSet {js} {rjob['name']} job {job_index} pod {pod_index}"
                plan = self.plan_container(replica.name, pod_name, pod_spec, container, where, pod, hostname)
                # The Job controller sets it in every container of an Indexed Job's pod.
                plan.env.setdefault("JOB_COMPLETION_INDEX", str(pod_index))
                hosts[replica.name] = f"{hostname}.{subdomain}"
                pods[replica.name] = (str(container.get("name")), pod_name)
                job_pods.append(replica.name)
                planned.append((replica, plan))
            jobs.append(
                JobState(
                    name=job_name,
                    replicated_job=rjob["name"],
                    pods=job_pods,
                    backoff_limit=job_backoff_limit(job_spec),
                    pod_failure_rules=list((job_spec.get("podFailurePolicy") or {}).get("rules") or []),
                )
            )
    local_tf_configs(js, planned, hosts)
    names = [replica.rtype for replica, _ in planned]
    leader = "chief" if "chief" in names else next((n for n in ("worker", "node") if n in names), names[0])
    self.chief = next(plan for replica, plan in planned if replica.rtype == leader and replica.index == 0)
    return planned, (jobs, pods)


def rules(manifests: Manifests, replicas: list[tuple[Replica, ProcessPlan]], planned: Planned) -> JobSetRules:
    jobs, pods = planned
    return JobSetRules(manifests.name, manifests.namespace, manifests.job["spec"], [r for r, _ in replicas], jobs, pods)


def local_tf_configs(jobset: str, planned: list[tuple[Replica, ProcessPlan]], hosts: dict[str, str]) -> None:
    """Each pod's TF_CONFIG with every address on 127.0.0.1, a port each; refuses a TF_CONFIG that is not JSON once
    expanded, or that lists no address for one of the JobSet's pods or one for a pod the JobSet does not have."""
    configs = {}
    for replica, plan in planned:
        where = f"JobSet {jobset} pod {hosts[replica.name]}: TF_CONFIG"
        try:
            config = json.loads(plan.env.get("TF_CONFIG") or "null")
            cluster = cluster_members((config or {})["cluster"])
        except (ValueError, TypeError, KeyError, ClusterConfigError) as error:
            raise ManifestError(
                f"{where} is not a cluster once its variables are expanded ({error}): {plan.env.get('TF_CONFIG')!r}"
            ) from None
        configs[replica.name] = (config, cluster)
    addresses = list(dict.fromkeys(a for _, cluster in configs.values() for listed in cluster.values() for a in listed))
    by_host = {address.rsplit(":", 1)[0]: address for address in addresses}
    problems = [f"pod {host} has no address in TF_CONFIG's cluster" for host in hosts.values() if host not in by_host]
    problems += [
        f"TF_CONFIG lists {address}, which is no pod of the JobSet"
        for host, address in by_host.items()
        if host not in hosts.values()
    ]
    if problems:
        raise ManifestError(
            f"JobSet {jobset}: " + "; ".join(problems) + ". Make TF_CONFIG's cluster name each replicated job's pods, "
            "<jobset>-<replicatedJob>-0-<index>.<jobset>:<port> (k8s/engines/jobset/sync/jobset.yaml)"
        )
    local = dict(zip(addresses, (f"127.0.0.1:{port}" for port in free_ports(len(addresses))), strict=True))
    for replica, plan in planned:
        config, cluster = configs[replica.name]
        members = {task_type: [local[a] for a in listed] for task_type, listed in cluster.items()}
        plan.env["TF_CONFIG"] = json.dumps({**config, "cluster": members}, separators=(",", ":"))
