"""The CRD's CEL rules (``x-kubernetes-validations``), evaluated by the operator as the API server evaluates them.

Each rule that spans fields is written once, as CEL in the schema: the API server refuses a resource that breaks
one at ``kubectl apply``, and the operator runs the same rule text on the spec it reconciles, so an API server that
runs no CEL (an old one, an emulator) and ``rollout-router render`` refuse the same resources with the same
message. As the API server does, the object is defaulted from the schema first, and a null field is absent.

The CEL library (cel-python, of the [operator] extra) is imported at the first evaluation, so that
``rollout-router crd`` runs on the core install.
"""
from __future__ import annotations

import copy
from collections.abc import Iterator
from functools import cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from celpy import Runner

RULES = "x-kubernetes-validations"


def violations(schema: dict, value: Any, path: str = "spec") -> list[str]:
    """Each rule ``value`` breaks, as the API server names it: ``spec.router.tolerations[0]: <message>``."""
    return list(_broken(schema, defaulted(schema, value), path))


def defaulted(schema: dict, value: Any) -> Any:
    """``value`` as the API server stores it: missing fields take the schema's defaults (at any depth), and a null
    field is dropped (its default taken unless the field is nullable)."""
    if isinstance(value, dict) and "properties" in schema:
        out = {}
        for name, field in schema["properties"].items():
            if value.get(name) is not None:
                out[name] = defaulted(field, value[name])
            elif "default" in field and not (name in value and field.get("nullable")):
                out[name] = defaulted(field, copy.deepcopy(field["default"]))
        return out | {name: item for name, item in value.items() if name not in schema["properties"]}
    if isinstance(value, list) and "items" in schema:
        return [defaulted(schema["items"], item) for item in value]
    extra = schema.get("additionalProperties")
    if isinstance(value, dict) and isinstance(extra, dict):
        return {key: defaulted(extra, item) for key, item in value.items()}
    return value


def rules_of(schema: dict, path: str = "spec") -> Iterator[tuple[str, dict]]:
    """Every rule in ``schema`` with where it sits (``spec.router.tolerations[]``): what the tests must cover."""
    for rule in schema.get(RULES, ()):
        yield path, rule
    for name, field in schema.get("properties", {}).items():
        yield from rules_of(field, f"{path}.{name}")
    if "items" in schema:
        yield from rules_of(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from rules_of(schema["additionalProperties"], f"{path}[*]")


def _broken(schema: dict, value: Any, path: str) -> Iterator[str]:
    """The broken rules of ``value`` (already defaulted) and of its fields and items, outermost first."""
    for rule in schema.get(RULES, ()):
        if not _holds(rule["rule"], value):
            yield f"{path}{rule.get('fieldPath', '')}: {rule['message']}"
    if isinstance(value, dict):
        for name, field in schema.get("properties", {}).items():
            if name in value:
                yield from _broken(field, value[name], f"{path}.{name}")
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                yield from _broken(extra, item, f"{path}[{key}]")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            yield from _broken(schema["items"], item, f"{path}[{index}]")


def _holds(rule: str, value: Any) -> bool:
    """Whether ``rule`` is true with ``self`` = ``value``; an error or a result other than true breaks it, as it
    does on the API server."""
    import celpy

    try:
        result = _program(rule).evaluate({"self": celpy.json_to_cel(value)})
    except celpy.CELEvalError:
        return False
    return isinstance(result, celpy.celtypes.BoolType) and bool(result)


@cache
def _program(rule: str) -> Runner:
    """A rule compiled once: the operator evaluates the same few rules at every reconcile."""
    import celpy

    environment = celpy.Environment()
    return environment.program(environment.compile(rule))
