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

from .base import Decision, Request
from .hashing import least_loaded, stable_hash
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

    def _ring(self, replicas) -> tuple[list[int], list[str]]:
        members = frozenset(replicas)
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
        cap = math.ceil(self.load_factor * (sum(loads.values()) + 1) / len(loads))
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
