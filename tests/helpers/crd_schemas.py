"""Custom resources checked offline against their CRDs' schemas at the pinned tags (tests/tools/fixtures/crds).

Strict as `kubectl apply` (field validation Strict): a field the schema does not know is an error, except under
`x-kubernetes-preserve-unknown-fields`. Also checked, as the API server checks them: `x-kubernetes-list-type: map`
keys and `set` items are unique, int32 fields fit. Defaults are applied as the API server applies a structural
schema's defaults. The CRDs' CEL rules (`x-kubernetes-validations`) are listed by `cel_rules`; the ones that apply
to a create are implemented in each engine's admission.py (k8s/engines/), and a test keeps the two lists equal.
"""

from __future__ import annotations

import copy
import json
import pathlib
from functools import cache
from typing import Any

import jsonschema

CRD_DIR = pathlib.Path(__file__).resolve().parents[1] / "tools" / "fixtures" / "crds"
INT32 = (-(2**31), 2**31 - 1)


@cache
def vendored(kind: str, group: str) -> dict[str, Any]:
    """The vendored CRD record (source, group, version, kind, scope, openAPIV3Schema) for kind.group."""
    return json.loads((CRD_DIR / f"{kind.lower()}.{group}.json").read_text())


def record_for(obj: dict[str, Any]) -> dict[str, Any]:
    group, _, version = obj["apiVersion"].rpartition("/")
    record = vendored(obj["kind"], group)
    assert record["version"] == version, (
        f"{obj['kind']} {obj['apiVersion']}: the CRD serves {group}/{record['version']}"
    )
    return record


def _strict(node: Any) -> Any:
    """The schema with unknown fields refused wherever the CRD does not preserve them."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    result = {key: _strict(value) for key, value in node.items()}
    if (
        result.get("type") == "object"
        and "properties" in result
        and "additionalProperties" not in result
        and not result.get("x-kubernetes-preserve-unknown-fields")
    ):
        result["additionalProperties"] = False
    return result


def _unique_map_keys(validator, keys, instance, schema):
    if not validator.is_type(instance, "array") or schema.get("x-kubernetes-list-type") != "map":
        return
    seen = set()
    for item in instance:
        key = tuple(json.dumps(item.get(k), sort_keys=True) for k in keys)
        if key in seen:
            yield jsonschema.ValidationError(f"duplicate entry for list-map keys {keys}: {item!r}")
        seen.add(key)


def _list_type(validator, list_type, instance, schema):
    if list_type == "set" and validator.is_type(instance, "array"):
        items = [json.dumps(item, sort_keys=True) for item in instance]
        if len(set(items)) != len(items):
            yield jsonschema.ValidationError(f"duplicate items in a set list: {instance!r}")


def _format(validator, fmt, instance, schema):
    if fmt == "int32" and validator.is_type(instance, "integer") and not INT32[0] <= instance <= INT32[1]:
        yield jsonschema.ValidationError(f"{instance} does not fit in int32")


StrictValidator = jsonschema.validators.extend(
    jsonschema.Draft202012Validator,
    {"x-kubernetes-list-map-keys": _unique_map_keys, "x-kubernetes-list-type": _list_type, "format": _format},
)


@cache
def _validator(kind: str, group: str) -> Any:
    return StrictValidator(_strict(vendored(kind, group)["openAPIV3Schema"]))


def validate(obj: dict[str, Any]) -> None:
    """Raises jsonschema.ValidationError (with the path) when the API server would refuse obj."""
    record = record_for(obj)
    validator = _validator(record["kind"], record["group"])
    errors = sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))
    if errors:
        error = errors[0]
        raise jsonschema.ValidationError(f"{'.'.join(map(str, error.absolute_path)) or '<root>'}: {error.message}")


def with_defaults(obj: dict[str, Any]) -> dict[str, Any]:
    """obj as the API server stores it: every missing property with a default in the schema gets it."""
    result = copy.deepcopy(obj)
    _default(record_for(obj)["openAPIV3Schema"], result)
    return result


def _default(schema: dict[str, Any], value: Any) -> None:
    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if name not in value and "default" in sub:
                value[name] = copy.deepcopy(sub["default"])
            if name in value:
                _default(sub, value[name])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for name in set(value) - set(schema.get("properties") or {}):
                _default(extra, value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for item in value:
            _default(schema["items"], item)


def cel_rules(kind: str, group: str) -> list[tuple[str, str, str]]:
    """Every CEL rule in the CRD: (path, rule, message)."""
    found: list[tuple[str, str, str]] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for rule in node.get("x-kubernetes-validations") or []:
                found.append((path or ".", rule["rule"], rule.get("message", "")))
            for key, value in node.items():
                if key == "properties":
                    for name, sub in value.items():
                        walk(sub, f"{path}.{name}")
                elif key in ("items", "additionalProperties"):
                    walk(value, f"{path}[]")

    walk(vendored(kind, group)["openAPIV3Schema"], "")
    return found
