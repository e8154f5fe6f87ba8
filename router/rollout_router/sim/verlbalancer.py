"""verl's own balancer, as a policy the fleet simulator can drive beside ours.

verl 0.9.1 (``verl/workers/rollout/router.py``, ``GlobalRequestLoadBalancer.acquire_server``): one
``cachetools.LRUCache(maxsize=10000)`` maps request_id -> server for the whole fleet, with no idle
timeout (a read refreshes recency); a known request_id goes to its server, a new one to a server with the
fewest in-flight requests, ``random.choice`` among the tied. At the base of verl PR #7435 the tie went to
the first registered server (``min(inflight, key=count)``), and the PR adds ``affinity_break_margin``: a
pinned request stays while ``inflight[pinned] <= min(inflight) + margin``, else it is re-pinned to a
least-loaded server (``margin=None``: always stay). ``tie`` picks ``"first"`` or ``"random"`` (seeded).
With ``relative`` the margin is a share of the fleet's mean load instead (a candidate rule of the seed study,
``verlgrid``: keep while ``load[pinned] <= min(load) + margin * mean(load)``), whatever the load counts
(requests, or tokens: ``engine.Arm.load``).

Ours (``policy.affinity``) differs only in its tie-break (a hash of the key) and its table (per router, a
TTL); this class is a reference for the simulator, not a router policy.
"""
from __future__ import annotations

import random
from collections import OrderedDict

from rollout_router.policy.base import Counters, Decision, Outcome, Policy, Request

TIES = ("first", "random")


class VerlBalancer(Policy):
    """verl's sticky least-in-flight balancer with the PR's margin and either of its tie-breaks."""

    name = "verl"

    def __init__(self, margin: float | None = None, tie: str = "first", max_sessions: int = 10_000, seed: int = 0,
                 relative: bool = False):
        super().__init__()
        if tie not in TIES:
            raise ValueError(f"tie must be one of {TIES}, got {tie!r}")
        self.margin, self.tie, self.max_sessions, self.relative = margin, tie, max_sessions, relative
        self.rng = random.Random(seed)
        self.table: OrderedDict[str, str] = OrderedDict()
        self.counters = Counters()

    def _least(self, loads) -> str:
        low = min(loads.values())
        tied = [r for r, v in loads.items() if v == low]  # registration order
        return tied[0] if self.tie == "first" else self.rng.choice(tied)

    def _threshold(self, loads) -> float:
        assert self.margin is not None
        return self.margin * sum(loads.values()) / len(loads) if self.relative else self.margin

    def route(self, request: Request) -> Decision:
        key, loads = request.key, request.loads
        if key is None:
            raise ValueError("verl sends a request_id with every request")
        pinned = self.table.get(key)
        if pinned is None:
            decision = Decision(self._least(loads), Outcome.NEW)
        elif self.margin is None or loads[pinned] <= min(loads.values()) + self._threshold(loads):
            decision = Decision(pinned, Outcome.KEPT)
        else:
            decision = Decision(self._least(loads), Outcome.BROKEN, previous=pinned)
        self.counters.count(decision.outcome)
        self.table[key] = decision.replica
        self.table.move_to_end(key)
        if len(self.table) > self.max_sessions:
            self.table.popitem(last=False)
            self.counters.evicted_lru += 1
        return decision
