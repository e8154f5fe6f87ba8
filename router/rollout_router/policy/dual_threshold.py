"""verl PR #6533 / SGLang's global dual-threshold gate on sticky sessions.

Sessions stay pinned while the pool is balanced. The pool is imbalanced when
``max - min > abs_threshold`` **and** ``max > rel_threshold * min`` (loads are
the router's in-flight counts); then every sticky hit not already on a
least-loaded replica goes to one and is re-pinned there. Unlike
``affinity_break_margin`` the gate is global: one crowded replica makes
sessions on *every* replica move. It reuses the affinity policy's session
handling and changes only the keep rule.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

from .affinity import AffinityPolicy
from .hashing import lowest


class DualThresholdPolicy(AffinityPolicy):
    name = "dual_threshold"

    def __init__(self, abs_threshold: float = 4, rel_threshold: float = 1.05,
                 max_sessions: int = 100_000, idle_ttl: float | None = 3600.0):
        if abs_threshold < 0 or rel_threshold < 1:
            raise ValueError("abs_threshold must be >= 0 and rel_threshold >= 1")
        super().__init__(margin=None, max_sessions=max_sessions, idle_ttl=idle_ttl)
        self.abs_threshold, self.rel_threshold = abs_threshold, rel_threshold

    def imbalanced(self, loads: Mapping[str, float]) -> bool:
        hi, lo = max(loads.values()), lowest(loads)
        return hi - lo > self.abs_threshold and hi > self.rel_threshold * lo

    def _keeps_every_pin(self) -> bool:
        return False  # the gate reads the loads, margin or none

    def _keeps(self, key: str, loads: Mapping[str, float], pinned: str, now: float,
               prefix: Sequence[int] | str | None) -> bool:
        return not (self.imbalanced(loads) and loads[pinned] > lowest(loads))
