"""GRPO siblings together: a new session with a group key is placed beside its group (policy/groups.py)."""
from __future__ import annotations

import pytest

from rollout_router.policy import AffinityPolicy, Counters, LiveConfig, Outcome, Request, create, rendezvous
from rollout_router.policy.groups import GroupTable

R = ["r0", "r1", "r2", "r3"]


def new(policy, key, loads, group="g"):
    return policy.route(Request(key, loads, 0.0, group=group))


def test_siblings_follow_the_first_member_while_within_the_margin():
    policy = AffinityPolicy(margin=2)
    first = new(policy, "s0", dict.fromkeys(R, 0)).replica
    loads = dict.fromkeys(R, 0) | {first: 2}  # skew 2 == margin: together
    second = new(policy, "s1", loads)
    assert second.replica == first and second.outcome is Outcome.NEW
    assert policy.counters.group_colocated == 1 and policy.counters.group_spilled == 0
    assert policy.counters.new_sessions == 2


def test_a_member_beyond_the_margin_spills_least_loaded_and_the_group_follows_it():
    policy = AffinityPolicy(margin=2)
    first = new(policy, "s0", dict.fromkeys(R, 0)).replica
    spill_to = next(r for r in R if r != first)
    loads = dict.fromkeys(R, 1) | {first: 4, spill_to: 0}  # skew 4 > 2
    spilled = new(policy, "s1", loads)
    assert spilled.replica == spill_to and policy.counters.group_spilled == 1
    third = new(policy, "s2", dict.fromkeys(R, 1) | {first: 0})  # first is least-loaded now, but the group moved
    assert third.replica == spill_to and policy.counters.group_colocated == 1


def test_null_margin_keeps_a_group_together_whatever_the_load():
    policy = AffinityPolicy(margin=None)
    first = new(policy, "s0", dict.fromkeys(R, 0)).replica
    for i in range(1, 16):
        assert new(policy, f"s{i}", dict.fromkeys(R, 0) | {first: 100 * i}).replica == first
    assert policy.counters.group_colocated == 15 and policy.counters.group_spilled == 0


def test_margin_zero_joins_only_while_the_group_replica_is_least_loaded():
    policy = AffinityPolicy(margin=0)
    first = new(policy, "s0", dict.fromkeys(R, 0)).replica
    assert new(policy, "s1", dict.fromkeys(R, 1)).replica == first  # tied for least: together
    assert new(policy, "s2", dict.fromkeys(R, 1) | {first: 2}).replica != first
    assert (policy.counters.group_colocated, policy.counters.group_spilled) == (1, 1)


def test_later_turns_follow_their_own_pin_not_the_group():
    policy = AffinityPolicy(margin=2)
    first = new(policy, "s0", dict.fromkeys(R, 0)).replica
    other = next(r for r in R if r != first)
    assert new(policy, "s1", dict.fromkeys(R, 0) | {first: 5}).replica != first  # s1 spilled
    s1 = policy.pinned("s1", 0.0)
    turn = new(policy, "s1", dict.fromkeys(R, 0) | {other: 0})  # a later turn: its own pin, kept
    assert turn.outcome is Outcome.KEPT and turn.replica == s1
    broken = new(policy, "s1", dict.fromkeys(R, 0) | {s1: 3})  # its own margin moves it
    assert broken.outcome is Outcome.BROKEN
    assert (policy.counters.group_colocated, policy.counters.group_spilled) == (0, 1)  # turns are not group moves


def test_without_a_group_key_placement_is_unchanged():
    grouped, plain = AffinityPolicy(margin=2), AffinityPolicy(margin=2)
    for i in range(20):
        loads = {r: (i * 7 + j) % 5 for j, r in enumerate(R)}
        assert grouped.route(Request(f"s{i}", loads)).replica == plain.route(Request(f"s{i}", loads)).replica
    assert grouped.counters.as_dict() == plain.counters.as_dict()


def test_a_group_whose_replica_left_spills():
    policy = AffinityPolicy(margin=None)
    first = new(policy, "s0", dict.fromkeys(R, 0)).replica
    rest = {r: 0 for r in R if r != first}
    assert new(policy, "s1", rest).replica in rest and policy.counters.group_spilled == 1


def test_unkeyed_members_are_placed_together_and_pin_nothing():
    policy = AffinityPolicy(margin=None)
    first = new(policy, None, dict.fromkeys(R, 0))
    second = new(policy, None, dict.fromkeys(R, 0) | {first.replica: 3})
    assert second.replica == first.replica and second.outcome is Outcome.UNKEYED
    assert policy.sessions() == 0 and policy.counters.unkeyed == 2 and policy.counters.group_colocated == 1


def test_full_determinism_places_members_by_the_group_key():
    policy = AffinityPolicy(margin=2, full_determinism=True)
    for i in range(6):
        loads = dict.fromkeys(R, 0) | {R[i % 4]: 50}
        assert new(policy, f"s{i}", loads, group="prompt-7").replica == rendezvous("prompt-7", R)
    assert policy.counters.group_colocated == 5


def test_the_group_map_is_bounded_lru():
    counters = Counters()
    table = GroupTable(counters, max_groups=2)
    loads = dict.fromkeys(R, 0)
    table.place("a", loads, "r0", None)
    table.place("b", loads, "r1", None)
    table.place("a", loads, "r2", None)  # a is the most recent now (kept on r0)
    table.place("c", loads, "r3", None)  # evicts b
    assert len(table) == 2
    assert table.place("b", loads, "r2", None) == "r2"  # b is new again: its first member founds it anew
    assert (counters.group_colocated, counters.group_spilled) == (1, 0)
    table.resize(1)
    assert len(table) == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10"])
def test_max_groups_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="max_groups"):
        AffinityPolicy(max_groups=bad)


def test_live_config_bounds_the_group_map_and_release_all_drops_groups():
    policy = create("affinity")
    policy.configure(LiveConfig(margin=None, max_groups=3))
    for g in range(5):
        new(policy, f"s{g}", dict.fromkeys(R, 0), group=f"g{g}")
    assert len(policy.groups) == 3
    assert policy.release_all() == 5  # the pins; the groups go too
    assert len(policy.groups) == 0


@pytest.mark.parametrize("name", ["cost_affinity", "affinity_adaptive"])
def test_the_affinity_refinements_place_groups_too(name):
    policy = create(name, margin=2)
    first = new(policy, "s0", dict.fromkeys(R, 0)).replica
    assert new(policy, "s1", dict.fromkeys(R, 0) | {first: 1}).replica == first
    assert policy.counters.group_colocated == 1
