"""A count of the changes to what the native lane's sticky hit reads from the router's Python objects.

The sticky hit routes a request without the policy only while the settings it was synced to are live, dispatch
is not paused, the balancer's policy is one it knows and no fleet shares the sessions (or the fleet lets it).
Read off four Python objects, those are four attribute lookups per request, each likely a cache miss when other
work runs between requests (benchmarks/routing_cold.py); instead their owners count every change here
(``Runtime.apply`` and its fleet's start, ``RlState.paused``, ``Balancer.apply``), and the sticky hit reads them
again only when the count moved: one C field.
"""
from __future__ import annotations


class Changes:
    """Bumped on every change the sticky hit must see; ``count`` is what it compares."""

    __slots__ = ("count",)

    def __init__(self) -> None:
        self.count = 0

    def bump(self) -> None:
        self.count += 1
