"""Pydantic models as Kubernetes structural schemas (the CRD's spec and status are such schemas).

Pydantic's JSON Schema is turned into a Kubernetes structural schema: refs
inlined, ``X | None`` as ``nullable``, ``int | str`` as int-or-string, free-form
objects as preserve-unknown-fields, and the defaults (including those from
default factories) written in, so the API server fills them as the router would.
It imports no model of this package, so ``spec.py`` builds its own schema with it.
"""
from __future__ import annotations

import copy
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema

_DROP = {"title", "additionalProperties", "$defs"}


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
    """``model``'s structural schema, with the CEL rules its models declare (``x-kubernetes-validations``)."""
    raw = model.model_json_schema(by_alias=True, schema_generator=_WithFactoryDefaults)
    return _structural(raw, raw.get("$defs", {}))


def with_item_rule(schema: dict, field: str, rule: dict) -> dict:
    """``schema`` with ``rule`` on the items of every list property named ``field``, at any depth: for a rule of a
    model that belongs to the router's settings, which carry no CEL (e.g. every selector's matchExpressions)."""
    def visit(node: Any) -> None:
        if isinstance(node, list):
            for item in node:
                visit(item)
        elif isinstance(node, dict):
            target = node.get("properties", {}).get(field)
            if isinstance(target, dict) and "items" in target:
                target["items"]["x-kubernetes-validations"] = [dict(rule)]  # a copy each: no YAML alias
            for value in node.values():
                visit(value)
    visit(schema)
    return schema
