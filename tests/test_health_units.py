"""Replica health without sockets: ejection lengths and limits on a fake clock, and ``Policy.forget``."""
from __future__ import annotations

import pytest

from rollout_router.health import OutlierDetector
from rollout_router.policy import AffinityPolicy, Outcome, Request, create
from rollout_router.replicas import ReplicaSet
from rollout_router.settings import HealthSettings


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def detector(replicas: int = 4, **health):
    clock = Clock()
    fleet = ReplicaSet(clock)
    for index in range(replicas):
        fleet.add(f"r{index}")
    ejected: list[tuple[str, str]] = []
    settings = HealthSettings(**{"consecutive_failures": 2, "base_ejection_seconds": 10,
                                 "max_ejection_seconds": 25, **health})
    return OutlierDetector(fleet, lambda: settings, lambda *event: ejected.append(event), clock), fleet, clock, ejected


def fail_until_ejected(outliers, replica) -> None:
    while not outliers.failure(replica, "timeout"):
        pass


def test_ejections_grow_by_the_base_are_capped_and_end_on_time():
    outliers, fleet, clock, ejected = detector()
    replica = fleet.get("r0")
    lengths = []
    for _ in range(4):
        fail_until_ejected(outliers, replica)
        lengths.append(replica.ejected_until - clock.now)
        assert "r0" not in fleet.loads()
        clock.now = replica.ejected_until  # back as soon as it is over, with no time to decay
        assert "r0" in fleet.loads()
    assert lengths == [10, 20, 25, 25] and ejected == [("r0", "timeout")] * 4


def test_the_multiplier_decays_while_the_replica_behaves():
    outliers, fleet, clock, _ = detector()
    replica = fleet.get("r0")
    for _ in range(2):
        fail_until_ejected(outliers, replica)
        clock.now = replica.ejected_until
    clock.now += 10  # one base period back in rotation: one step down
    fail_until_ejected(outliers, replica)
    assert replica.ejected_until - clock.now == 20


def test_failures_while_ejected_neither_extend_nor_count():
    outliers, fleet, clock, ejected = detector()
    replica = fleet.get("r0")
    fail_until_ejected(outliers, replica)
    until = replica.ejected_until
    for _ in range(5):
        assert not outliers.failure(replica, "timeout")
    assert replica.ejected_until == until and replica.failures == 0 and len(ejected) == 1


@pytest.mark.parametrize("replicas, percent, allowed", [(4, 50, 2), (3, 50, 1), (1, 100, 1), (1, 50, 0),
                                                        (10, 10, 1), (5, 0, 0)])
def test_max_ejection_percent(replicas, percent, allowed):
    outliers, fleet, _, _ = detector(replicas, max_ejection_percent=percent)
    for replica in fleet.replicas():
        for _ in range(3):
            outliers.failure(replica, "invalid_response")
    assert fleet.ejected() == allowed and len(fleet.loads()) == replicas - allowed


def test_a_replica_held_back_by_the_limit_goes_as_soon_as_room_frees():
    outliers, fleet, clock, _ = detector(2, max_ejection_percent=50)
    first, second = fleet.get("r0"), fleet.get("r1")
    fail_until_ejected(outliers, first)
    assert not outliers.failure(second, "timeout") and not outliers.failure(second, "timeout")
    clock.now = first.ejected_until
    assert outliers.failure(second, "timeout")  # its streak was kept: the next failure ejects it


def test_why_unroutable_names_each_cause():
    clock = Clock()
    fleet = ReplicaSet(clock)
    for replica in ("a", "b", "c", "d"):
        fleet.add(replica)
    fleet.eject(fleet.get("a"), 5)
    fleet.set_healthy("b", False)
    fleet.mark_down("c", 5)
    assert [fleet.why_unroutable(r) for r in "abcde"] == ["ejected", "unhealthy", "down", "routable", "removed"]
    assert fleet.why_unroutable("d", grpc=True) == "no_grpc"


LOADS = {"r0": 0, "r1": 0}


def test_forget_drops_a_new_sessions_pin():
    policy = AffinityPolicy()
    decision = policy.route(Request("s", LOADS))
    policy.forget("s", decision, 0.0)
    assert policy.sessions() == 0 and policy.counters.new_sessions == 1 and policy.counters.released == 0


def test_forget_puts_a_moved_session_back_and_leaves_a_kept_one():
    policy = AffinityPolicy(margin=0)
    first = policy.route(Request("s", LOADS)).replica
    broken = policy.route(Request("s", {**LOADS, first: 3}))
    assert broken.outcome is Outcome.BROKEN
    policy.forget("s", broken, 1.0)
    assert policy.table.get("s", 1.0) == first
    kept = policy.route(Request("s", LOADS))
    policy.forget("s", kept, 2.0)
    assert policy.table.get("s", 2.0) == first
    other = next(r for r in LOADS if r != first)
    repinned = policy.route(Request("s", {other: 0}))
    policy.forget("s", repinned, 3.0)
    assert policy.table.get("s", 3.0) == first


def test_forget_leaves_a_pin_another_request_has_moved_since():
    policy = AffinityPolicy(margin=0)
    first = policy.route(Request("s", LOADS))
    other = next(r for r in LOADS if r != first.replica)
    policy.route(Request("s", {other: 0}))  # a concurrent turn re-pinned it
    policy.forget("s", first, 1.0)
    assert policy.table.get("s", 1.0) == other


@pytest.mark.parametrize("name", ["consistent_hash", "least_loaded", "round_robin", "power_of_two"])
def test_every_policy_takes_forget(name):
    policy = create(name)
    decision = policy.route(Request("s", LOADS))
    policy.forget("s", decision, 0.0)
    assert policy.sessions() == 0


def test_a_streak_of_5xx_answers_ejects_and_any_other_answer_resets_it():
    """health.consecutive5xx (Envoy's consecutive_5xx): a replica answering 500 to everything goes out."""
    outliers, fleet, _, ejected = detector(consecutive_5xx=3)
    replica = fleet.get("r0")
    for status in (500, 503, 404, 500, 502):  # the 404 is an answer of the replica's: the streak starts over
        assert not outliers.answered(replica, status)
    assert outliers.answered(replica, 500)  # the third in a row
    assert "r0" not in fleet.loads() and ejected == [("r0", "http_5xx")] and replica.server_errors == 0


def test_5xx_ejection_off_and_bounded_by_max_ejection_percent():
    off, fleet, _, ejected = detector(consecutive_5xx=0)
    assert not any(off.answered(fleet.get("r0"), 500) for _ in range(50)) and not ejected
    bounded, fleet, _, ejected = detector(replicas=2, consecutive_5xx=1)  # 50%: one of two at most
    assert bounded.answered(fleet.get("r0"), 500)
    assert not bounded.answered(fleet.get("r1"), 500) and "r1" in fleet.loads()
