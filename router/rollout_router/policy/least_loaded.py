"""No affinity: every request goes to a least-loaded replica; nothing is pinned.

The baseline that balances best and reuses the prefix cache least.
"""
from __future__ import annotations

from .base import Decision, Policy, Request
from .unkeyed import Unkeyed


class LeastLoadedPolicy(Policy):
    name = "least_loaded"

    def __init__(self) -> None:
        super().__init__()
        self._unkeyed = Unkeyed()

    def route(self, request: Request) -> Decision:
        return self._unkeyed.decide(request.loads, self.counters)
