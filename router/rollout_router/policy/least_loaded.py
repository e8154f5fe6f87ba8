"""No affinity: every request goes to a least-loaded replica; nothing is pinned.

The baseline that balances best and reuses the prefix cache least.
"""
from __future__ import annotations

from .base import Counters, Decision, Request
from .unkeyed import Unkeyed


class LeastLoadedPolicy:
    name = "least_loaded"

    def __init__(self) -> None:
        self.counters = Counters()
        self._unkeyed = Unkeyed()

    def route(self, request: Request) -> Decision:
        return self._unkeyed.decide(request.loads, self.counters)

    def release(self, key: str) -> bool:
        return False

    def sessions(self) -> int:
        return 0
