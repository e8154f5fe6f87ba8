"""cost_affinity: a margin that grows with the load and spares sessions whose last turn was short."""
from __future__ import annotations

import random

import pytest

from rollout_router.policy import registry
from rollout_router.policy.base import LiveConfig, Outcome, Request
from rollout_router.policy.cost_affinity import CostAffinityOptions

R = ["a", "b", "c", "d"]


def pin(policy, key="s", now=0.0):
    """Place ``key`` on an empty fleet at ``now``; its replica."""
    return policy.route(Request(key, dict.fromkeys(R, 0), now)).replica


def skewed(home, least, skew):
    """Loads where ``home`` carries ``skew`` more than the least-loaded replicas (at ``least``)."""
    return {r: least + skew if r == home else least for r in R}


def test_without_extras_it_decides_exactly_like_affinity():
    rng = random.Random(7)
    ours = registry.create("cost_affinity", margin=2, relative=0, min_turn_seconds=None)
    theirs = registry.create("affinity", margin=2)
    for _ in range(2000):
        key = f"s{rng.randrange(40)}"
        loads = {r: rng.randrange(12) for r in R}
        now = rng.random()
        assert ours.route(Request(key, loads, now)) == theirs.route(Request(key, loads, now))
    assert ours.counters == theirs.counters


def test_relative_part_grows_with_the_least_load():
    p = registry.create("cost_affinity", margin=2, relative=0.05, min_turn_seconds=None)
    home = pin(p)
    assert p.route(Request("s", skewed(home, 100, 7))).outcome is Outcome.KEPT  # 7 <= 2 + 0.05 x 100
    d = p.route(Request("s", skewed(home, 100, 8)))
    assert d.outcome is Outcome.BROKEN and d.previous == home
    q = registry.create("cost_affinity", margin=2, relative=0.05, min_turn_seconds=None)
    home = pin(q)
    assert q.route(Request("s", skewed(home, 10, 3))).outcome is Outcome.BROKEN  # 3 > 2 + 0.5


def test_a_session_whose_last_turn_was_short_keeps_its_pin():
    p = registry.create("cost_affinity", margin=0, relative=0, min_turn_seconds=40)
    home = pin(p, now=100.0)
    assert p.route(Request("s", skewed(home, 0, 9), 139.9)).outcome is Outcome.KEPT  # turn of 39.9 s: short
    # the clock of the last turn restarts at every routing, kept or moved
    assert p.route(Request("s", skewed(home, 0, 9), 170.0)).outcome is Outcome.KEPT  # 30.1 s after the last
    d = p.route(Request("s", skewed(home, 0, 1), 210.0))  # 40 s: long enough to pay for a move
    assert d.outcome is Outcome.BROKEN and d.previous == home
    assert p.route(Request("s", skewed(d.replica, 0, 9), 220.0)).outcome is Outcome.KEPT  # just moved: short
    assert p.route(Request("other", dict.fromkeys(R, 5), 220.0)).outcome is Outcome.NEW  # new sessions unaffected


def test_defaults_and_live_config():
    p = registry.create("cost_affinity")
    assert (p.margin, p.relative, p.min_turn_seconds) == (2, 0.01, 40.0)
    home = pin(p)
    p.configure(LiveConfig(margin=None, options=CostAffinityOptions(relative=0.0, min_turn_seconds=None)))
    assert p.route(Request("s", skewed(home, 0, 50), 100.0)).outcome is Outcome.KEPT  # null margin: sticky
    p.configure(LiveConfig(margin=3, options=CostAffinityOptions(relative=0.0, min_turn_seconds=None)))
    assert p.route(Request("s", skewed(home, 0, 3), 200.0)).outcome is Outcome.KEPT
    assert p.route(Request("s", skewed(home, 0, 4), 300.0)).outcome is Outcome.BROKEN
    assert p.sessions() == 1
    p.configure(LiveConfig(margin=3, full_determinism=True))
    assert p.route(Request("s", dict.fromkeys(R, 0) | {"a": 99}, 400.0)).outcome is Outcome.KEPT


