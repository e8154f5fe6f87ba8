"""The decision counters: what every routing decision, and every pin that went without a request releasing it,
adds one to; read at scrape time (``/metrics``, ``/status``, the resource's status).

Plain numbers with a declared interface (``counters.pxd``), so the native lane's sticky hit counts a kept pin in
C; the policy's ``Counters`` adds what names the counts by a decision's outcome.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

Decided = TypeVar("Decided")  # the policy's Decision (the core imports no policy)

FIELDS = ("affinity_kept", "affinity_broken", "new_sessions", "repinned_replica_gone", "unkeyed", "evicted_lru",
          "expired_idle", "released", "group_colocated", "group_spilled", "restored")


class DecisionCounts:
    """Monotonic decision counters. ``group_colocated``/``group_spilled``: new sessions placed on their GRPO
    group's replica, or elsewhere (its replica beyond the margin or gone, ``policy/groups.py``); ``restored``:
    pins read back at start from the file a stopping router wrote (``--state-file``)."""

    __slots__ = FIELDS  # (compiled, the fields are the C ones counters.pxd declares)

    def __init__(self) -> None:
        self.affinity_kept = self.affinity_broken = self.new_sessions = self.repinned_replica_gone = 0
        self.unkeyed = self.evicted_lru = self.expired_idle = self.released = 0
        self.group_colocated = self.group_spilled = self.restored = 0

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in FIELDS}

    def __eq__(self, other: object) -> bool:
        """Counts are values: two policies that decided alike count alike."""
        return isinstance(other, DecisionCounts) and self.as_dict() == other.as_dict()

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v}' for k, v in self.as_dict().items())})"


def kept_decision(counts: DecisionCounts, decisions: Mapping[str, Decided], replica: str) -> Decided:
    """A sticky hit on ``replica`` counted, and its decision (``decisions``: the policy's, one made per replica):
    what every path that keeps a pin does next (the policies, the native lane's sticky hit)."""
    counts.affinity_kept += 1
    return decisions[replica]
