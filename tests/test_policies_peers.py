"""Peer policies behind the Policy interface."""
from __future__ import annotations

import pytest

from rollout_router.policy import registry
from rollout_router.policy.base import LiveConfig, Outcome, Policy, Request

R = ["a", "b", "c", "d"]


def loads(*xs):
    return dict(zip(R, xs))


@pytest.mark.parametrize("name", ["dual_threshold", "cache_aware", "consistent_hash", "power_of_two", "affinity_adaptive"])
def test_registered_and_protocol(name):
    p = registry.create(name)
    assert isinstance(p, Policy) and p.name == name
    d = p.route(Request("k", loads(0, 0, 0, 0)))
    assert d.replica in R


def test_dual_threshold_keeps_while_balanced_and_moves_everyone_when_imbalanced():
    p = registry.create("dual_threshold", abs_threshold=4, rel_threshold=1.05)
    first = p.route(Request("s", loads(0, 0, 0, 0))).replica
    bal = {r: (4 if r == first else 1) for r in R}  # max - min = 3 <= 4: balanced
    assert p.route(Request("s", bal)).outcome is Outcome.KEPT
    # imbalance elsewhere (another replica is crowded) still breaks this session: the gate is global
    other = next(r for r in R if r != first)
    imb = {r: 3 for r in R}
    imb[other], imb[first] = 10, 5
    d = p.route(Request("s", imb))
    assert d.outcome is Outcome.BROKEN and d.replica not in (first, other)
    # a session already on the least-loaded replica stays
    assert p.route(Request("s", {r: (0 if r == d.replica else 9) for r in R})).outcome is Outcome.KEPT


def test_dual_threshold_rel_gate():
    p = registry.create("dual_threshold", abs_threshold=4, rel_threshold=2.0)
    first = p.route(Request("s", loads(0, 0, 0, 0))).replica
    current = {r: 10 for r in R}
    current[first] = 16  # diff 6 > 4 but 16 < 2 * 10
    assert p.route(Request("s", current)).outcome is Outcome.KEPT


def test_cache_aware_follows_prefix_then_balances():
    p = registry.create("cache_aware", cache_threshold=0.3, balance_abs_threshold=64, balance_rel_threshold=1.5)
    a = p.route(Request("x", loads(0, 0, 0, 0), prefix=[1, 2, 3, 4]))
    assert a.outcome is Outcome.NEW
    b = p.route(Request("y", loads(0, 0, 0, 0), prefix=[1, 2, 3, 4, 5, 6]))  # 4/6 matched > 0.3
    assert b.outcome is Outcome.NEW and b.replica == a.replica  # a new session, placed by the cache match
    again = p.route(Request("x", loads(0, 0, 0, 0), prefix=[1, 2, 3, 4, 9]))
    assert again.outcome is Outcome.KEPT and again.replica == a.replica
    c = p.route(Request("z", loads(0, 0, 0, 0), prefix=[9, 8, 7]))  # no match: smallest tree
    assert c.outcome is Outcome.NEW and c.replica != a.replica
    hot = {r: (100 if r == a.replica else 0) for r in R}  # 100 - 0 > 64 and 100 > 1.5 * 0
    d = p.route(Request("y", hot, prefix=[1, 2, 3, 4, 5, 6, 7]))
    assert d.outcome is Outcome.BROKEN and d.replica != a.replica and d.previous == a.replica


def test_cache_aware_tree_is_bounded():
    p = registry.create("cache_aware", max_tree_size=5)
    for i in range(10):
        p.route(Request(None, {"a": 0}, prefix=[i * 100 + j for j in range(3)]))
    assert len(p._trees["a"]) <= 5


