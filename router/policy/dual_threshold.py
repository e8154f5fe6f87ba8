"""verl PR #6533 / SGLang's global dual-threshold gate on sticky sessions.

Sessions stay pinned while the pool is balanced. The pool is imbalanced when
``max - min > abs_threshold`` **and** ``max > rel_threshold * min`` (loads are
the router's in-flight counts); then every sticky hit goes to a least-loaded
replica and is re-pinned there. Unlike ``affinity_break_margin`` the gate is
global: one crowded replica makes sessions on *every* replica move.
"""
from __future__ import annotations

import itertools

from .base import Counters, Decision, NoReplicaError, Outcome, Request
from .hashing import least_loaded
from .sessions import SessionTable


class DualThresholdPolicy:
    name = "dual_threshold"

    def __init__(self, abs_threshold: float = 4, rel_threshold: float = 1.05,
                 max_sessions: int = 100_000, idle_ttl: float | None = 3600.0):
        if abs_threshold < 0 or rel_threshold < 1:
            raise ValueError("abs_threshold must be >= 0 and rel_threshold >= 1")
        self.abs_threshold, self.rel_threshold = abs_threshold, rel_threshold
        self.counters = Counters()
        self.table = SessionTable(self.counters, max_sessions, idle_ttl)
        self._unkeyed = itertools.count()

    def imbalanced(self, loads) -> bool:
        hi, lo = max(loads.values()), min(loads.values())
        return hi - lo > self.abs_threshold and hi > self.rel_threshold * lo

    def route(self, request: Request) -> Decision:
        loads = request.loads
        if not loads:
            raise NoReplicaError("no replica is available")
        key = request.key
        if key is None:
            self.counters.count(Outcome.UNKEYED)
            return Decision(least_loaded(loads, f"#{next(self._unkeyed)}"), Outcome.UNKEYED)
        pinned = self.table.get(key, request.now)
        if pinned is None:
            decision = Decision(least_loaded(loads, key), Outcome.NEW)
        elif pinned not in loads:
            decision = Decision(least_loaded(loads, key), Outcome.REPINNED, previous=pinned)
        elif self.imbalanced(loads) and loads[pinned] > min(loads.values()):
            decision = Decision(least_loaded(loads, key), Outcome.BROKEN, previous=pinned)
        else:
            decision = Decision(pinned, Outcome.KEPT)
        self.table.pin(key, decision.replica, request.now)
        self.counters.count(decision.outcome)
        return decision

    def release(self, key: str) -> bool:
        return self.table.release(key)

    def sessions(self) -> int:
        return len(self.table)
