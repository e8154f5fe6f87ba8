"""cost_affinity: a margin priced by what a move saves and what it re-prefills."""
from __future__ import annotations

import random

import pytest

from rollout_router.policy import registry
from rollout_router.policy.base import LiveConfig, Outcome, Request

R = ["a", "b", "c", "d"]


def pin(policy, key="s"):
    """Place ``key`` on an empty fleet; its replica."""
    return policy.route(Request(key, dict.fromkeys(R, 0))).replica


def skewed(home, least, skew):
    """Loads where ``home`` carries ``skew`` more than the least-loaded replicas (at ``least``)."""
    return {r: least + skew if r == home else least for r in R}


def test_without_extras_it_decides_exactly_like_affinity():
    rng = random.Random(7)
    ours, theirs = registry.create("cost_affinity", margin=2), registry.create("affinity", margin=2)
    for _ in range(2000):
        key = f"s{rng.randrange(40)}"
        loads = {r: rng.randrange(12) for r in R}
        now = rng.random()
        assert ours.route(Request(key, loads, now)) == theirs.route(Request(key, loads, now))
    assert ours.counters == theirs.counters


def test_relative_part_grows_with_the_least_load():
    p = registry.create("cost_affinity", margin=2, relative=0.05)
    home = pin(p)
    assert p.route(Request("s", skewed(home, 100, 7))).outcome is Outcome.KEPT  # 7 <= 2 + 0.05 x 100
    d = p.route(Request("s", skewed(home, 100, 8)))
    assert d.outcome is Outcome.BROKEN and d.previous == home
    q = registry.create("cost_affinity", margin=2, relative=0.05)
    home = pin(q)
    assert q.route(Request("s", skewed(home, 10, 3))).outcome is Outcome.BROKEN  # 3 > 2 + 0.5


def test_context_part_prices_the_re_prefill():
    p = registry.create("cost_affinity", margin=0, context_scale=1024)
    home = pin(p)
    assert p.route(Request("s", skewed(home, 5, 4), context_tokens=4096)).outcome is Outcome.KEPT
    assert p.route(Request("s", skewed(home, 5, 4), context_tokens=3000)).outcome is Outcome.BROKEN
    q = registry.create("cost_affinity", margin=0, context_scale=1024)
    home = pin(q)
    assert q.route(Request("s", skewed(home, 5, 1))).outcome is Outcome.BROKEN  # no length given: margin only


def test_kv_pressure_on_the_pinned_replica_drops_the_extras():
    def decide(usage):
        p = registry.create("cost_affinity", margin=1, relative=0.1, kv_high=0.9)
        home = pin(p)
        kv = None if usage is None else {home: usage}
        return p.route(Request("s", skewed(home, 50, 4), kv_usage=kv)).outcome
    assert decide(None) is Outcome.KEPT  # usage unknown: the prefix may be there, 4 <= 1 + 5
    assert decide(0.5) is Outcome.KEPT
    assert decide(0.9) is Outcome.BROKEN  # evicted there most likely: only the fixed margin, 4 > 1
    assert decide(1.0) is Outcome.BROKEN


def test_live_config_margin_none_keeps_every_pin_and_margin_changes_live():
    p = registry.create("cost_affinity", margin=0, relative=0.0)
    home = pin(p)
    p.configure(LiveConfig(margin=None))
    assert p.route(Request("s", skewed(home, 0, 50))).outcome is Outcome.KEPT
    p.configure(LiveConfig(margin=3))
    assert p.route(Request("s", skewed(home, 0, 3))).outcome is Outcome.KEPT
    assert p.route(Request("s", skewed(home, 0, 4))).outcome is Outcome.BROKEN
    assert p.sessions() == 1


@pytest.mark.parametrize("options, named", [
    ({"margin": True}, "margin"), ({"margin": -1}, "margin"), ({"margin": 1.5}, "margin"),
    ({"relative": -0.1}, "relative"), ({"relative": "0.1"}, "relative"), ({"relative": 11}, "relative"),
    ({"context_scale": 0}, "context_scale"), ({"context_scale": False}, "context_scale"),
    ({"kv_high": 0}, "kv_high"), ({"kv_high": 1.5}, "kv_high"), ({"kv_high": "0.9"}, "kv_high"),
])
def test_bad_options_are_rejected_naming_them(options, named):
    with pytest.raises(ValueError, match=named):
        registry.create("cost_affinity", **options)


def test_unknown_option_is_rejected():
    with pytest.raises(ValueError, match="takes no option 'margin_tokens'"):
        registry.create("cost_affinity", margin_tokens=3)


def test_router_settings_reach_the_policy_live():
    from rollout_router.balancer import Balancer
    from rollout_router.replicas import ReplicaSet
    from rollout_router.settings import SettingsError, parse_settings

    settings = parse_settings({"policy": "cost_affinity", "affinityBreakMargin": 1,
                               "costAffinity": {"relative": 0.05, "kvHigh": 0.9}})
    balancer = Balancer(ReplicaSet(), settings.policy, settings.live_config())
    policy = balancer.policy
    assert (policy.name, policy.margin, policy.relative, policy.kv_high) == ("cost_affinity", 1, 0.05, 0.9)
    home = pin(policy)
    policy.route(Request("other", dict.fromkeys(R, 0)))
    balancer.apply("cost_affinity", parse_settings({"policy": "cost_affinity", "affinityBreakMargin": 1}).live_config())
    assert (policy.relative, policy.kv_high, policy.sessions()) == (0.01, None, 2)  # the defaults; pins kept
    assert policy.pinned("s", 0.0) == home
    for bad in ({"relative": -1}, {"kvHigh": 0}, {"kvHigh": 1.1}, {"relativ": 0.1}, {"relative": "nan"}):
        with pytest.raises(SettingsError):
            parse_settings({"policy": "cost_affinity", "costAffinity": bad})
