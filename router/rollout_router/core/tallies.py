"""The request path's tallies as plain numbers: a counter's and a histogram's series, and the kept-turn sampler.

The request path adds to them with no lock and no lookup (``tallies`` renders them for Prometheus at scrape
time); the native lane's answer adds to them in C through their declared interface (``tallies.pxd``).
"""
from __future__ import annotations

import time
from array import array


class CounterChild:
    """One labelled series of a ``Tally``: ``value`` is what the request path adds to."""

    __slots__ = ("value", "created")

    def __init__(self) -> None:
        self.value = 0
        self.created = time.time()

    def inc(self, amount: int = 1) -> None:
        self.value += amount


class HistogramChild:
    """One labelled series of a ``Spread``: per-bucket counts (not cumulative) and the sum of what was observed.

    The bounds and the counts are kept as arrays of machine numbers (``edges``, ``tally``): compiled, an
    observation reads and adds to them in C, with no float or int object to find in memory or to make (every
    answer observes its duration, most at a moment the CPU caches hold other work)."""

    __slots__ = ("edges", "tally", "sum", "created")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.sum, self.created = 0.0, time.time()
        self.edges = array("d", bounds)
        self.tally = array("q", bytes(8 * (len(bounds) + 1)))

    @property
    def counts(self) -> list[int]:
        """Each bucket's count: bucket i counts values <= bounds[i], the last is +Inf."""
        return list(self.tally)

    def observe(self, value: float) -> None:
        """Count ``value`` in its bucket (``bisect_left`` on the bounds, written out so that compiled it runs in C)."""
        edges = self.edges
        low, high = 0, len(edges)
        while low < high:
            middle = (low + high) >> 1
            if edges[middle] < value:
                low = middle + 1
            else:
                high = middle
        self.tally[low] += 1
        self.sum += value


class Sampler:
    """Every 1/``rate``-th kept turn is measured (settings.metrics.keptPrefillSampleRate): deterministic, a credit
    that grows by ``rate`` per kept turn and is spent at 1."""

    __slots__ = ("rate", "credit")

    def __init__(self) -> None:
        self.rate = 0.0
        self.credit = 0.0

    def sample(self) -> bool:
        """Whether this kept turn is measured."""
        self.credit += self.rate
        if self.credit >= 1:
            self.credit -= 1
            return True
        return False


def answered_in(series: tuple[CounterChild, HistogramChild], seconds: float) -> None:
    """One request answered in ``seconds`` on its series (a replica's and its answer code's: a count and the
    histogram of durations): ``Metrics.observe``, and the record of an answer below 400 (``answers.answered_ok``)."""
    counter, spread = series
    counter.value += 1
    spread.observe(seconds)
