"""The request path's tallies as plain numbers: a counter's and a histogram's series, and the kept-turn sampler.

The request path adds to them with no lock and no lookup (``tallies`` renders them for Prometheus at scrape
time); the native lane's answer adds to them in C through their declared interface (``tallies.pxd``).
"""
from __future__ import annotations

import time
from bisect import bisect_left


class CounterChild:
    """One labelled series of a ``Tally``: ``value`` is what the request path adds to."""

    __slots__ = ("value", "created")

    def __init__(self) -> None:
        self.value = 0
        self.created = time.time()

    def inc(self, amount: int = 1) -> None:
        self.value += amount


class HistogramChild:
    """One labelled series of a ``Spread``: per-bucket counts (not cumulative) and the sum of what was observed."""

    __slots__ = ("bounds", "counts", "sum", "created")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds, self.counts, self.sum, self.created = bounds, [0] * (len(bounds) + 1), 0.0, time.time()

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1  # bucket i counts values <= bounds[i]; the last is +Inf
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
