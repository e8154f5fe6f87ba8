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
    attempt's start (the monotonic clock: the request duration is measured from it)."""

    __slots__ = ("key", "group", "decision", "replica", "turn", "start", "held")

    def __init__(self, key: str | None, group: str | None, decision: Decision, replica: Replica,
                 turn: Turn | None, start: float = 0.0) -> None:
        self.key, self.group, self.decision, self.replica = key, group, decision, replica
        self.turn, self.start, self.held = turn, start, True
