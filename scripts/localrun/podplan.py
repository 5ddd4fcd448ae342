"""What each local process runs: argv, environment and working directory, built from a pod template.

The container's image is not used locally. Its command and args run as written; without a command
the image's ENTRYPOINT runs (the Dockerfile's: tini, then `python -m trainer`). A leading init
(tini) is dropped, because the runner's process group does its job here (forward signals, reap);
a `python` in argv[0] becomes this interpreter, the one whose environment holds the trainer.

A pod has its own network; local replicas share one host. So every named container port gets a free loopback
port, but those the engine addresses itself (a TFJob's tfjob-port, in TF_CONFIG), and env values and args that name
the port are rewritten. Each engine's local_run.py plans its pods with plan_container: a TFJob's replicas get
TF_CONFIG with loopback addresses; a JobSet's pods get what JobSet and Kubernetes give them (names, hostnames, labels
for the downward API, JOB_COMPLETION_INDEX), and the TF_CONFIG their template writes with each pod's DNS name
replaced by a loopback address (k8s/engines/jobset/local_run.py).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil
import sys
from collections.abc import Collection, Mapping
from typing import Any

from scripts.common.manifest import IMAGE_ENTRYPOINT, pod_templates, trainer_config
from scripts.common.ports import free_ports
from scripts.common.processes import inherited_environment
from scripts.common.settings import ROOT
from trainer.settings.config import Config

from .envvars import EnvResolver, PodMeta, Problems, expand
from .manifests import Manifests
from .volumes import EMPTY_DIRS, PathMapper, claim_dirs, container_mounts, pod_claims

TRAINER_MODULE = ("-m", "trainer")
INITS = ("tini", "tini-static", "dumb-init")
# Listeners of a pod are reached through Services only; local ones stay on loopback unless the manifest says.
LOOPBACK_DEFAULTS = {"TRAINER_STATUS_HOST": "127.0.0.1"}
DEFAULT_GRACE_S = 30.0  # Kubernetes' default terminationGracePeriodSeconds
_PYTHON = re.compile(r"^python(\d+(\.\d+)?)?$")


@dataclasses.dataclass
class ProcessPlan:
    name: str  # worker-0: the console prefix and log name
    pod_name: str  # multi-worker-worker-0: what the operator would call the pod
    argv: list[str]
    env: dict[str, str]
    cwd: str
    grace_s: float
    ports: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)  # name: (containerPort, local)


def without_init(argv: list[str]) -> list[str]:
    """Drops a leading init such as `/usr/bin/tini --`; what it runs is the container's real command."""
    if argv and pathlib.PurePosixPath(argv[0]).name in INITS:
        rest = argv[1:]
        if "--" in rest:
            return rest[rest.index("--") + 1 :]
        while rest and rest[0].startswith("-"):
            rest = rest[1:]
        return rest
    return argv


def local_ports(container: Mapping[str, Any], own_ports: Collection[str] = ()) -> dict[str, tuple[int, int]]:
    """A free loopback port for each named container port but own_ports (those the engine gives an address of its
    own, as a TFJob's TF_CONFIG does)."""
    declared = [port for port in container.get("ports") or [] if port.get("name") not in own_ports]
    return {
        port.get("name") or str(port["containerPort"]): (int(port["containerPort"]), local)
        for port, local in zip(declared, free_ports(len(declared)), strict=True)
    }


def _rewrite_port(text: str, ports: Mapping[str, tuple[int, int]]) -> str:
    for container_port, local in ports.values():
        if text == str(container_port):
            return str(local)
        if text.endswith(f"={container_port}") and text.startswith("-"):
            return text[: -len(str(container_port))] + str(local)
    return text


def settings_of(plan: ProcessPlan) -> Config:
    """The trainer's settings in this process, read by the trainer's own parser (flags over TRAINER_* over
    defaults); a command that is not `python -m trainer` is read for its variables only."""
    args = plan.argv[3:] if tuple(plan.argv[1:3]) == TRAINER_MODULE else []
    return trainer_config(args, plan.env)


