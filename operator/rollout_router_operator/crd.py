"""The RolloutRouter CRD, generated from the spec and status models.

Pydantic's JSON Schema is turned into a Kubernetes structural schema: refs
inlined, ``X | None`` as ``nullable``, ``int | str`` as int-or-string, free-form
objects as preserve-unknown-fields, and the defaults (including those from
default factories) written in, so the API server fills them as the router would.
"""
from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema

from .spec import GROUP, KIND, PLURAL, REQUIREMENT_RULE, VERSION, RolloutRouterSpec, RolloutRouterStatus

_DROP = {"title", "additionalProperties", "$defs"}
PRINTER_COLUMNS = [
    {"name": "Margin", "type": "number", "jsonPath": ".spec.affinityBreakMargin",
     "description": "affinityBreakMargin; <none> keeps every pin"},
    {"name": "Backends", "type": "string", "jsonPath": ".status.backends.summary", "description": "ready/total vLLM pods"},
    {"name": "Kept", "type": "integer", "jsonPath": ".status.affinity.kept"},
    {"name": "Broken", "type": "integer", "jsonPath": ".status.affinity.broken"},
    {"name": "Ready", "type": "string", "jsonPath": ".status.routers.summary", "description": "ready/desired router pods"},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    # Session ownership (many router pods), in `kubectl get rr -o wide` only.
    {"name": "Forwarded", "type": "integer", "jsonPath": ".status.fleet.forwarded", "priority": 1,
     "description": "requests forwarded to the session's owner pod"},
    {"name": "Handoffs", "type": "integer", "jsonPath": ".status.fleet.handoffs", "priority": 1,
     "description": "pins handed to a new owner pod"},
    {"name": "Unreachable", "type": "integer", "jsonPath": ".status.fleet.ownerUnreachable", "priority": 1,
     "description": "requests decided locally because their owner pod was unreachable"},
    {"name": "Repin-Prefill", "type": "integer", "jsonPath": ".status.affinity.repinPrefillTokens", "priority": 1,
     "description": "prompt tokens prefilled anew by moved turns"},
    {"name": "TTFB-Moved/Kept", "type": "string", "jsonPath": ".status.affinity.ttfbMovedVsKept", "priority": 1,
     "description": "mean time to first byte of moved turns / of kept turns"},
]


class _WithFactoryDefaults(GenerateJsonSchema):
    """Also write defaults that come from ``default_factory`` (lists, dicts, sub-models)."""

    def default_schema(self, schema: Any) -> dict:
        if "default_factory" in schema and not schema.get("default_factory_takes_data"):
            schema = {**schema, "default": schema["default_factory"]()}
            schema.pop("default_factory")
        return super().default_schema(schema)


def _without_nulls(value: Any) -> Any:
    """A default object minus its null fields: absent already means null, and the API server would store the nulls."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    return value


def _structural(node: Any, defs: dict) -> Any:
    """Rewrite one JSON Schema node (recursively) into its Kubernetes form."""
    if isinstance(node, list):
        return [_structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    out: dict[str, Any] = {}
    options = node.get("anyOf")
    if options is not None:
        types = [option.get("type") for option in options]
        if "null" in types:
            out["nullable"] = True
            options = [option for option, kind in zip(options, types) if kind != "null"]
        if sorted(option.get("type") for option in options) == ["integer", "string"]:
            out["x-kubernetes-int-or-string"] = True
        elif len(options) == 1:
            out.update(_structural(options[0], defs))
        else:
            raise ValueError(f"cannot express anyOf {options} in a structural schema")
    for key, value in node.items():
        if key in _DROP or key == "anyOf":
            continue
        if key == "properties":
            out[key] = {name: _structural(prop, defs) for name, prop in value.items()}
        elif key == "items":
            out[key] = _structural(value, defs)
        elif key == "exclusiveMinimum":
            out.update(minimum=value, exclusiveMinimum=True)
        elif key == "default" and value is None:
            continue  # absent means null; Kubernetes will not default to null
        elif key == "default":
            out[key] = copy.deepcopy(_without_nulls(value))
        else:
            out[key] = copy.deepcopy(value)  # a model used twice must not share lists (YAML would alias them)
    if out.get("type") == "object" and "properties" not in out:
        extra = node.get("additionalProperties")
        if isinstance(extra, dict) and extra:
            out["additionalProperties"] = _structural(extra, defs)
        else:
            out["x-kubernetes-preserve-unknown-fields"] = True
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    return out


def model_schema(model: type[BaseModel]) -> dict:
    raw = model.model_json_schema(by_alias=True, schema_generator=_WithFactoryDefaults)
    return _structural(raw, raw.get("$defs", {}))


def _check_requirements(node: Any) -> None:
    """REQUIREMENT_RULE on every label selector's matchExpressions (spec.selector, the NetworkPolicy peers'):
    LabelSelectorRequirement belongs to the router's settings, which carry no CEL."""
    if isinstance(node, list):
        for item in node:
            _check_requirements(item)
    elif isinstance(node, dict):
        expressions = node.get("properties", {}).get("matchExpressions")
        if isinstance(expressions, dict) and "items" in expressions:
            expressions["items"]["x-kubernetes-validations"] = [dict(REQUIREMENT_RULE)]  # a copy: no YAML alias
        for value in node.values():
            _check_requirements(value)


def crd_manifest() -> dict:
    spec = model_schema(RolloutRouterSpec)
    _check_requirements(spec)
    status = model_schema(RolloutRouterStatus)
    status["properties"]["conditions"]["x-kubernetes-list-type"] = "map"
    status["properties"]["conditions"]["x-kubernetes-list-map-keys"] = ["type"]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {"kind": KIND, "listKind": f"{KIND}List", "plural": PLURAL,
                      "singular": KIND.lower(), "shortNames": ["rr"]},
            "versions": [{
                "name": VERSION, "served": True, "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "description": "A session-affinity router in front of the vLLM pods a selector matches.",
                    "required": ["spec"],
                    "properties": {
                        "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                        "metadata": {"type": "object"},
                        "spec": spec, "status": status,
                    },
                }},
            }],
        },
    }


def crd_yaml() -> str:
    return "# Generated by `rollout-router crd` from operator/rollout_router_operator/spec.py; do not edit.\n" + \
        yaml.safe_dump(crd_manifest(), sort_keys=False)
