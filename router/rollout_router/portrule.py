"""The port rule, written once and read two ways: checked on the router's own settings (``settings.Port``: a
config file, the CLI, the verl plugin) and rendered as CEL into the CRD (the operator's ``spec.py``), where an
int-or-string field takes no bounds or pattern of its own. So a router outside Kubernetes and ``kubectl apply``
refuse the same ports with the same message, as ``crossfield``'s rules are read.

A port is a number in range, a string of digits spelling one, or the name a container port can have (else a pod's
port could never resolve, and a number out of range would make a URL the data path cannot connect to).
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class PortRule:
    """A port: a number from ``low`` to ``high``, or a string of at most ``longest`` characters that spells one or
    is a name (``name``, anchored at both ends; ``letter`` found in it; never ``never``)."""

    low: int
    high: int
    longest: int
    name: str
    letter: str
    never: str

    @property
    def message(self) -> str:
        return (f"a port is a number from {self.low} to {self.high} or a container port's name (1-{self.longest} "
                "of a-z, 0-9 and '-', a letter among them, a letter or digit at each end)")

    def check(self, value: object) -> object:
        """``value`` as a port (a string of digits as the number it spells); ValueError naming it otherwise."""
        if isinstance(value, str) and len(value) <= self.longest and re.fullmatch("[0-9]+", value):
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(self.message)  # a list or a float: pydantic's own message would name every branch
        if isinstance(value, int) and not self.low <= value <= self.high:
            raise ValueError(f"{value}: {self.message}")
        if isinstance(value, str) and not (len(value) <= self.longest and re.fullmatch(self.name, value)
                                           and re.search(self.letter, value) and self.never not in value):
            raise ValueError(f"{value!r}: {self.message}")
        return value

    def cel(self, field: str) -> dict:
        """The CRD's ``x-kubernetes-validations`` entry for ``field`` (a null port is absent to CEL; the size is
        checked before the patterns, which bounds what CEL estimates they cost)."""
        v = f"self.{field}"

        def in_range(number: str) -> str:
            return f"{number} >= {self.low} && {number} <= {self.high}"

        rule = (f"!has({v}) || (type({v}) == int ? {in_range(v)} : {v}.size() <= {self.longest} && "
                f"({v}.matches('^[0-9]+$') ? {in_range(f'int({v})')} : "
                f"{v}.matches('^{self.name}$') && {v}.matches('{self.letter}') && !{v}.contains('{self.never}')))")
        return {"rule": rule, "message": self.message, "fieldPath": f".{field}"}


# A container port's name, as Kubernetes checks it (an IANA service name).
PORT = PortRule(low=1, high=65535, longest=15, name="[a-z0-9]([-a-z0-9]*[a-z0-9])?", letter="[a-z]", never="--")
