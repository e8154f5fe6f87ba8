"""N router processes in front of one fleet (issue 11): session owners and a stale view of the peers' load.

Each router runs its own instance of the arm's policy (the router's own module,
built by ``Arm.build``) with its own session table. A session is owned by one
router, chosen by rendezvous hashing of its key over the routers' names, and
every turn of it is decided there (what forwarding to the owner achieves). A
router knows its own in-flight count on every replica exactly; its peers' counts
it knows as of the last exchange. Exchanges happen every ``exchange_s``
seconds of simulated time, all routers at once: at an exchange each router's
view of the others becomes their counts at that instant. ``exchange_s = 0``
is a perfect view (one router's), ``math.inf`` a router that sees only its own
requests (no exchange at all).

The fleet calls ``route`` for every turn (the ``Request.loads`` it passes are
the true fleet-wide counts; only their keys are used here) and ``on_release``
when a turn's last token is out.
"""
from __future__ import annotations

import math

from rollout_router.policy.base import Counters, Decision, Policy, Request
from rollout_router.policy.hashing import rendezvous


class RouterFleet:
    """``routers`` copies of a policy behind rendezvous session ownership, with a periodic load exchange."""

    def __init__(self, policies: list[Policy], replicas: list[str], exchange_s: float = 0.25):
        if not policies:
            raise ValueError("at least one router")
        if exchange_s < 0:
            raise ValueError("exchange_s must be >= 0 (math.inf: no exchange)")
        self.policies = policies
        self.names = [f"router-{i}" for i in range(len(policies))]
        self.replicas = list(replicas)
        self.exchange_s = exchange_s
        self.own = [dict.fromkeys(self.replicas, 0) for _ in policies]  # exact, per router
        self.snapshot = [dict.fromkeys(self.replicas, 0) for _ in policies]  # as of the last exchange
        self.next_exchange = exchange_s if 0 < exchange_s < math.inf else math.inf
        self._owner: dict[str, int] = {}
        self._held: dict[str, int] = {}  # session key -> router holding its turn in flight

    def owner(self, key: str) -> int:
        """The router that owns ``key`` (rendezvous over the routers' names, as the routers order keys)."""
        i = self._owner.get(key)
        if i is None:
            i = self._owner[key] = self.names.index(rendezvous(key, self.names))
        return i

    def view(self, router: int) -> dict[str, int]:
        """What ``router`` believes each replica's in-flight count is."""
        own = self.own[router]
        if self.exchange_s == 0:
            return {r: sum(o[r] for o in self.own) for r in self.replicas}
        peers = [s for j, s in enumerate(self.snapshot) if j != router]
        return {r: own[r] + sum(s[r] for s in peers) for r in self.replicas}

    def _tick(self, now: float) -> None:
        """Run the exchanges due by ``now`` (before applying the event at ``now``)."""
        if now >= self.next_exchange:
            self.snapshot = [dict(o) for o in self.own]
            self.next_exchange = (math.floor(now / self.exchange_s) + 1) * self.exchange_s

    def route(self, request: Request) -> Decision:
        self._tick(request.now)
        if request.key is None:
            raise ValueError("the fleet simulator sends every turn with a session key")
        i = self.owner(request.key)
        decision = self.policies[i].route(Request(request.key, self.view(i), request.now, request.prefix))
        self.own[i][decision.replica] += 1
        self._held[request.key] = i
        return decision

    def on_release(self, replica: str, key: str, now: float) -> None:
        """A turn of ``key`` on ``replica`` finished: its router's count drops."""
        self._tick(now)
        self.own[self._held.pop(key)][replica] -= 1

    @property
    def counters(self) -> Counters:
        """The routers' decision counters summed (as the operator's status sums them over pods)."""
        total = Counters()
        for p in self.policies:
            for field, value in p.counters.as_dict().items():
                setattr(total, field, getattr(total, field) + value)
        return total
