"""The request path's tallies as plain numbers: a counter's and a histogram's series, and the kept-turn sampler.

The request path adds to them with no lock and no lookup (``tallies`` renders them for Prometheus at scrape
time); the native lane's answer adds to them in C through their declared interface (``tallies.pxd``).
"""
from __future__ import annotations

import time


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
        """Count ``value`` in its bucket: bucket i counts values <= bounds[i], the last is +Inf (``bisect_left``,
        written out so that compiled it runs in C: every answer observes its duration)."""
        bounds = self.bounds
        low, high = 0, len(bounds)
        while low < high:
            middle = (low + high) >> 1
            bound = bounds[middle]
            if bound < value:
                low = middle + 1
            else:
                high = middle
        self.counts[low] += 1
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
