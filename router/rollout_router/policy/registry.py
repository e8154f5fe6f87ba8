"""Policies by name: a new policy is a new file plus one line here."""
from __future__ import annotations

import inspect
from typing import Any

from .adaptive_affinity import AdaptiveAffinityPolicy
from .affinity import AffinityPolicy
from .base import Policy
from .cache_aware import CacheAwarePolicy
from .consistent_hash import ConsistentHashPolicy
from .cost_affinity import CostAffinityPolicy
from .dual_threshold import DualThresholdPolicy
from .least_loaded import LeastLoadedPolicy
from .power_of_two import PowerOfTwoPolicy
from .round_robin import RoundRobinPolicy

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (
        AffinityPolicy, LeastLoadedPolicy, RoundRobinPolicy, DualThresholdPolicy, CacheAwarePolicy,
        ConsistentHashPolicy, PowerOfTwoPolicy, AdaptiveAffinityPolicy, CostAffinityPolicy,
    )
}


def options(name: str) -> list[str]:
    """The options policy ``name`` takes (its constructor's parameters)."""
    return list(inspect.signature(_policy_class(name)).parameters)


def create(name: str, **given: Any) -> Policy:
    """Build policy ``name``; an option it does not take is an error, never silently dropped."""
    accepted = options(name)
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise ValueError(f"policy {name!r} takes no option {', '.join(map(repr, unknown))}; "
                         f"it takes: {', '.join(accepted) or 'none'}")
    return _policy_class(name)(**given)


def _policy_class(name: str) -> type[Policy]:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
