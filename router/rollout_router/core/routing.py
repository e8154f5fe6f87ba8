"""One attempt's routing as a declared record: what every path routes a request into and ends it with.

Compiled, the native lane makes one for each sticky hit with no Python run (``routing.pxd``); the record's
functions live with what they touch (``proxy/outcome.py``: put back, answered, refused).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the types only: the core imports nothing of the router above it
    from ..policy import Decision
    from ..proxy.turns import Turn
    from ..replicas import Replica


class Routing:
    """One attempt's routing: the keys it was routed by, the policy's decision, the replica counted in flight
    for it (``held`` until put back, once), its ``Turn`` (None: a kept turn the lane does not measure) and the
    attempt's start (the monotonic clock: the request duration is measured from it). Made by ``routed``."""

    __slots__ = ("key", "group", "decision", "replica", "turn", "start", "held")

    key: str | None
    group: str | None
    decision: Decision
    replica: Replica
    turn: Turn | None
    start: float
    held: bool


def routed(key: str | None, group: str | None, decision: Decision, replica: Replica, turn: Turn | None,
           start: float = 0.0) -> Routing:
    """A new attempt's routing, its replica held. A function, not ``__init__``: compiled, the native lane's sticky
    hit calls it in C, with no argument tuple nor the type's call (``Routing.__new__`` alone)."""
    routing = Routing.__new__(Routing)
    routing.key, routing.group, routing.decision, routing.replica = key, group, decision, replica
    routing.turn, routing.start, routing.held = turn, start, True
    return routing
