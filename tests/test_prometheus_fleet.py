"""The dashboard's router-fleet row against a real Prometheus scraping three routers that share sessions.

tests/test_prometheus.py runs one router without peers, which cannot give the fleet panels data; here
every turn of a session enters by a different router, so most keyed requests are forwarded to their
owner, and every expression that reads ``promfleet.FLEET_METRICS`` must return data.
"""
from __future__ import annotations

import json
import math
import os
import urllib.request

import pytest

from rollout_router.localfleet import fleet_members, spawn_replica, start_router_fleet, stop, wait_healthy
from tests.support import wait_until
from tests.tools import promfleet

FLEET_TARGETS = [t for t in promfleet.targets(promfleet.load_dashboard()) if promfleet.reads_fleet_metrics(t[2])]
IDS = [f"{title}/{ref}" for title, ref, _ in FLEET_TARGETS]
ROUTERS = 3

if promfleet.prometheus_binary() is None:  # `make test` installs it (system-deps); in CI its absence is a failure
    if os.environ.get("CI") == "true":
        raise RuntimeError("prometheus is not installed: run `make system-deps`")
    pytest.skip("prometheus is not installed (make system-deps)", allow_module_level=True)


def fleet_status(admin_url: str) -> dict:
    with urllib.request.urlopen(f"{admin_url}/status", timeout=5) as answer:
        return json.load(answer)["fleet"]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    starting = [spawn_replica(index) for index in range(4)]
    routers = []
    try:
        replicas = [wait_healthy(s.bound(), "/health") for s in starting]
        routers = start_router_fleet(ROUTERS, replicas, tmp_path_factory.mktemp("fleet"),
                                     settings={"affinityBreakMargin": 1})
        ids = sorted(r.admin_url for r in routers)
        wait_until(lambda: all(fleet_members(r) == ids for r in routers), "the routers to see each other")
        with promfleet.prometheus([str(r.admin_url) for r in routers], [r.url for r in replicas]) as prometheus:
            traffic = promfleet.drive_traffic([str(r.url) for r in routers], sessions=24, seconds=6.0)
            prometheus.wait_scraped_after(traffic.ended + 0.2)
            yield prometheus, traffic, [fleet_status(str(r.admin_url)) for r in routers]
    finally:
        for router in routers:
            router.stop()
        for s in starting:
            stop(s.process)


def finite(series: list[dict]) -> list[float]:
    return [float(v) for s in series for _, v in s["values"] if math.isfinite(float(v))]


@pytest.mark.parametrize(("title", "ref", "expr"), FLEET_TARGETS, ids=IDS)
def test_every_fleet_expression_returns_data(run, title, ref, expr):
    prometheus, traffic, _ = run
    query = promfleet.substitute(expr, promfleet.variable_values())
    series = prometheus.query_range(query, traffic.started, traffic.ended + 2)
    assert finite(series), f"{title} {ref}: no finite data for {query}"


def test_forwarded_turns_are_counted_alike_by_prometheus_and_the_routers(run):
    prometheus, traffic, fleets = run
    assert traffic.ok > 100
    forwarded = sum(f["forwarded"] for f in fleets)
    assert forwarded > traffic.ok / 3  # two turns in three enter by a router that does not own the session
    selector = f'{{namespace="{promfleet.NAMESPACE}", rolloutrouter="{promfleet.ROLLOUTROUTER}"}}'
    (sample,) = prometheus.query(f"sum(rolloutrouter_forwarded_total{selector})")
    assert int(float(sample["value"][1])) == forwarded


def test_members_and_peer_load_age_cover_the_whole_fleet(run):
    prometheus, _, fleets = run
    (members,) = prometheus.query("min(rolloutrouter_fleet_members)")
    assert float(members["value"][1]) == ROUTERS
    peers = {s["metric"]["peer"] for s in prometheus.query("max by (peer) (rolloutrouter_peer_load_age_seconds)")}
    assert peers == {member for f in fleets for member in f["members"]}
    ages = prometheus.query("max(rolloutrouter_peer_load_age_seconds)")
    assert 0 <= float(ages[0]["value"][1]) < 1.0  # polled every 100 ms: a second-old report is a stalled peer
