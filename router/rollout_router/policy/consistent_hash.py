"""Consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam 2017).

A session key hashes onto a ring of virtual nodes; it goes to the first
replica clockwise whose load is below ``ceil(load_factor * (total + 1) / n)``
(the request itself included). Nothing is stored per session: a session stays
put while its home replica has room and spills deterministically to the next
replica with room. ``load_factor`` 1.25 matches SMG ``prefix_hash`` and brpc;
HAProxy's ``hash-balance-factor`` and Envoy's ``hash_balance_factor`` are the
same rule. The policy remembers each key's last replica only to count kept /
broken the way every session policy does (``Policy``); it never routes by it.
"""
from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

from .base import Decision, Request
from .hashing import least_loaded, ordered, stable_hash, total
from .sessions import SessionPolicy
from .unkeyed import require


class ConsistentHashPolicy(SessionPolicy):
    name = "consistent_hash"

    def __init__(self, load_factor: float = 1.25, vnodes: int = 160,
                 max_sessions: int = 100_000, idle_ttl: float | None = 3600.0):
        if load_factor < 1:
            raise ValueError("load_factor must be >= 1")
        super().__init__(max_sessions, idle_ttl)
        self.load_factor, self.vnodes = load_factor, vnodes
        self._rings: dict[frozenset, tuple[list[int], list[str]]] = {}
        self._current: tuple[Sequence[str], tuple[list[int], list[str]]] | None = None

    def _ring(self, loads: Mapping[str, float]) -> tuple[list[int], list[str]]:
        """The ring of the replicas in ``loads``; a live ``LoadIndex`` hands out the same
        ``ordered()`` tuple until membership changes, so the common case costs one ``is``."""
        names = ordered(loads)
        if self._current is not None and self._current[0] is names:
            return self._current[1]
        ring = self._ring_of(frozenset(names))
        self._current = (names, ring)
        return ring

    def _ring_of(self, members: frozenset) -> tuple[list[int], list[str]]:
        ring = self._rings.get(members)
        if ring is None:
            points = sorted((stable_hash(r, str(v)), r) for r in members for v in range(self.vnodes))
            ring = self._rings[members] = ([h for h, _ in points], [r for _, r in points])
            if len(self._rings) > 64:
                self._rings.pop(next(iter(self._rings)))
        return ring

    def route(self, request: Request) -> Decision:
        key = request.key
        if key is None:
            return self._unkeyed.decide(request.loads, self.counters)
        loads = require(request.loads)
        hashes, owners = self._ring(loads)
        cap = math.ceil(self.load_factor * (total(loads) + 1) / len(loads))
        start = bisect.bisect(hashes, stable_hash(key))
        chosen = None
        for j in range(len(owners)):
            replica = owners[(start + j) % len(owners)]
            if loads[replica] + 1 <= cap:
                chosen = replica
                break
        if chosen is None:  # cannot happen with load_factor >= 1, kept for safety
            chosen = least_loaded(loads, key)
        return self._follow(key, chosen, loads, request.now)
