"""Counters and histograms of the request path as plain numbers, exposed by a Prometheus collector at scrape time.

``prometheus_client``'s Counter and Histogram take a lock on every ``inc``/``observe``: three locks per
proxied request, for a router that runs on one event loop thread and never needs them (issue 22). These
keep integers and lists the request path adds to without a lock or a lookup, and ``collect`` renders them
as the same families, names, labels and samples (``_total``/``_created``, ``_bucket``/``_count``/``_sum``/
``_created``) the library's own metrics would have produced. A scrape from another thread may read a count
a request later than its neighbour: each sample is still a value the counter had.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.metrics import _use_created  # PROMETHEUS_DISABLE_CREATED_SERIES, as the library reads it
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from .core.tallies import CounterChild, HistogramChild


class Tally(Collector):
    """A labelled counter, ``rolloutrouter_requests_total`` style, without a lock per increment."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str]):
        self.name, self.documentation, self.labels = name, documentation, list(labels)
        self.children: dict[tuple[str, ...], CounterChild] = {}

    def child(self, *values: str) -> CounterChild:
        """The series for these label values, made on first use (as ``Counter.labels`` does)."""
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = CounterChild()
        return child

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labels)
        for values, child in list(self.children.items()):
            family.add_metric(list(values), child.value, created=child.created if _use_created else None)
        yield family


class Spread(Collector):
    """A labelled histogram with fixed buckets, without a lock per observation."""

    def __init__(self, name: str, documentation: str, labels: Sequence[str], buckets: Sequence[float]):
        self.name, self.documentation, self.labels = name, documentation, list(labels)
        self.bounds = tuple(float(b) for b in buckets)
        self.children: dict[tuple[str, ...], HistogramChild] = {}

    def child(self, *values: str) -> HistogramChild:
        """The series for these label values, made on first use (as ``Histogram.labels`` does)."""
        child = self.children.get(values)
        if child is None:
            child = self.children[values] = HistogramChild(self.bounds)
        return child

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
        for values, child in list(self.children.items()):
            labels, counts, total = list(values), list(child.counts), child.sum
            buckets, acc = [], 0
            for bound, count in zip((*self.bounds, float("inf")), counts):
                acc += count
                buckets.append((floatToGoString(bound), acc))
            family.add_metric(labels, buckets, total)
            if _use_created:
                family.samples.append(Sample(self.name + "_created", dict(zip(self.labels, labels)), child.created))
        yield family
