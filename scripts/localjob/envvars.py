"""A container's environment, resolved the way the kubelet resolves it, against the rendered manifests.

envFrom first (in order, with prefixes), then env (later entries win); env values and command/args
get $(VAR) expansion. References that cannot be resolved are collected, never dropped silently.
"""

from __future__ import annotations

import base64
import dataclasses
import re
import socket
from typing import Any, Mapping

_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_FIELD_LABEL = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


@dataclasses.dataclass
class Problems:
    """What could not be resolved: errors stop the run (the pod would not start), notes are printed."""

    errors: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def add(self, message: str, optional: bool) -> None:
        """A missing reference: only a note where the manifest marks it optional, else an error."""
        (self.notes if optional else self.errors).append(message)


@dataclasses.dataclass(frozen=True)
class PodIdentity:
    """What the downward API can tell a local replica about its pod."""

    name: str
    namespace: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    service_account: str = "default"


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


def object_data(kind: str, obj: Mapping[str, Any]) -> dict[str, str]:
    data = {key: str(value) for key, value in (obj.get("data") or {}).items()}
    if kind == "Secret":
        data = {key: base64.b64decode(value).decode() for key, value in data.items()}
        data.update({key: str(value) for key, value in (obj.get("stringData") or {}).items()})
    return data


class EnvResolver:
    """Resolves env/envFrom of containers against the ConfigMaps and Secrets of the rendered output."""

    def __init__(self, config_maps: Mapping[str, Mapping[str, Any]], secrets: Mapping[str, Mapping[str, Any]]):
        # kind -> name -> the object's data, decoded; volumes of those kinds read it too.
        self.objects = {
            "ConfigMap": {name: object_data("ConfigMap", obj) for name, obj in config_maps.items()},
            "Secret": {name: object_data("Secret", obj) for name, obj in secrets.items()},
        }

    def _lookup(self, kind: str, name: str, key: str | None, optional: bool, where: str,
                problems: Problems) -> dict[str, str] | str | None:
        objects = self.objects[kind]
        if name not in objects:
            similar = sorted(other for other in objects if other.startswith(name + "-"))
            hint = (f" The rendered output has {', '.join(similar)}: kustomize appended a hash to the name "
                    f"but did not rewrite this reference (TFJob is a custom resource; give kustomize a "
                    f"nameReference configuration for it, or set disableNameSuffixHash)."
                    if similar else f" Add the {kind} to the kustomization, or mark the reference optional.")
            message = f"{where}: no {kind} named {name!r} in the rendered manifests.{hint}"
            problems.add(message + (" (optional: left unset, as on a cluster)" if optional else
                                    " On a cluster the pod would not start (CreateContainerConfigError)."), optional)
            return None
        if key is None:
            return objects[name]
        if key not in objects[name]:
            message = f"{where}: {kind} {name!r} has no key {key!r} (it has: {', '.join(sorted(objects[name])) or 'none'})."
            problems.add(message + (" (optional: left unset)" if optional else
                                    " On a cluster the pod would not start (CreateContainerConfigError)."), optional)
            return None
        return objects[name][key]

    def _field(self, path: str, pod: PodIdentity) -> str | None:
        simple = {
            "metadata.name": pod.name,
            "metadata.namespace": pod.namespace,
            "spec.serviceAccountName": pod.service_account,
            "spec.nodeName": socket.gethostname(),
            "status.podIP": "127.0.0.1",
            "status.podIPs": "127.0.0.1",
            "status.hostIP": "127.0.0.1",
            "status.hostIPs": "127.0.0.1",
        }
        if path in simple:
            return simple[path]
        match = _FIELD_LABEL.match(path)
        if match:
            source = pod.labels if match.group(1) == "labels" else pod.annotations
            return source.get(match.group(2), "")
        return None

    def resolve(self, container: Mapping[str, Any], pod: PodIdentity, where: str,
                problems: Problems) -> dict[str, str]:
        """The container's variables in the order Kubernetes defines them."""
        env: dict[str, str] = {}
        for source in container.get("envFrom") or []:
            prefix = source.get("prefix", "")
            for kind, field in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
                if field not in source:
                    continue
                ref = source[field]
                data = self._lookup(kind, ref.get("name", ""), None, bool(ref.get("optional")),
                                    f"{where} envFrom {field} {ref.get('name')!r}", problems)
                for key, value in (data or {}).items():
                    if _ENV_NAME.match(prefix + key):
                        env[prefix + key] = value
                    else:
                        problems.notes.append(f"{where}: envFrom {kind} key {key!r} is not a valid variable name; "
                                              f"skipped, as the kubelet skips it")
        for item in container.get("env") or []:
            name = item["name"]
            if "valueFrom" not in item:
                env[name] = expand(str(item.get("value", "")), env)
                continue
            value = self._value_from(item["valueFrom"], pod, f"{where} env {name}", problems)
            if value is not None:
                env[name] = value
        return env

    def _value_from(self, ref: Mapping[str, Any], pod: PodIdentity, where: str, problems: Problems) -> str | None:
        for kind, field in (("ConfigMap", "configMapKeyRef"), ("Secret", "secretKeyRef")):
            if field in ref:
                key_ref = ref[field]
                value = self._lookup(kind, key_ref.get("name", ""), key_ref.get("key", ""),
                                     bool(key_ref.get("optional")), f"{where}: {field} {key_ref.get('name')!r}", problems)
                return value if isinstance(value, str) else None
        if "fieldRef" in ref:
            path = ref["fieldRef"].get("fieldPath", "")
            value = self._field(path, pod)
            if value is None:
                problems.notes.append(f"{where}: fieldRef {path!r} has no local equivalent; left unset")
            return value
        kinds = ", ".join(sorted(ref)) or "nothing"
        problems.notes.append(f"{where}: valueFrom {kinds} has no local equivalent; left unset")
        return None