def test_consistent_hash_bounded_loads_spills_deterministically():
    p = registry.create("consistent_hash", load_factor=1.25)
    home = p.route(Request("k", loads(0, 0, 0, 0))).replica
    assert p.route(Request("k", loads(0, 0, 0, 0))).outcome is Outcome.KEPT
    full = {r: (5 if r == home else 1) for r in R}  # cap = ceil(1.25 * 9 / 4) = 3
    spill1 = p.route(Request("k", full))
    assert spill1.outcome is Outcome.BROKEN and spill1.replica != home
    q = registry.create("consistent_hash", load_factor=1.25)
    q.route(Request("k", loads(0, 0, 0, 0)))
    assert q.route(Request("k", full)).replica == spill1.replica  # same spill target in a fresh router
    # loads never exceed the cap after placement
    for trial in range(50):
        current = {r: (trial * 7 + i * 3) % 6 for i, r in enumerate(R)}
        cap = -(-1.25 * (sum(current.values()) + 1) // 4)
        assert current[p.route(Request(f"s{trial}", current)).replica] + 1 <= cap


def test_power_of_two_is_seeded_and_prefers_lighter():
    def seq(seed: int) -> list[str]:
        return [registry.create("power_of_two", seed=seed).route(Request("k", loads(0, 0, 0, 0))).replica
                for _ in range(1)]
    assert seq(3) == seq(3)
    p = registry.create("power_of_two", seed=1)
    picks = [p.route(Request(None, loads(9, 0, 9, 9))).replica for _ in range(200)]
    assert picks.count("b") > 60  # b wins whenever sampled (prob 1/2), never loses
    assert all(r in R for r in picks)


def test_adaptive_affinity_defaults_equal_affinity():
    a = registry.create("affinity", margin=2)
    b = registry.create("affinity_adaptive", margin=2)
    seq = [loads(0, 0, 0, 0), loads(3, 0, 1, 0), loads(5, 1, 0, 2), loads(0, 4, 4, 4)]
    for i, current in enumerate(seq * 3):
        assert a.route(Request(f"s{i % 3}", current)) == b.route(Request(f"s{i % 3}", current))


def test_adaptive_affinity_context_margin_and_cooldown():
    p = registry.create("affinity_adaptive", margin=2, context_scale=100)
    first = p.route(Request("s", loads(0, 0, 0, 0), prefix=range(500))).replica
    skew = {r: (6 if r == first else 0) for r in R}
    assert p.route(Request("s", skew, prefix=range(500))).outcome is Outcome.KEPT  # margin 2 + 5
    assert p.route(Request("s", skew, prefix=range(100))).outcome is Outcome.BROKEN  # margin 2 + 1
    c = registry.create("affinity_adaptive", margin=0, cooldown=10.0)
    first = c.route(Request("t", loads(0, 0, 0, 0), now=0.0)).replica
    skew = {r: (3 if r == first else 0) for r in R}
    assert c.route(Request("t", skew, now=5.0)).outcome is Outcome.KEPT
    moved = c.route(Request("t", skew, now=11.0))
    assert moved.outcome is Outcome.BROKEN
    back = {r: (3 if r == moved.replica else 0) for r in R}
    assert c.route(Request("t", back, now=12.0)).outcome is Outcome.KEPT  # no ping-pong within the cooldown


def test_create_rejects_unknown_options_naming_them():
    with pytest.raises(ValueError, match=r"takes no option 'margn'.*margin"):
        registry.create("affinity", margn=2)
    with pytest.raises(ValueError, match="takes no option 'margin'"):
        registry.create("least_loaded", margin=2)
    with pytest.raises(ValueError, match="unknown policy"):
        registry.create("afinity")


@pytest.mark.parametrize("name", ["least_loaded", "round_robin", "power_of_two"])
def test_stateless_policies_take_the_interface_defaults(name):
    p = registry.create(name)
    p.configure(LiveConfig(margin=1, max_sessions=5, idle_ttl=1.0))  # accepted, nothing to apply
    p.route(Request("k", loads(0, 0, 0, 0)))
    assert p.sessions() == 0 and p.release("k") is False and p.expire(1e9) == 0
    assert p.counters.unkeyed == 1 and p.counters.affinity_kept == p.counters.new_sessions == 0


@pytest.mark.parametrize("name", ["affinity", "consistent_hash", "cache_aware"])
def test_session_policies_count_the_same_thing(name):
    """kept = same replica as the previous turn; repinned = that replica left; new = first turn."""
    p = registry.create(name)
    first = p.route(Request("k", loads(0, 0, 0, 0), now=0.0))
    assert first.outcome is Outcome.NEW
    assert p.route(Request("k", loads(0, 0, 0, 0), now=1.0)).outcome is Outcome.KEPT
    rest = {r: 0 for r in R if r != first.replica}
    gone = p.route(Request("k", rest, now=2.0))
    assert gone.outcome is Outcome.REPINNED and gone.previous == first.replica
    counters = p.counters
    assert (counters.new_sessions, counters.affinity_kept, counters.repinned_replica_gone) == (1, 1, 1)
    assert p.sessions() == 1 and p.expire(2.0 + 3601) == 1 and p.sessions() == 0


@pytest.mark.parametrize("name", ["affinity", "consistent_hash", "cache_aware", "dual_threshold"])
def test_live_config_resizes_the_table_of_every_session_policy(name):
    p = registry.create(name)
    for i in range(6):
        p.route(Request(f"s{i}", loads(0, 0, 0, 0), now=float(i)))
    p.configure(LiveConfig(max_sessions=4, idle_ttl=10.0))
    assert p.sessions() == 4 and p.counters.evicted_lru == 2
    assert p.expire(5.0 + 10.5) == 4


@pytest.mark.parametrize("name", ["affinity", "consistent_hash", "least_loaded"])
def test_release_all_drops_every_pin_and_counts_it(name):
    p = registry.create(name)
    for i in range(3):
        p.route(Request(f"s{i}", loads(0, 0, 0, 0)))
    held = p.sessions()
    assert p.release_all() == held and p.sessions() == 0 and p.counters.released == held
