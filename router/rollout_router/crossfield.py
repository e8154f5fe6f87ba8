"""Rules that span settings fields, each written once and read two ways: checked on the router's own settings
(``settings.py``: a config file, the CLI, the verl plugin) and rendered as CEL into the CRD (the operator's
``spec.py``), which the API server and the operator evaluate. So a router outside Kubernetes and ``kubectl
apply`` refuse the same configurations with the same message.

A rule here is "one of these holds", over fields named as the wire names them (camelCase).
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
class AnyOf:
    """A rule: one of ``conditions`` holds, else ``field`` is refused with ``message``."""

    conditions: tuple[Is | Has, ...]
    field: str
    message: str

    def cel(self) -> dict:
        """The CRD's ``x-kubernetes-validations`` entry."""
        return {"rule": " || ".join(c.cel() for c in self.conditions), "message": self.message,
                "fieldPath": f".{self.field}"}

    def check(self, settings: object) -> None:
        """Raises ValueError naming the field when no condition holds (pydantic reports it)."""
        if not any(c.holds(settings) for c in self.conditions):
            raise ValueError(f"{self.field}: {self.message}")


def _literal(value: str | bool) -> str:
    return ("true" if value else "false") if isinstance(value, bool) else "'" + value.replace("'", "\\'") + "'"


# cost_affinity only adds to the margin: with a null margin it would keep every pin, exactly sticky, which nobody
# choosing it means (docs/simulator.md, "A rule for every point").
COST_AFFINITY_HAS_A_MARGIN = AnyOf(
    (Is("policy", "cost_affinity", negate=True), Is("fullDeterminism", True), Has("affinityBreakMargin")),
    "affinityBreakMargin", "policy cost_affinity needs a number (e.g. 2); null would keep every pin")
