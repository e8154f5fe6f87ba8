"""The pure policy: the margin rule, placement, sessions table, counters."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollout_router.core.kept import kept
from rollout_router.policy import (
    AffinityPolicy,
    Counters,
    LiveConfig,
    NoReplicaError,
    Outcome,
    Request,
    SessionTable,
    create,
    rendezvous,
)
from rollout_router.policy.hashing import tie_break
from rollout_router.replicas import ReplicaSet
from rollout_router.settings import SettingsError, parse_settings

R = ["r0", "r1", "r2", "r3"]


def route(policy, key, loads, now=0.0):
    return policy.route(Request(key, loads, now))


def test_default_margin_null_never_breaks_affinity():
    policy = AffinityPolicy()
    first = route(policy, "s", dict.fromkeys(R, 0)).replica
    for skew in range(1, 50):
        loads = {r: 0 for r in R} | {first: skew}
        assert route(policy, "s", loads).outcome is Outcome.KEPT
    assert policy.counters.affinity_broken == 0 and policy.counters.affinity_kept == 49


@pytest.mark.parametrize("margin", [0, 1, 2, 5])
def test_margin_boundary_skew_equal_keeps_and_one_more_breaks(margin):
    policy = AffinityPolicy(margin=margin)
    pinned = route(policy, "s", dict.fromkeys(R, 0)).replica
    base = {r: 3 for r in R}
    keep = route(policy, "s", base | {pinned: 3 + margin})
    assert keep.outcome is Outcome.KEPT and keep.replica == pinned
    broken = route(policy, "s", base | {pinned: 3 + margin + 1})
    assert broken.outcome is Outcome.BROKEN and broken.replica != pinned and broken.previous == pinned
    assert policy.counters.affinity_kept == 1 and policy.counters.affinity_broken == 1
    assert route(policy, "s", dict.fromkeys(R, 0)).replica == broken.replica  # re-pinned


def test_margin_zero_moves_unless_already_least_loaded():
    policy = AffinityPolicy(margin=0)
    pinned = route(policy, "s", dict.fromkeys(R, 0)).replica
    others = [r for r in R if r != pinned]
    tied = {r: 1 for r in R}  # pinned is one of the least-loaded: kept
    assert route(policy, "s", tied).outcome is Outcome.KEPT
    moved = route(policy, "s", {pinned: 1} | {r: 0 if r == others[1] else 1 for r in others})
    assert moved.outcome is Outcome.BROKEN and moved.replica == others[1]


def test_repin_target_is_least_loaded():
    policy = AffinityPolicy(margin=0)
    pinned = route(policy, "s", dict.fromkeys(R, 0)).replica
    loads = {r: 9 for r in R} | {pinned: 10}
    low = next(r for r in R if r != pinned)
    loads[low] = 2
    assert route(policy, "s", loads).replica == low


def test_new_sessions_go_least_loaded_and_ties_spread_by_key():
    policy = AffinityPolicy()
    assert route(policy, "a", {"r0": 3, "r1": 1, "r2": 1}).replica in {"r1", "r2"}
    placed = {route(policy, f"k{i}", dict.fromkeys(R, 0)).replica for i in range(40)}
    assert placed == set(R)  # a tie-break by key, not "the first replica"
    again = AffinityPolicy()
    assert all(route(again, f"k{i}", dict.fromkeys(R, 0)).replica == tie_break(f"k{i}", sorted(R)) for i in range(40))


def test_removed_replica_repins_on_next_request():
    policy = AffinityPolicy(margin=None)
    pinned = route(policy, "s", dict.fromkeys(R, 0)).replica
    remaining = {r: 0 for r in R if r != pinned}
    decision = route(policy, "s", remaining)
    assert decision.outcome is Outcome.REPINNED and decision.replica in remaining and decision.previous == pinned
    assert policy.counters.repinned_replica_gone == 1


def test_full_determinism_ignores_load_and_margin():
    policy = AffinityPolicy(margin=0, full_determinism=True)
    for i in range(20):
        loads = {r: (i * 7 + j) % 5 for j, r in enumerate(R)}
        assert route(policy, f"k{i}", loads).replica == rendezvous(f"k{i}", R)
    pinned = rendezvous("k0", R)
    assert route(policy, "k0", {r: 0 for r in R} | {pinned: 100}).outcome is Outcome.KEPT


def test_unkeyed_requests_go_least_loaded_and_pin_nothing():
    policy = AffinityPolicy(margin=0)
    assert route(policy, None, {"r0": 2, "r1": 0, "r2": 5}).replica == "r1"
    spread = {route(policy, None, dict.fromkeys(R, 0)).replica for _ in range(40)}
    assert spread == set(R)
    assert policy.sessions() == 0 and policy.counters.unkeyed == 41


def test_no_replica_raises():
    with pytest.raises(NoReplicaError):
        route(AffinityPolicy(), "s", {})


def test_lru_eviction_and_idle_ttl():
    policy = AffinityPolicy(max_sessions=2, idle_ttl=10)
    loads = dict.fromkeys(R, 0)
    route(policy, "a", loads, now=0)
    route(policy, "b", loads, now=1)
    route(policy, "a", loads, now=2)  # a is now most recently used
    route(policy, "c", loads, now=3)  # evicts b
    assert {k for k, _ in policy.table} == {"a", "c"} and policy.counters.evicted_lru == 1
    assert route(policy, "a", loads, now=12.5).outcome is Outcome.NEW  # idle 10.5 s > 10: expired
    assert policy.counters.expired_idle == 1
    assert policy.table.expire(now=100) == 2 and policy.sessions() == 0


def test_release_drops_a_pin():
    policy = AffinityPolicy()
    route(policy, "s", dict.fromkeys(R, 0))
    assert policy.release("s") and not policy.release("s")
    assert policy.counters.released == 1 and policy.sessions() == 0


def test_live_reconfigure_keeps_pins():
    policy = AffinityPolicy()
    pins = {f"s{i}": route(policy, f"s{i}", dict.fromkeys(R, 0)).replica for i in range(10)}
    policy.configure(LiveConfig(margin=2, full_determinism=False))
    assert dict(policy.table) == pins and policy.margin == 2


@pytest.mark.parametrize("bad", [-1, -0.5, float("inf"), float("nan"), True, "2"])  # 1.5 is a margin now (verl takes any)
def test_invalid_margin_rejected(bad):
    with pytest.raises(ValueError, match="affinity_break_margin"):
        AffinityPolicy(margin=bad)
    with pytest.raises(SettingsError, match="affinityBreakMargin"):
        parse_settings({"affinityBreakMargin": bad})


@pytest.mark.parametrize("data, field", [
    ({"session": {"maxSessions": 0}}, "session.maxSessions"),
    ({"session": {"idleTimeoutSeconds": -5}}, "session.idleTimeoutSeconds"),
    ({"backends": ["127.0.0.1:8000"]}, "backends"),
    ({"policy": "fastest"}, "policy"),
    ({"connectRetries": -1}, "connectRetries"),
])
def test_invalid_settings_name_the_field(data, field):
    with pytest.raises(SettingsError, match=field.replace(".", r"\.")):
        parse_settings(data)


def test_unknown_policy_name():
    with pytest.raises(ValueError, match="unknown policy"):
        create("fastest")


# --- properties -------------------------------------------------------------------------

ops = st.lists(st.one_of(
    st.tuples(st.just("route"), st.sampled_from(["a", "b", "c", "d", "e", None])),
    st.tuples(st.just("finish"), st.integers(0, 30)),
    st.tuples(st.just("add"), st.sampled_from(R)),
    st.tuples(st.just("remove"), st.sampled_from(R)),
), max_size=80)


@settings(max_examples=300, deadline=None)
@given(ops=ops, margin=st.one_of(st.none(), st.integers(0, 4)))
def test_random_traffic_keeps_accounting_exact_and_obeys_the_margin(ops, margin):
    replicas, policy = ReplicaSet(clock=lambda: 0.0), AffinityPolicy(margin=margin)
    for r in R[:2]:
        replicas.add(r)
    leases = []
    for op, arg in ops:
        if op == "route":
            loads = replicas.loads()
            if not loads:
                continue
            pinned = policy.table.get(arg, 0.0) if arg else None
            decision = policy.route(Request(arg, loads, 0.0))
            _check_rule(decision, pinned, loads, margin)
            leases.append(replicas.acquire(decision.replica))
        elif op == "finish" and leases:
            lease = leases.pop(arg % len(leases))
            lease.release()
            lease.release()  # a second release is a no-op
        elif op == "add":
            replicas.add(arg)
        elif op == "remove":
            replicas.remove(arg)
        assert all(r.inflight >= 0 for r in replicas.replicas())
        assert replicas.total_inflight() == len(leases)
    for lease in leases:
        lease.release()
    assert replicas.total_inflight() == 0 and all(r.inflight == 0 for r in replicas.replicas())


def _check_rule(decision, pinned, loads, margin):
    low = min(loads.values())
    if pinned is None:
        assert decision.outcome in (Outcome.NEW, Outcome.UNKEYED) and loads[decision.replica] == low
    elif pinned not in loads:
        assert decision.outcome is Outcome.REPINNED and loads[decision.replica] == low
    elif margin is None or loads[pinned] - low <= margin:
        assert decision.outcome is Outcome.KEPT and decision.replica == pinned
    else:
        assert decision.outcome is Outcome.BROKEN and loads[decision.replica] == low


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=30),
       removed=st.sampled_from(R))
def test_rendezvous_moves_only_keys_of_a_removed_replica(keys, removed):
    remaining = [r for r in R if r != removed]
    for key in keys:
        before = rendezvous(key, R)
        if before != removed:
            assert rendezvous(key, remaining) == before


@settings(max_examples=200, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from("abc"), st.floats(0, 50)), max_size=30),
       ttl=st.none() | st.floats(0.5, 20))
def test_a_sticky_hit_is_get_then_keep(steps, ttl):
    """``core.kept`` (the sticky hit of the policy and of the native lane), keeping every routable pin, then
    ``get`` where it declines (as ``AffinityPolicy.decide`` does), leaves the table as ``get`` then ``keep``
    would: the same answers, pins, last uses, LRU order and expiry counts, whatever the keys, times and TTL."""
    counted, fused = Counters(), Counters()
    apart, together = SessionTable(counted, idle_ttl=ttl), SessionTable(fused, idle_ttl=ttl)
    now = 0.0
    for key, wait in steps:
        now += wait
        found = apart.get(key, now)
        if found is not None:
            apart.keep(key, now)
        hit = kept(together, {"r0": 0}, key, now, None)
        assert hit == found
        if hit is None:
            together.get(key, now)  # the policy's next step: an idle pin expires, counted
        if found is None:  # a new pin, on both
            apart.pin(key, "r0", now)
            together.pin(key, "r0", now)
        assert apart.held(now) == together.held(now)
        assert [apart.age(k, now) for k in "abc"] == [together.age(k, now) for k in "abc"]
    assert counted.expired_idle == fused.expired_idle


@settings(max_examples=200, deadline=None)
@given(used=st.floats(0, 1e7), ttl=st.floats(0.01, 1e5))
def test_a_pin_never_expires_before_its_idle_timeout(used, ttl):
    """Pins store their last use in milliseconds, rounded up: late by under a millisecond, never early."""
    table = SessionTable(Counters(), idle_ttl=ttl)
    table.pin("k", "r0", used)
    assert table.get("k", used + ttl - 1e-6) == "r0"  # (1e-6: float rounding of the sum itself)
    assert table.get("k", used + ttl + 0.002) is None
