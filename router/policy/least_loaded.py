"""No affinity: every request goes to a least-loaded replica; nothing is pinned.

The baseline that balances best and reuses the prefix cache least.
"""
from __future__ import annotations


from .base import Counters, Decision, NoReplicaError, Outcome, Request
from .hashing import Spread


class LeastLoadedPolicy:
    name = "least_loaded"

    def __init__(self) -> None:
        self.counters = Counters()
        self._unkeyed = Spread()

    def route(self, request: Request) -> Decision:
        if not request.loads:
            raise NoReplicaError("no replica is available")
        self.counters.count(Outcome.UNKEYED)
        return Decision(self._unkeyed.pick(request.loads), Outcome.UNKEYED)

    def release(self, key: str) -> bool:
        return False

    def sessions(self) -> int:
        return 0
