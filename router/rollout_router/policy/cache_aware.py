"""SGLang / SMG ``cache_aware``: route to the replica whose prefix tree matches best.

Per replica the router keeps an approximate prefix index of what it sent
there. If the pool is imbalanced (``max - min > balance_abs_threshold`` and
``max > balance_rel_threshold * min``) the request goes to a least-loaded
replica. Otherwise, if the best match covers more than ``cache_threshold`` of
the request it goes to the best-matching replica, else to the replica with
the smallest index. Either way the chosen replica's index learns the request.

The index here is SMG's hash-index variant: ``Request.prefix`` is a sequence of
hashable units (token ids, characters of a string, or chained block hashes as
the simulator passes). Because units are inserted as whole prefixes, the
matched length is found by binary search. When an index exceeds
``max_tree_size`` units, its oldest insertions are dropped first (SGLang evicts
LRU leaves in a background thread). Requests without a prefix fall back to the
session key. Keyed requests are remembered only to count kept / broken the
way every session policy does (``Policy``); routing never reads them.
"""
from __future__ import annotations

from collections.abc import Sequence

from .base import Decision, Outcome, Request
from .hashing import least_loaded
from .sessions import SessionPolicy
from .unkeyed import require


class CacheAwarePolicy(SessionPolicy):
    name = "cache_aware"

    def __init__(self, cache_threshold: float = 0.3, balance_abs_threshold: float = 64,
                 balance_rel_threshold: float = 1.5, max_tree_size: int = 2**26,
                 max_sessions: int = 100_000, idle_ttl: float | None = 3600.0):
        super().__init__(max_sessions, idle_ttl)
        self.cache_threshold = cache_threshold
        self.balance_abs_threshold, self.balance_rel_threshold = balance_abs_threshold, balance_rel_threshold
        self.max_tree_size = max_tree_size
        self._trees: dict[str, dict] = {}

    def _units(self, request: Request) -> Sequence:
        if request.prefix is not None and len(request.prefix):
            return request.prefix
        return [request.key] if request.key is not None else []

    @staticmethod
    def _match(tree: dict, units: Sequence) -> int:
        lo, hi = 0, len(units)
        while lo < hi:  # largest m with units[m-1] in tree (prefix-closed)
            mid = (lo + hi + 1) // 2
            if (mid, units[mid - 1]) in tree:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def route(self, request: Request) -> Decision:
        loads = require(request.loads)
        units = self._units(request)
        tie = request.key or "#"
        hi, lo = max(loads.values()), min(loads.values())
        if hi - lo > self.balance_abs_threshold and hi > self.balance_rel_threshold * lo:
            replica = least_loaded(loads, tie)
        else:
            matches = {r: self._match(self._trees.get(r, {}), units) for r in loads}
            best = max(matches.values()) if matches else 0
            if units and best / len(units) > self.cache_threshold:
                replica = least_loaded({r: -m for r, m in matches.items()}, tie)
            else:
                replica = least_loaded({r: len(self._trees.get(r, ())) for r in loads}, tie)
        self._insert(replica, units)
        if request.key is None:
            self.counters.count(Outcome.UNKEYED)
            return Decision(replica, Outcome.UNKEYED)
        return self._follow(request.key, replica, loads, request.now)

    def _insert(self, replica: str, units: Sequence) -> None:
        tree = self._trees.setdefault(replica, {})
        for m in range(self._match(tree, units) + 1, len(units) + 1):
            tree[(m, units[m - 1])] = None
        while len(tree) > self.max_tree_size:
            del tree[next(iter(tree))]