class Planner:
    def __init__(self, manifests: Manifests, job_dir: pathlib.Path, problems: Problems):
        self.manifests = manifests
        self.job_dir = job_dir
        self.problems = problems
        self.resolver = EnvResolver(manifests.config_maps)
        claims = {c for template in pod_templates(manifests.job) for c in pod_claims(template["spec"])}
        self.claims = claim_dirs(claims, job_dir) if claims else {}
        self.chief: ProcessPlan | None = None  # set by the engine's plan: the chief's process

    def _base_env(self, hostname: str) -> dict[str, str]:
        # The local shell's TF_CONFIG and TRAINER_* would change what the manifest says; a pod has neither.
        env = inherited_environment()
        env.update({"HOSTNAME": hostname, "PYTHONUNBUFFERED": "1"})
        return env

    def _argv(self, container: Mapping[str, Any], env: Mapping[str, str], mapper: PathMapper, where: str) -> list[str]:
        """env: the container's own variables, the only ones the kubelet expands $(VAR) with."""
        command = [expand(str(c), env) for c in container.get("command") or []]
        args = [expand(str(a), env) for a in container.get("args") or []]
        argv = without_init((command or list(IMAGE_ENTRYPOINT)) + args)
        if not argv:
            self.problems.errors.append(f"{where}: the container's command runs nothing")
            return argv
        if _PYTHON.match(pathlib.PurePosixPath(argv[0]).name):
            argv[0] = sys.executable
        argv = [mapper.rewrite(a) for a in argv]
        if shutil.which(argv[0]) is None and not pathlib.Path(argv[0]).exists():
            self.problems.errors.append(f"{where}: command {argv[0]!r} is not found on this machine")
        return argv

    def _cwd(self, container: Mapping[str, Any], mapper: PathMapper, where: str) -> str:
        working_dir = container.get("workingDir")
        if working_dir:
            mapped = mapper.rewrite(working_dir)
            if mapped != working_dir:
                return mapped
            self.problems.notes.append(
                f"{where}: workingDir {working_dir} is a path in the image; running in {ROOT} instead"
            )
        return str(ROOT)

    def plan_container(
        self,
        name: str,
        pod_name: str,
        pod_spec: Mapping[str, Any],
        container: Mapping[str, Any],
        where: str,
        pod: PodMeta | None = None,
        hostname: str | None = None,
        own_ports: Collection[str] = (),
    ) -> ProcessPlan:
        """pod: the pod's metadata for the downward API; hostname: the pod's, when not its name (Indexed Jobs);
        own_ports: the container ports the engine gives an address of its own (local_ports)."""
        pod_dir = self.job_dir / EMPTY_DIRS / pod_name
        mapper = PathMapper(container_mounts(container, pod_spec, self.claims, where, self.problems, pod_dir))
        ports = local_ports(container, own_ports)
        resolved = self.resolver.resolve(container, pod_spec, where, self.problems, pod)
        container_env = {k: _rewrite_port(mapper.rewrite(v), ports) for k, v in resolved.items()}
        env = self._base_env(hostname or pod_name)
        env.update({k: v for k, v in LOOPBACK_DEFAULTS.items() if k not in resolved})
        env.update(container_env)
        argv = [_rewrite_port(a, ports) for a in self._argv(container, container_env, mapper, where)]
        return ProcessPlan(
            name=name,
            pod_name=pod_name,
            argv=argv,
            env=env,
            cwd=self._cwd(container, mapper, where),
            grace_s=float(pod_spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)),
            ports=ports,
        )

    def preparation_jobs(self) -> list[ProcessPlan]:
        """The batch Jobs that use the job's volume (the data preparation), one process each."""
        plans = []
        for job in self.manifests.jobs:
            pod_spec = job["spec"]["template"]["spec"]
            if not set(pod_claims(pod_spec)) & set(self.claims):
                continue
            name = job["metadata"]["name"]
            # kustomize prefixes the Job with the job's name; the console shows the short part.
            short = name.removeprefix(f"{self.manifests.name}-")
            container, *rest = pod_spec["containers"]
            for other in rest + pod_spec.get("initContainers", []):
                self.problems.notes.append(f"Job {name}: container {other.get('name')!r} is not run locally")
            plan = self.plan_container(short, f"{name}-local", pod_spec, container, f"Job {name}")
            plans.append(plan)
        return plans
