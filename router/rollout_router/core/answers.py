"""A request's answer below 400 recorded on the hot state: what every path does at the end of most requests.

``outcome.answered`` calls ``answered_ok`` for an accepted answer below 400 whose replica is live and counted
and whose series ``Metrics`` has looked up; the native lane's sticky hit calls it in C (``answers.pxd``) for the
same answers; everything else is ``outcome.answered``'s general case. ``streaks_end`` is passive health's part,
which ``OutlierDetector.answered`` asks for every answer below 500.
"""
from __future__ import annotations

from typing import Protocol

from .ledger import Counted, put
from .loads import LoadIndex
from .tallies import CounterChild, HistogramChild


class Streaks(Protocol):
    """A replica's passive-health streaks (``replicas.Replica``)."""

    failures: int
    server_errors: int


class Answering(Counted, Streaks, Protocol):
    """A replica as an answer's record reads and writes it."""


def streaks_end(replica: Streaks) -> None:
    """The replica answered below 500: its runs of failures and of 5xx answers end."""
    replica.failures = 0
    replica.server_errors = 0


def answered_ok(replica: Answering, counter: CounterChild, spread: HistogramChild, seconds: float, http: LoadIndex,
                grpc: LoadIndex) -> None:
    """A live replica's request answered below 400 after ``seconds``: its streaks end, the request is counted in
    its series (``counter``, ``spread``: ``Metrics.series``), and the replica is put back (``ledger.put``)."""
    streaks_end(replica)
    counter.value += 1
    spread.observe(seconds)
    put(replica, http, grpc)
