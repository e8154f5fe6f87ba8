"""Round robin over the replicas in name order; ignores keys and load."""
from __future__ import annotations

from .base import Counters, Decision, Outcome, Request
from .unkeyed import require


class RoundRobinPolicy:
    name = "round_robin"

    def __init__(self) -> None:
        self.counters = Counters()
        self._next = 0

    def route(self, request: Request) -> Decision:
        replicas = sorted(require(request.loads))
        replica = replicas[self._next % len(replicas)]
        self._next += 1
        self.counters.count(Outcome.UNKEYED)
        return Decision(replica, Outcome.UNKEYED)

    def release(self, key: str) -> bool:
        return False

    def sessions(self) -> int:
        return 0
