"""Metrics kept as plain numbers (tallies.py) export what prometheus_client's Counter and Histogram would, and
/status's TTFB sums are those of the exported histogram."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest

from rollout_router.observability import LATENCY_BUCKETS, MarginMeter
from rollout_router.proxy.turns import Turn
from rollout_router.tallies import Spread, Tally

OBSERVED = [("a", "200", 0.003), ("a", "200", 0.05), ("b", "503", 7.0), ("a", "404", 400.0), ("b", "200", 0.005)]


def _without_created(text: bytes) -> list[str]:
    return [line for line in text.decode().splitlines() if "_created" not in line]


def test_tallies_and_spreads_export_what_counters_and_histograms_would():
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    tally, plain = Tally("t_requests", "Requests.", ["backend", "code"]), Tally("t_tokens", "Tokens.", [])
    spread = Spread("t_seconds", "Seconds.", ["backend"], LATENCY_BUCKETS)
    for family in (tally, plain, spread):
        ours.register(family)
    counter = Counter("t_requests", "Requests.", ["backend", "code"], registry=theirs)
    plain_counter = Counter("t_tokens", "Tokens.", registry=theirs)
    histogram = Histogram("t_seconds", "Seconds.", ["backend"], buckets=LATENCY_BUCKETS, registry=theirs)
    tokens = plain.child()  # an unlabelled counter is exported from zero on, as prometheus_client's is
    assert _without_created(generate_latest(ours)) == _without_created(generate_latest(theirs))
    for backend, code, seconds in OBSERVED:
        tally.child(backend, code).inc()
        counter.labels(backend, code).inc()
        tokens.value += 3
        plain_counter.inc(3)
        spread.child(backend).observe(seconds)
        histogram.labels(backend).observe(seconds)
    for generate in (generate_latest, openmetrics_latest):
        assert _without_created(generate(ours)) == _without_created(generate(theirs))


def test_the_margin_status_sums_the_time_to_first_byte_it_exports():
    meter = MarginMeter(CollectorRegistry())
    for outcome, first_byte in [("kept", 0.25), ("kept", 0.5), ("broken", 1.0), ("repinned", 2.0), ("new", None)]:
        turn = Turn(outcome, None, False)
        turn.begin(10.0)
        if first_byte is not None:
            turn.first(10.0 + first_byte)
        meter.turn(turn)
    ttfb = meter.status()["ttfb"]
    assert ttfb["kept"] == {"turns": 2, "seconds": 0.75, "mean": 0.375}
    assert ttfb["moved"] == {"turns": 2, "seconds": 3.0, "mean": 1.5}
    assert ttfb["new"] == {"turns": 0, "seconds": 0.0, "mean": None}
    counts = {s.labels["outcome"]: s.value for family in meter.ttfb.collect() for s in family.samples
              if s.name.endswith("_count")}
    assert counts == {"kept": 2, "broken": 1, "repinned": 1, "new": 0, "unkeyed": 0}
