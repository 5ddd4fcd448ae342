"""A container's environment, resolved the way the kubelet resolves it, for what run-local supports.

Supported: envFrom configMapRef (with prefix), env value with $(VAR) expansion, valueFrom configMapKeyRef,
valueFrom resourceFieldRef (limits/requests of cpu and memory, with divisor) and valueFrom fieldRef (the downward
API: metadata.name, metadata.namespace, metadata.uid, metadata.labels['k'], metadata.annotations['k'], status.podIP and
status.hostIP, which are 127.0.0.1 here). Anything else is "not supported locally" and stops the run: a pod that
depends on it would behave differently here.
"""

from __future__ import annotations

import dataclasses
import decimal
import math
import os
import re
import uuid
from collections.abc import Mapping
from typing import Any

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)([a-zA-Z]*)$")
_SUFFIXES = {
    "": 1,
    "m": decimal.Decimal("0.001"),
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
}
RESOURCE_FIELDS = ("limits.cpu", "requests.cpu", "limits.memory", "requests.memory")
_METADATA_MAP_FIELD = re.compile(r"^metadata\.(labels|annotations)\['([^']+)'\]$")
LOOPBACK_IP_FIELDS = ("status.podIP", "status.hostIP")


@dataclasses.dataclass(frozen=True)
class PodMeta:
    """What the downward API reads of a pod: its name, namespace, labels and annotations as the cluster sets them.
    unstable: labels and annotations whose value changes from one pod of the same replica to the next (JobSet's
    restart-attempt), which run-local does not follow."""

    name: str
    namespace: str
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    annotations: Mapping[str, str] = dataclasses.field(default_factory=dict)
    unstable: frozenset[str] = frozenset()
    uid: str = dataclasses.field(default_factory=lambda: str(uuid.uuid4()))  # a new pod's, as the API server gives


@dataclasses.dataclass
class Problems:
    """What could not be resolved: errors stop the run (the pod would not start, or not as here), notes are printed."""

    errors: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def add(self, message: str, optional: bool) -> None:
        """A missing reference: only a note where the manifest marks it optional, else an error."""
        (self.notes if optional else self.errors).append(message)

    def unsupported(self, field: str, where: str) -> None:
        self.errors.append(f"not supported locally: {field} (in {where})")


def expand(text: str, variables: Mapping[str, str]) -> str:
    """Kubernetes $(VAR) expansion: $$ is a literal $, unknown $(VAR) stays as written."""
    out: list[str] = []
    i = 0
    while i < len(text):
        if text[i] == "$" and i + 1 < len(text):
            nxt = text[i + 1]
            if nxt == "$":
                out.append("$")
                i += 2
                continue
            if nxt == "(":
                end = text.find(")", i + 2)
                if end != -1:
                    name = text[i + 2 : end]
                    out.append(variables[name] if name in variables else text[i : end + 1])
                    i = end + 1
                    continue
        out.append(text[i])
        i += 1
    return "".join(out)


def quantity(text: str) -> decimal.Decimal:
    """A Kubernetes resource quantity ("2", "500m", "4Gi", "1e3") as a number."""
    match = _QUANTITY.match(str(text).strip())
    if not match or match.group(2) not in _SUFFIXES:
        raise ValueError(f"{text!r} is not a resource quantity")
    return decimal.Decimal(match.group(1)) * decimal.Decimal(_SUFFIXES[match.group(2)])


