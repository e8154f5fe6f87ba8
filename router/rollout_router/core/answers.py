"""A request's answer below 400 recorded on the hot state: what every path does at the end of most requests.

``outcome.answered`` calls ``answered_ok`` for an accepted answer below 400, and so does the native lane's
sticky hit, in C (``answers.pxd``); when its case does not hold (the replica no longer live or counted for the
request, its series not looked up yet) it does nothing and ``outcome.answered``'s general case records the
answer. ``streaks_end`` is passive health's part, which ``OutlierDetector.answered`` asks for every answer
below 500.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from .ledger import put
from .loads import LoadIndex
from .replica import ReplicaState
from .tallies import CounterChild, HistogramChild, answered_in


class Held(Protocol):
    """A request's routing as the record reads it (``outcome.Routing``): its replica, held until put back once."""

    start: float
    held: bool

    @property
    def replica(self) -> ReplicaState: ...


def streaks_end(replica: ReplicaState) -> None:
    """The replica answered below 500: its runs of failures and of 5xx answers end."""
    replica.failures = 0
    replica.server_errors = 0


def answered_ok(routing: Held, live: Mapping[str, object], series: Mapping[tuple[str, int | str],
                tuple[CounterChild, HistogramChild]], code: int | str, now: float, http: LoadIndex,
                grpc: LoadIndex) -> bool:
    """A request answered below 400 with ``code`` at ``now``, recorded when its case holds: the routing still holds
    its replica, which is live (``live``: ``ReplicaSet.members``) and counted, and the request's series is looked
    up (``series``: ``Metrics.series``). Then the streaks end, the request is counted with its duration, and the
    replica is put back (``ledger.put``), once; False (nothing done) otherwise."""
    replica = routing.replica
    found = series.get((replica.id, code))
    if found is None or not routing.held or live.get(replica.id) is not replica or replica.inflight <= 0:
        return False
    routing.held = False
    streaks_end(replica)
    answered_in(found, now - routing.start)
    put(replica, http, grpc)
    return True


def turn_recorded(record: Callable[[Any], None], kept_first_byte: HistogramChild, turn: object, start: float,
                  first_at: float) -> None:
    """An accepted request's turn recorded (``record``: ``Metrics.turn``), or for a kept turn with no ``Turn``
    (the lane measures a sampled share of them), its first byte alone (``first_at``; 0: none came)."""
    if turn is not None:
        record(turn)
    elif first_at:
        kept_first_byte.observe(first_at - start)
