"""Policies by name: a new policy is a new file plus one entry here.

This is the one list of policy names. The router's ``policy`` setting, the
CLI's ``--policy`` help, the CRD's enum and the docs' list (docs/operator.md)
are all derived from ``ENTRIES``; an entry that is not ``selectable`` is a
research policy (the simulator's and the tests'), built by name with
``create`` but refused as a router setting.
"""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
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


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One policy: its class, a few words for help texts and docs, and whether a router may run it."""

    policy: type[Policy]
    summary: str
    selectable: bool = True


ENTRIES: tuple[Entry, ...] = (
    Entry(AffinityPolicy, "the margin policy"),
    Entry(CostAffinityPolicy, "the margin grown with load, short turns kept; costAffinity in the settings"),
    Entry(LeastLoadedPolicy, "baseline"),
    Entry(RoundRobinPolicy, "baseline"),
    Entry(ConsistentHashPolicy, "baseline, bounded loads, c=1.25"),
    Entry(PowerOfTwoPolicy, "baseline"),
    # Peer routers' rules and a refinement the simulator study did not keep (docs/simulator.md): compared there,
    # not shipped.
    Entry(DualThresholdPolicy, "verl/SGLang's global dual-threshold gate", selectable=False),
    Entry(CacheAwarePolicy, "SGLang's cache-aware prefix tree", selectable=False),
    Entry(AdaptiveAffinityPolicy, "the margin grown with context, with a cooldown", selectable=False),
)

POLICIES: dict[str, type[Policy]] = {entry.policy.name: entry.policy for entry in ENTRIES}
SELECTABLE: tuple[str, ...] = tuple(entry.policy.name for entry in ENTRIES if entry.selectable)


def summary(markup: Callable[[str], str] = str) -> str:
    """The selectable policies with their few words, ``markup`` applied to each name (the CLI's help, the docs)."""
    return ", ".join(f"{markup(entry.policy.name)} ({entry.summary})" for entry in ENTRIES if entry.selectable)


def selectable(name: object) -> str:
    """``name`` if a router may run it; else an error naming the choices (the settings' validator)."""
    if isinstance(name, str) and name in SELECTABLE:
        return name
    why = "is research-only (the simulator's)" if name in POLICIES else "is not a policy"
    raise ValueError(f"{name!r} {why}; choose one of: {', '.join(SELECTABLE)}")


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
