"""The native lane's sticky hit (``_lane_sticky.pxi``): a request whose pin is kept is routed, and its answer
recorded, in C on the router's own objects, leaving exactly what ``LaneGlue.route`` and ``finish`` leave.

Two routers are built alike; one runs the lane with its sticky hit, the other with it taken out (every request
through ``LaneGlue``). The same requests, answers, reloads and replica troubles go through both, in the lane's
own entry points (``Lane.route``, ``Lane.finish``), and after each step every object the sticky hit touches
must be the same: the decisions, the pins and their order, the counters, the in-flight counts and load index,
passive health, the metrics series, the kept-turn sampling.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest

from rollout_router.app import Runtime
from rollout_router.policy.base import LiveConfig
from rollout_router.proxy.http import lane
from rollout_router.settings import MetricsSettings, RouterSettings
from tests.support import NO_PROBES

pytestmark = pytest.mark.skipif(lane.unavailable() is not None, reason="the native lane is not built here "
                                "(tests/test_lane.py::test_the_lane_is_built_... says why)")

URLS = [f"http://127.0.0.{host}:9" for host in range(1, 41)]  # 3 of them, or more than LoadIndex.SCANNED
CHAT = b"/v1/chat/completions"
ANSWERS = {"ok": (200, 200, None), "5xx": (503, 503, None), "failed": (502, 0, "closed"),
           "client gone": (499, 0, None)}  # code, status, failure: what the lane's relay reports
USAGE = b'{"usage": {"prompt_tokens": 40, "prompt_tokens_details": {"cached_tokens": 32}}}'  # a measured answer's


def router(sticky: bool, replicas: int = 3) -> Runtime:
    runtime = Runtime(RouterSettings(backends=URLS[:replicas], health=NO_PROBES), data_path="native")
    for index, url in enumerate(URLS[:replicas]):
        runtime.replicas.add(url, grpc_target=None if index % 3 == 1 else f"127.0.1.{index + 1}:9")  # most in both
    if not sticky:
        runtime.http_proxy.lane.native.sticky = None
    return runtime


@contextlib.contextmanager
def no_lane_failures() -> Iterator[None]:
    """A call from the lane into the router that raised is logged and routed by ``LaneGlue``: none may happen."""
    failures: list[logging.LogRecord] = []
    handler = logging.Handler(logging.ERROR)
    handler.emit = failures.append  # type: ignore[method-assign]
    logger = logging.getLogger(lane.__name__)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
    assert not failures, [record.getMessage() for record in failures]


def route(runtime: Runtime, session: str | None, now: float):
    key = None if session is None else session.encode()
    return runtime.http_proxy.lane.native.route(None, CHAT, 2, 0 if key else -1, key, -1, None, now)


def finish(runtime: Runtime, token, answer: str, now: float) -> None:
    code, status, failure = ANSWERS[answer]
    measured = token.turn is not None and token.turn.measure
    runtime.http_proxy.lane.native.finish(token, code, status, failure, now - 0.001 if status else 0.0,
                                          USAGE if measured and status else None, now)


def state(runtime: Runtime) -> dict:
    """What a user can read of a router after a step: its /status (but the clocks: when it started, until when a
    replica is ejected), the pins as the fleet hands them over (but their last use: each router's own clock), the
    routable loads and the lowest of each protocol, and its /metrics (but the series' creation times and the sum of
    moved pins' ages, each router's own clock: their buckets are compared). Not how many
    requests the sticky hit took (``data_path.lane_sticky``, which differs by design)."""
    status = runtime.metrics.status()
    del status["started_at"], status["data_path"]["lane_sticky"]
    for backend in status["backends"]:
        backend["ejected_until"] = backend["ejected_until"] is not None
    loads = [runtime.replicas.loads(grpc) for grpc in (False, True)]
    exposition = generate_latest(runtime.metrics.registry).decode().splitlines()
    return {
        "status": status,
        "pins": [(key, replica) for key, replica, _ in runtime.balancer.pins()],
        "loads": [(dict(index), lowest(index)) for index in loads],
        "metrics": [line for line in exposition if "_created" not in line and not line.startswith(PIN_AGE_SUM)],
        "answering": runtime.http_proxy.answering,
    }


PIN_AGE_SUM = "rolloutrouter_break_pin_age_seconds_sum "


def lowest(loads) -> int | None:
    """The lowest load of a protocol's routable replicas, as a policy reads it; None when none is routable."""
    return loads.min() if len(loads) else None


def decision(routed) -> tuple | None:
    """What a routing returned, but a moved pin's age (each router's own clock)."""
    if routed is None:
        return None
    pool, measure, routing = routed
    made = routing.decision
    return (pool.replica, measure, routing.key, routing.group, made.replica, made.outcome, made.previous,
            routing.replica.id, routing.turn is None, routing.held)


STEP = st.one_of(
    st.tuples(st.just("route"), st.sampled_from(["a", "b", "c", "d", "e", None])),
    st.tuples(st.just("finish"), st.integers(0, 7), st.sampled_from(sorted(ANSWERS))),
    st.tuples(st.just("down"), st.integers(0, 2)),
    st.tuples(st.just("eject"), st.integers(0, 2)),
    st.tuples(st.just("margin"), st.sampled_from([None, 0, 2])),
    st.tuples(st.just("sample"), st.sampled_from([0.0, 0.1, 0.5, 1.0])),
    st.tuples(st.just("release"), st.sampled_from(["a", "b"])),
    st.tuples(st.just("healthy"), st.integers(0, 2), st.booleans()),
    st.tuples(st.just("external"), st.integers(0, 2), st.sampled_from([0, 1, 300])),  # loads past the small ints
    st.tuples(st.just("settle")),  # a policy reads the lowest load: what moved since is filed
)


def step(runtime: Runtime, held: list, move: tuple, now: float):
    """One step on one router; what it routed, if it routed."""
    kind, *args = move
    if kind == "route":
        routed = route(runtime, args[0], now)
        if routed is not None:
            held.append(routed[2])
        return decision(routed)
    if kind == "finish" and held:
        finish(runtime, held.pop(args[0] % len(held)), args[1], now)
    elif kind == "down":
        runtime.replicas.mark_down(URLS[args[0]], 30)
    elif kind == "eject":
        runtime.replicas.eject(runtime.replicas.get(URLS[args[0]]), 30)
    elif kind == "margin":
        runtime.balancer.policy.configure(LiveConfig(margin=args[0]))
    elif kind == "sample":
        runtime.metrics.configure(MetricsSettings(kept_prefill_sample_rate=args[0]))
    elif kind == "release":
        runtime.balancer.release_session(args[0])
    elif kind == "healthy":  # a probe's verdict: out of the HTTP index, a gRPC one's still in its own
        runtime.replicas.set_healthy(URLS[args[0]], args[1])
    elif kind == "external":
        runtime.replicas.set_external(URLS[args[0]], args[1])
    elif kind == "settle":  # a policy reads the lowest load
        for grpc in (False, True):
            lowest(runtime.replicas.loads(grpc))
    return None


@settings(max_examples=150, deadline=None)
@given(st.lists(STEP, max_size=40), st.sampled_from([3, 40]))
def test_the_sticky_hit_leaves_what_the_routers_python_leaves(moves, replicas):
    with no_lane_failures():
        both(moves, replicas)


def both(moves: list[tuple], replicas: int) -> None:
    here, there = router(sticky=True, replicas=replicas), router(sticky=False, replicas=replicas)
    held_here: list = []
    held_there: list = []
    for move in [("route", "a")] * 3 + moves:  # a pin, its first hit (its replica's kept decision made), a hit
        now = time.monotonic()
        assert step(here, held_here, move, now) == step(there, held_there, move, now), move
        assert state(here) == state(there), move
    assert here.http_proxy.lane.sticky.hits >= 1
    for token_here, token_there in zip(held_here, held_there, strict=True):
        now = time.monotonic()
        finish(here, token_here, "ok", now)
        finish(there, token_there, "ok", now)
    assert state(here) == state(there)
    assert here.replicas.total_inflight() == 0 and here.http_proxy.answering == 0


@no_lane_failures()
def test_a_kept_turn_is_routed_and_recorded_by_the_sticky_hit_with_its_pins_last_use():
    runtime = router(sticky=True)
    sticky = runtime.http_proxy.lane.sticky
    started = time.monotonic()
    first = route(runtime, "s", started)  # a new session: the policy places it (LaneGlue)
    finish(runtime, first[2], "ok", started + 0.01)
    route(runtime, "s", started + 1)  # its first hit: kept here (the replica's kept decision made on first use)
    assert (sticky.hits, sticky.answers) == (1, 0)  # a new session's turn is measured: LaneGlue records it
    then = started + 5.5
    kept = route(runtime, "s", then)
    assert sticky.hits == 2 and decision(kept)[5].value == "kept" and decision(kept)[4] == decision(first)[4]
    assert runtime.balancer.policy.table.used("s", then) == math.ceil(then * 1000) / 1000
    assert runtime.replicas.get(decision(kept)[4]).inflight == 2 and runtime.http_proxy.answering == 2
    finish(runtime, kept[2], "ok", then + 0.02)
    assert sticky.answers == 1 and runtime.replicas.total_inflight() == 1 and runtime.http_proxy.answering == 1
    assert runtime.balancer.policy.counters.affinity_kept == 2


@no_lane_failures()
def test_the_sticky_hit_declines_what_it_does_not_decide():
    runtime = router(sticky=True)
    sticky = runtime.http_proxy.lane.sticky
    now = time.monotonic()
    for token in [route(runtime, "s", now)[2], route(runtime, "s", now)[2]]:  # a new pin, then its first hit
        finish(runtime, token, "ok", now)
    runtime.balancer.policy.configure(LiveConfig(margin=0))
    held = route(runtime, "s", now)  # within the margin (every replica idle): kept here, and held
    assert sticky.hits == 2  # (its first hit was kept here too)
    moved = route(runtime, "s", now)  # its replica one ahead of the least loaded: the policy breaks the pin
    assert decision(moved)[5].value == "broken" and sticky.hits == 2
    for token in (held[2], moved[2]):
        finish(runtime, token, "ok", now)
    hits = sticky.hits
    runtime.balancer.policy.configure(LiveConfig(margin=None, full_determinism=True))  # every pin kept: here
    for _ in range(2):
        finish(runtime, route(runtime, "s", now)[2], "ok", now)
    assert sticky.hits == hits + 2
    runtime.balancer.policy.configure(LiveConfig(margin=None))
    hits = sticky.hits
    runtime.rl.paused = True  # paused: LaneGlue declines too, and the Python path waits its turn
    assert route(runtime, "s", now) is None
    runtime.rl.paused = False
    finish(runtime, route(runtime, "s", now + 3601)[2], "ok", now)  # idle past the TTL by the lane's clock
    for policy in ("cost_affinity", "consistent_hash"):  # another policy (one keeping every pin too): its own rule
        runtime.balancer.apply(policy, LiveConfig())
        for _ in range(3):
            finish(runtime, route(runtime, "s", now)[2], "ok", now)
    runtime.balancer.apply("affinity", LiveConfig())
    finish(runtime, route(runtime, "s", now)[2], "ok", now)  # a new pin (the policy changed)
    runtime.replicas.mark_down(URLS[0], 30)  # a replica down, its time over by the lane's clock: the Python path
    finish(runtime, route(runtime, "s", now + 31)[2], "ok", now + 31)  # brings it back (``ReplicaSet.loads``)
    assert sticky.hits == hits
    assert runtime.replicas.total_inflight() == 0


@no_lane_failures()
def test_a_reload_reaches_the_sticky_hits_next_request():
    """New settings (``Runtime.apply``): the next request meets them, not the sticky hit's copy of the old ones."""
    runtime = router(sticky=True)
    sticky = runtime.http_proxy.lane.sticky
    now = time.monotonic()
    for _ in range(3):  # a pin, then two hits kept here
        finish(runtime, route(runtime, "ss", now)[2], "ok", now)
    assert sticky.hits == 2
    session = runtime.settings.session.model_copy(update={"max_key_bytes": 1})
    runtime.apply(runtime.settings.model_copy(update={"session": session}))
    assert route(runtime, "ss", now) is None  # a key longer than maxKeyBytes now: the Python path answers it (400)
    assert sticky.hits == 2 and runtime.replicas.total_inflight() == 0


@no_lane_failures()
@pytest.mark.parametrize("sticky", [True, False])
def test_an_answer_recorded_after_its_replica_failed_its_http_probe_leaves_its_grpc_load_right(sticky):
    """Out of the HTTP index (its HTTP probe failed) but in the gRPC one: the answer's end moves its gRPC load."""
    runtime = router(sticky, replicas=1)  # one replica, with a gRPC target
    now = time.monotonic()
    tokens = [route(runtime, "s", now)[2] for _ in range(3)]  # a pin, its first hit, a sticky hit
    for token in tokens[:2]:
        finish(runtime, token, "ok", now)
    replica = tokens[2].replica
    assert replica.grpc_target is not None and runtime.replicas.loads(grpc=True)[replica.id] == 1
    runtime.replicas.set_healthy(replica.id, False)
    finish(runtime, tokens[2], "ok", now)
    assert replica.inflight == 0 and runtime.replicas.loads(grpc=True)[replica.id] == 0
    assert replica.id not in runtime.replicas.loads()
    assert runtime.http_proxy.lane.sticky.answers == (2 if sticky else 0)


@no_lane_failures()
def test_a_load_past_the_small_ints_moved_after_a_settle_is_kept_as_filed():
    """The load a replica was filed at, an int the index alone held, stays alive when the answer's end replaces it
    (the lane keeps its own reference: it once passed a borrowed one, freed by the replacement, and the loads read
    back garbage)."""
    runtime = router(sticky=True, replicas=1)
    url = URLS[0]
    runtime.replicas.set_external(url, 300)
    now = time.monotonic()
    tokens = [route(runtime, "s", now)[2] for _ in range(4)]  # a pin, its first hit, two sticky hits
    for token in tokens[:2]:
        finish(runtime, token, "ok", now)
    loads = runtime.replicas.loads()
    assert loads.min() == 302  # filed at 302
    finish(runtime, tokens[2], "ok", now)
    assert loads[url] == 301
    finish(runtime, tokens[3], "ok", now)
    assert loads[url] == 300 and loads.min() == 300 and loads.total() == 300


@no_lane_failures()
def test_a_router_leaving_its_fleet_stops_the_sticky_hit_at_its_next_request():
    """SIGTERM with peers (``Fleet.stop_owning``): this router owns no key any more, so its next request is the
    coroutine path's (which sends it to the key's new owner), not a sticky hit on the pin it still holds."""
    from rollout_router.fleet.node import Fleet
    from rollout_router.settings import FleetSettings

    runtime = router(sticky=True)
    runtime.fleet = Fleet(runtime.replicas, runtime.balancer, runtime.clock, FleetSettings(), lambda: None,
                          "http://127.0.0.1:1", "http://127.0.0.1:2", None, lambda: None)
    runtime.changes.bump()  # as the router does when it starts its fleet
    sticky = runtime.http_proxy.lane.sticky
    now = time.monotonic()
    for _ in range(3):  # a pin, then two hits kept here
        finish(runtime, route(runtime, "ss", now)[2], "ok", now)
    assert sticky.hits == 2
    runtime.fleet.stop_owning()
    assert route(runtime, "ss", now) is None  # LaneGlue declines too: the coroutine path asks the new owner
    assert sticky.hits == 2 and runtime.replicas.total_inflight() == 0
