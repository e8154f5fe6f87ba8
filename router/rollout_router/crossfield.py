"""Rules that span settings fields, each written once and read two ways: checked on the router's own settings
(``settings.py``: a config file, the CLI, the verl plugin) and rendered as CEL into the CRD (the operator's
``spec.py``), which the API server and the operator evaluate. So a router outside Kubernetes and ``kubectl
apply`` refuse the same configurations with the same message.

A rule here is "one of these holds", over fields named as the wire names them (camelCase); besides the rules that
span fields, a selector's own two (it selects something; a requirement's values fit its operator).
"""
from __future__ import annotations

from dataclasses import dataclass

from pydantic.alias_generators import to_snake


@dataclass(frozen=True)
class Is:
    """``field`` equals ``value`` (``negate``: differs from it)."""

    field: str
    value: str | bool
    negate: bool = False

    def cel(self) -> str:
        if self.value is True and not self.negate:
            return f"self.{self.field}"
        return f"self.{self.field} {'!=' if self.negate else '=='} {_literal(self.value)}"

    def holds(self, settings: object) -> bool:
        return (getattr(settings, to_snake(self.field)) == self.value) != self.negate


@dataclass(frozen=True)
class Has:
    """``field`` is set (not null: to CEL, a null field is absent)."""

    field: str

    def cel(self) -> str:
        return f"has(self.{self.field})"

    def holds(self, settings: object) -> bool:
        return getattr(settings, to_snake(self.field)) is not None


@dataclass(frozen=True)
class Filled:
    """``field`` (a map or a list) is set and not empty."""

    field: str

    def cel(self) -> str:
        return f"(has(self.{self.field}) && size(self.{self.field}) > 0)"

    def holds(self, settings: object) -> bool:
        return bool(getattr(settings, to_snake(self.field)))


@dataclass(frozen=True)
class OneOf:
    """``field`` is one of ``values``."""

    field: str
    values: tuple[str, ...]

    def cel(self) -> str:
        return f"self.{self.field} in [{', '.join(_literal(value) for value in self.values)}]"

    def holds(self, settings: object) -> bool:
        return getattr(settings, to_snake(self.field)) in self.values


@dataclass(frozen=True)
class Iff:
    """``left`` holds exactly when ``right`` does."""

    left: OneOf
    right: Filled

    def cel(self) -> str:
        return f"({self.left.cel()}) == {self.right.cel()}"

    def holds(self, settings: object) -> bool:
        return self.left.holds(settings) == self.right.holds(settings)


@dataclass(frozen=True)
class AnyOf:
    """A rule: one of ``conditions`` holds, else ``field`` (None: the object the rule sits on) is refused with
    ``message``."""

    conditions: tuple[Is | Has | Filled | Iff, ...]
    field: str | None
    message: str

    def cel(self) -> dict:
        """The CRD's ``x-kubernetes-validations`` entry."""
        entry = {"rule": " || ".join(c.cel() for c in self.conditions), "message": self.message}
        return entry if self.field is None else entry | {"fieldPath": f".{self.field}"}

    def check(self, settings: object) -> None:
        """Raises ValueError naming the field when no condition holds (pydantic reports it)."""
        if not any(c.holds(settings) for c in self.conditions):
            raise ValueError(self.message if self.field is None else f"{self.field}: {self.message}")


def _literal(value: str | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else "'" + value.replace("'", "\\'") + "'"


# cost_affinity only adds to the margin: with a null margin it would keep every pin, exactly sticky, which nobody
# choosing it means (docs/simulator.md, "A rule for every point").
COST_AFFINITY_HAS_A_MARGIN = AnyOf(
    (Is("policy", "cost_affinity", negate=True), Is("fullDeterminism", True), Has("affinityBreakMargin")),
    "affinityBreakMargin", "policy cost_affinity needs a number (e.g. 2); null would keep every pin")

# An empty selector takes every pod of the namespace for a replica (the router's discovery, the CRD's spec.selector).
SELECTOR_SELECTS = AnyOf((Filled("matchLabels"), Filled("matchExpressions")), None,
                         "selector must have matchLabels or matchExpressions (an empty selector matches every pod)")

# A selector's requirement the API server would refuse fails every pod list (every selector in the CRD has it).
REQUIREMENT_VALUES = AnyOf((Iff(OneOf("operator", ("In", "NotIn")), Filled("values")),), None,
                           "In and NotIn need values; Exists and DoesNotExist take none")