@pytest.mark.parametrize("options, named", [
    ({"margin": True}, "margin"), ({"margin": -1}, "margin"), ({"margin": float("nan")}, "margin"),  # 1.5 is a margin now (verl takes any)
    ({"relative": -0.1}, "relative"), ({"relative": "0.1"}, "relative"), ({"relative": 11}, "relative"),
    ({"relative": True}, "relative"), ({"min_turn_seconds": -1}, "min_turn_seconds"),
    ({"min_turn_seconds": float("inf")}, "min_turn_seconds"), ({"min_turn_seconds": "40"}, "min_turn_seconds"),
])
def test_bad_options_are_rejected_naming_them(options, named):
    with pytest.raises(ValueError, match=named):
        registry.create("cost_affinity", **options)


def test_unknown_option_is_rejected():
    with pytest.raises(ValueError, match="takes no option 'kv_high'"):
        registry.create("cost_affinity", kv_high=0.9)


def test_router_settings_reach_the_policy_live():
    from rollout_router.balancer import Balancer
    from rollout_router.replicas import ReplicaSet
    from rollout_router.settings import SettingsError, parse_settings

    settings = parse_settings({"policy": "cost_affinity", "affinityBreakMargin": 1,
                               "costAffinity": {"relative": 0.05, "minTurnSeconds": 12.5}})
    balancer = Balancer(ReplicaSet(), settings.policy, settings.live_config())
    policy = balancer.policy
    assert (policy.name, policy.margin, policy.relative, policy.min_turn_seconds) == ("cost_affinity", 1, 0.05, 12.5)
    home = pin(policy)
    policy.route(Request("other", dict.fromkeys(R, 0)))
    balancer.apply("cost_affinity", parse_settings({"policy": "cost_affinity", "affinityBreakMargin": 1}).live_config())
    assert (policy.relative, policy.min_turn_seconds, policy.sessions()) == (0.01, 40.0, 2)  # defaults; pins kept
    assert policy.pinned("s", 0.0) == home
    for bad in ({"relative": -1}, {"minTurnSeconds": -2}, {"relativ": 0.1}, {"relative": "nan"},
                {"minTurnSeconds": "inf"}):
        with pytest.raises(SettingsError):
            parse_settings({"policy": "cost_affinity", "affinityBreakMargin": 2, "costAffinity": bad})


def test_cost_affinity_without_a_margin_is_refused_by_name():
    """A null margin would make cost_affinity sticky: a configuration nobody means, refused rather than obeyed."""
    from rollout_router.settings import SettingsError, parse_settings

    with pytest.raises(SettingsError, match="affinityBreakMargin: policy cost_affinity needs a number"):
        parse_settings({"policy": "cost_affinity"})
    with pytest.raises(SettingsError, match="affinityBreakMargin: policy cost_affinity needs a number"):
        parse_settings({"policy": "cost_affinity", "affinityBreakMargin": None})
    assert parse_settings({"policy": "cost_affinity", "fullDeterminism": True}).full_determinism  # margin ignored
    assert parse_settings({"policy": "cost_affinity", "affinityBreakMargin": 0}).affinity_break_margin == 0


def test_a_reload_to_another_policy_carries_the_decision_counts_over():
    """A reload that changes the policy builds a new one; /status's decision counters go on from where they were."""
    from rollout_router.balancer import Balancer
    from rollout_router.replicas import ReplicaSet

    balancer = Balancer(ReplicaSet(), "affinity", LiveConfig())
    policy = balancer.policy
    for key in ("a", "b", "a"):
        policy.route(Request(key, dict.fromkeys(R, 0)))
    policy.counters.restored = 4
    before = policy.counters.as_dict()
    assert before["new_sessions"] == 2 and before["affinity_kept"] == 1
    balancer.apply("cost_affinity", LiveConfig(margin=1))
    assert balancer.policy.name == "cost_affinity" and balancer.policy is not policy
    assert balancer.policy.counters.as_dict() == before
