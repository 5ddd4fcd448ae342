"""The Pod Security Standards' "baseline" and "restricted" rules as Kubernetes documents them
(kubernetes.io/docs/concepts/security/pod-security-standards, the policy of v1.34), checked on one pod spec, plus
this project's own rules on top (a read-only root, no service-account token, requests and limits). Each rule names
the field it reads; a problem is one line naming the container and the field.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

# Restricted: every other volume type (hostPath, nfs, gcePersistentDisk, ...) is refused.
ALLOWED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
# Baseline's list of capabilities a container may add; restricted allows NET_BIND_SERVICE alone.
BASELINE_CAPABILITIES = {
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
}
RESTRICTED_CAPABILITIES = {"NET_BIND_SERVICE"}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}
SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"}
SECCOMP_TYPES = {"RuntimeDefault", "Localhost"}
RESOURCES = ("cpu", "memory", "ephemeral-storage")


def containers(pod: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for field in ("initContainers", "containers", "ephemeralContainers"):
        for container in pod.get(field) or []:
            yield f"{field}[{container.get('name')}]", container


def baseline_problems(pod: Mapping[str, Any]) -> list[str]:
    problems = []
    pod_security = pod.get("securityContext") or {}
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            problems.append(f"spec.{field} is true")
    for volume in pod.get("volumes") or []:
        if "hostPath" in volume:
            problems.append(f"volumes[{volume['name']}] is a hostPath")
    for name, options in [("spec", pod_security), *((n, c.get("securityContext") or {}) for n, c in containers(pod))]:
        if (options.get("windowsOptions") or {}).get("hostProcess"):
            problems.append(f"{name}: windowsOptions.hostProcess is true")
        se_linux = options.get("seLinuxOptions") or {}
        if se_linux.get("type", "") not in SELINUX_TYPES or se_linux.get("user") or se_linux.get("role"):
            problems.append(f"{name}: seLinuxOptions {se_linux} is not allowed")
        if (options.get("seccompProfile") or {}).get("type") == "Unconfined":
            problems.append(f"{name}: seccompProfile is Unconfined")
        if (options.get("appArmorProfile") or {}).get("type") == "Unconfined":
            problems.append(f"{name}: appArmorProfile is Unconfined")
    for sysctl in pod_security.get("sysctls") or []:
        if sysctl.get("name") not in SAFE_SYSCTLS:
            problems.append(f"spec.securityContext.sysctls {sysctl.get('name')} is not a safe sysctl")
    for name, container in containers(pod):
        options = container.get("securityContext") or {}
        if options.get("privileged"):
            problems.append(f"{name}: privileged is true")
        added = set((options.get("capabilities") or {}).get("add") or [])
        if added - BASELINE_CAPABILITIES:
            problems.append(f"{name}: capabilities.add {sorted(added - BASELINE_CAPABILITIES)} beyond baseline")
        if options.get("procMount", "Default") != "Default":
            problems.append(f"{name}: procMount is {options['procMount']}")
        for port in container.get("ports") or []:
            if port.get("hostPort"):
                problems.append(f"{name}: port {port.get('name')} has hostPort {port['hostPort']}")
    return problems


def restricted_problems(pod: Mapping[str, Any]) -> list[str]:
    """Baseline's problems plus restricted's."""
    problems = baseline_problems(pod)
    pod_security = pod.get("securityContext") or {}
    for volume in pod.get("volumes") or []:
        kinds = set(volume) - {"name"}
        if not kinds <= ALLOWED_VOLUMES:
            problems.append(f"volumes[{volume['name']}]: {sorted(kinds - ALLOWED_VOLUMES)} not an allowed type")
    if pod_security.get("runAsUser") == 0:
        problems.append("spec.securityContext.runAsUser is 0")
    for name, container in containers(pod):
        options = container.get("securityContext") or {}
        if options.get("allowPrivilegeEscalation") is not False:
            problems.append(f"{name}: allowPrivilegeEscalation is not false")
        non_root = options.get("runAsNonRoot", pod_security.get("runAsNonRoot"))
        if non_root is not True:
            problems.append(f"{name}: runAsNonRoot is not true (on the pod or the container)")
        if options.get("runAsUser") == 0:
            problems.append(f"{name}: runAsUser is 0")
        seccomp = (options.get("seccompProfile") or pod_security.get("seccompProfile") or {}).get("type")
        if seccomp not in SECCOMP_TYPES:
            problems.append(f"{name}: seccompProfile is {seccomp or 'unset'}, not RuntimeDefault or Localhost")
        capabilities = options.get("capabilities") or {}
        if "ALL" not in (capabilities.get("drop") or []):
            problems.append(f"{name}: capabilities.drop lacks ALL")
        added = set(capabilities.get("add") or [])
        if added - RESTRICTED_CAPABILITIES:
            problems.append(f"{name}: capabilities.add {sorted(added - RESTRICTED_CAPABILITIES)} beyond restricted")
    return problems


def project_problems(pod: Mapping[str, Any]) -> list[str]:
    """This project's rules on top of restricted: nothing writes the image, no pod holds an API token, and every
    container states what it needs and may use."""
    problems = []
    if pod.get("automountServiceAccountToken") is not False:
        problems.append("spec.automountServiceAccountToken is not false")
    for name, container in containers(pod):
        if (container.get("securityContext") or {}).get("readOnlyRootFilesystem") is not True:
            problems.append(f"{name}: readOnlyRootFilesystem is not true")
        resources = container.get("resources") or {}
        for kind in ("requests", "limits"):
            missing = [r for r in RESOURCES if r not in (resources.get(kind) or {})]
            if missing:
                problems.append(f"{name}: resources.{kind} lacks {', '.join(missing)}")
    volumes = {v["name"]: v for v in pod.get("volumes") or []}
    for volume in volumes.values():
        if "emptyDir" in volume and not (volume["emptyDir"] or {}).get("sizeLimit"):
            problems.append(f"volumes[{volume['name']}]: emptyDir without sizeLimit")
    return problems


def all_problems(pod: Mapping[str, Any]) -> list[str]:
    return restricted_problems(pod) + project_problems(pod)


def pod_templates(value: Any) -> Iterator[Mapping[str, Any]]:
    """Every pod template in a rendered object, at any depth: a Deployment's or a Job's, each replica's of a TFJob
    or JobSet, a TrainingRuntime's."""
    if isinstance(value, Mapping):
        template = value.get("template")
        if isinstance(template, Mapping) and "containers" in template.get("spec", {}):
            yield template
        for item in value.values():
            yield from pod_templates(item)
    elif isinstance(value, list):
        for item in value:
            yield from pod_templates(item)
