"""Policies by name: a new policy is a new file plus one line here."""
from __future__ import annotations

import inspect
from typing import Any

from .adaptive_affinity import AdaptiveAffinityPolicy
from .affinity import AffinityPolicy
from .base import Policy
from .cache_aware import CacheAwarePolicy
from .consistent_hash import ConsistentHashPolicy
from .dual_threshold import DualThresholdPolicy
from .least_loaded import LeastLoadedPolicy
from .power_of_two import PowerOfTwoPolicy
from .round_robin import RoundRobinPolicy

POLICIES: dict[str, type] = {
    AffinityPolicy.name: AffinityPolicy,
    LeastLoadedPolicy.name: LeastLoadedPolicy,
    RoundRobinPolicy.name: RoundRobinPolicy,
    DualThresholdPolicy.name: DualThresholdPolicy,
    CacheAwarePolicy.name: CacheAwarePolicy,
    ConsistentHashPolicy.name: ConsistentHashPolicy,
    PowerOfTwoPolicy.name: PowerOfTwoPolicy,
    AdaptiveAffinityPolicy.name: AdaptiveAffinityPolicy,
}


def create(name: str, **options: Any) -> Policy:
    """Build policy ``name``, passing only the options its constructor takes."""
    try:
        cls = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(sorted(POLICIES))}") from None
    accepted = inspect.signature(cls).parameters
    return cls(**{k: v for k, v in options.items() if k in accepted})
