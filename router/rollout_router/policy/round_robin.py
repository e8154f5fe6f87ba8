"""Round robin over the replicas in name order; ignores keys and load."""
from __future__ import annotations

from .base import Decision, Outcome, Policy, Request
from .hashing import ordered
from .unkeyed import require


class RoundRobinPolicy(Policy):
    name = "round_robin"

    def __init__(self) -> None:
        super().__init__()
        self._next = 0

    def route(self, request: Request) -> Decision:
        replicas = ordered(require(request.loads))
        replica = replicas[self._next % len(replicas)]
        self._next += 1
        self.counters.count(Outcome.UNKEYED)
        return Decision(replica, Outcome.UNKEYED)
