"""Policies by name: a new policy is a new file plus one line here."""
from __future__ import annotations

import inspect
from typing import Any

from .affinity import AffinityPolicy
from .base import Policy
from .least_loaded import LeastLoadedPolicy
from .round_robin import RoundRobinPolicy

POLICIES: dict[str, type] = {
    AffinityPolicy.name: AffinityPolicy,
    LeastLoadedPolicy.name: LeastLoadedPolicy,
    RoundRobinPolicy.name: RoundRobinPolicy,
}


def create(name: str, **options: Any) -> Policy:
    """Build policy ``name``, passing only the options its constructor takes."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    accepted = inspect.signature(cls).parameters
    return cls(**{k: v for k, v in options.items() if k in accepted})