def node_allocatable(resource: str) -> decimal.Decimal:
    """What the kubelet reports for an unset limit: the node's, here this machine's."""
    if resource == "cpu":
        return decimal.Decimal(os.cpu_count() or 1)
    return decimal.Decimal(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def resource_field(ref: Mapping[str, Any], resources: Mapping[str, Any]) -> str:
    """The downward API's value: the quantity divided by the divisor, rounded up (an unset limit is the node's,
    an unset request the limit's, else 0)."""
    kind, _, resource = ref["resource"].partition(".")
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    if kind == "limits":
        value = quantity(limits[resource]) if resource in limits else node_allocatable(resource)
    else:
        value = quantity(requests.get(resource) or limits.get(resource) or "0")
    divisor = quantity(ref.get("divisor", "1"))
    return str(math.ceil(value / divisor))


class EnvResolver:
    """Resolves env/envFrom of containers against the ConfigMaps of the rendered output."""

    def __init__(self, config_maps: Mapping[str, Mapping[str, Any]]):
        self.config_maps = {
            name: {k: str(v) for k, v in (obj.get("data") or {}).items()} for name, obj in config_maps.items()
        }

    def _lookup(
        self, name: str, key: str | None, optional: bool, where: str, problems: Problems
    ) -> dict[str, str] | str | None:
        if name not in self.config_maps:
            similar = sorted(other for other in self.config_maps if other.startswith(name + "-"))
            hint = (
                f" The rendered output has {', '.join(similar)}: kustomize appended a hash to the name "
                f"but did not rewrite this reference (TFJob is a custom resource; give kustomize a "
                f"nameReference configuration for it, or set disableNameSuffixHash)."
                if similar
                else " Add the ConfigMap to the kustomization, or mark the reference optional."
            )
            consequence = (
                " (optional: left unset)"
                if optional
                else " On a cluster the pod would not start (CreateContainerConfigError)."
            )
            problems.add(
                f"{where}: no ConfigMap named {name!r} in the rendered manifests.{consequence}{hint}", optional
            )
            return None
        data = self.config_maps[name]
        if key is None:
            return data
        if key not in data:
            message = f"{where}: ConfigMap {name!r} has no key {key!r} (it has: {', '.join(sorted(data)) or 'none'})."
            problems.add(
                message
                + (
                    " (optional: left unset)"
                    if optional
                    else " On a cluster the pod would not start (CreateContainerConfigError)."
                ),
                optional,
            )
            return None
        return data[key]

    def resolve(
        self,
        container: Mapping[str, Any],
        pod_spec: Mapping[str, Any],
        where: str,
        problems: Problems,
        pod: PodMeta | None = None,
    ) -> dict[str, str]:
        """The container's variables in the order Kubernetes defines them: envFrom, then env (later wins)."""
        env: dict[str, str] = {}
        for index, source in enumerate(container.get("envFrom") or []):
            if "configMapRef" not in source:
                kinds = ".".join(k for k in source if k != "prefix")
                problems.unsupported(f"envFrom[{index}].{kinds}", where)
                continue
            prefix, ref = source.get("prefix", ""), source["configMapRef"]
            data = self._lookup(
                ref.get("name", ""),
                None,
                bool(ref.get("optional")),
                f"{where} envFrom configMapRef {ref.get('name')!r}",
                problems,
            )
            for key, value in (data or {}).items():
                if _ENV_NAME.match(prefix + key):
                    env[prefix + key] = value
                else:
                    problems.notes.append(
                        f"{where}: envFrom ConfigMap key {key!r} is not a valid variable name; "
                        f"skipped, as the kubelet skips it"
                    )
        for item in container.get("env") or []:
            name = item["name"]
            if "valueFrom" not in item:
                env[name] = expand(str(item.get("value", "")), env)
                continue
            value = self._value_from(
                item["valueFrom"], container, pod_spec, f"env[{name}].valueFrom", where, problems, pod
            )
            if value is not None:
                env[name] = value
        return env

    def _value_from(
        self,
        ref: Mapping[str, Any],
        container: Mapping[str, Any],
        pod_spec: Mapping[str, Any],
        field: str,
        where: str,
        problems: Problems,
        pod: PodMeta | None = None,
    ) -> str | None:
        if "configMapKeyRef" in ref:
            key_ref = ref["configMapKeyRef"]
            value = self._lookup(
                key_ref.get("name", ""),
                key_ref.get("key", ""),
                bool(key_ref.get("optional")),
                f"{where} {field}: configMapKeyRef {key_ref.get('name')!r}",
                problems,
            )
            return value if isinstance(value, str) else None
        if "resourceFieldRef" in ref:
            field_ref = ref["resourceFieldRef"]
            if field_ref.get("resource") not in RESOURCE_FIELDS:
                problems.unsupported(f"{field}.resourceFieldRef.resource={field_ref.get('resource')}", where)
                return None
            owner = field_ref.get("containerName") or container.get("name")
            target = next((c for c in pod_spec.get("containers") or [] if c.get("name") == owner), container)
            try:
                return resource_field(field_ref, target.get("resources") or {})
            except ValueError as error:
                problems.errors.append(f"{where} {field}.resourceFieldRef: {error}")
                return None
        if "fieldRef" in ref and pod is not None:
            return downward_field(str(ref["fieldRef"].get("fieldPath", "")), pod, f"{field}.fieldRef", where, problems)
        problems.unsupported(f"{field}." + (".".join(sorted(ref)) or "(empty)"), where)
        return None


def downward_field(path: str, pod: PodMeta, field: str, where: str, problems: Problems) -> str | None:
    """The downward API's value of a pod field; an absent label or annotation reads as empty, as on a cluster."""
    if path == "metadata.name":
        return pod.name
    if path == "metadata.namespace":
        return pod.namespace
    if path == "metadata.uid":
        return pod.uid
    if path in LOOPBACK_IP_FIELDS:
        return "127.0.0.1"
    match = _METADATA_MAP_FIELD.match(path)
    if match is None:
        problems.unsupported(f"{field}.fieldPath={path}", where)
        return None
    kind, key = match.groups()
    if key in pod.unstable:
        problems.unsupported(f"{field}.fieldPath={path} (it changes with every restart)", where)
        return None
    return (pod.labels if kind == "labels" else pod.annotations).get(key, "")
