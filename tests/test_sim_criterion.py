"""Issue 13 part 3 on the full grid: cost_affinity as the router ships it, the peers, and the criterion's verdicts."""
from __future__ import annotations

import inspect
import random

import pytest

from rollout_router.balancer import _build
from rollout_router.policy.base import Outcome, Request
from rollout_router.policy.cost_affinity import CostAffinityOptions, CostAffinityPolicy
from rollout_router.settings import PolicySettings
from rollout_router.sim import criterion, grid, gridreport
from rollout_router.sim.cache import ResultCache
from rollout_router.sim.cost import CostModel
from rollout_router.sim.grid import GRIDS, PEERS, RULE, RULE_SAMPLE, Point, describe, grid_arms, plan, summarize_point

SHIPPED = CostAffinityOptions()
POLICY_MARGIN = inspect.signature(CostAffinityPolicy).parameters["margin"].default


def test_every_full_grid_point_runs_the_rule_the_baselines_and_the_peers():
    points = plan(GRIDS["full"]["blocks"])
    assert len(points) == 54
    assert all(set(arms) >= {RULE, *criterion.BASELINES, *PEERS} for arms in points.values())
    assert len(set(RULE_SAMPLE)) == 14 and set(RULE_SAMPLE) <= set(points)  # in-sample: 14, out-of-sample: 40


def test_the_grids_cost_affinity_decides_as_the_router_builds_it():
    """Same decisions, turn by turn, as the router's own build path (settings -> LiveConfig -> configure) with
    its shipped cost_affinity settings and the margin the policy defaults to."""
    lru = 2500
    sim_policy = grid_arms(lru)[RULE].build()
    settings = PolicySettings(policy="cost_affinity", affinity_break_margin=POLICY_MARGIN,
                              session={"max_sessions": lru})
    router_policy = _build(settings.policy, settings.live_config())
    assert (sim_policy.margin, sim_policy.relative, sim_policy.min_turn_seconds) == (
        POLICY_MARGIN, SHIPPED.relative, SHIPPED.min_turn_seconds)
    rng = random.Random(0)
    loads = {f"r{i}": 0 for i in range(4)}
    now, outcomes = 0.0, set()
    for _ in range(3000):
        now += rng.expovariate(1 / 2.0)  # a session's previous turn ~1 min ago on average: both sides of 40 s
        key = f"s{rng.randrange(30)}"
        for r in loads:
            loads[r] = max(0, loads[r] + rng.choice((-2, -1, 0, 1, 2, 3)))
        a = sim_policy.route(Request(key, dict(loads), now))
        b = router_policy.route(Request(key, dict(loads), now))
        assert a == b
        outcomes.add(a.outcome)
    assert outcomes >= {Outcome.NEW, Outcome.KEPT, Outcome.BROKEN}
    assert sim_policy.counters.as_dict() == router_policy.counters.as_dict()


def test_the_cache_keys_by_the_rules_shipped_values(monkeypatch):
    task = (Point("ctx2k", "x1", 48), RULE, 0, 0, CostModel())
    options = describe(task)["arm"]["options"]
    assert (options["margin"], options["relative"], options["min_turn_seconds"]) == (
        POLICY_MARGIN, SHIPPED.relative, SHIPPED.min_turn_seconds)
    store = ResultCache.__new__(ResultCache)
    store.fingerprint = "model"
    before = store.key(describe(task))
    monkeypatch.setattr(grid, "shipped_cost_affinity", lambda: {"margin": 2, "relative": 0.01, "min_turn_seconds": 20.0})
    assert store.key(describe(task)) != before  # another shipped default is another result


def _point(p: Point, times: dict[str, list[float]]) -> dict:
    """A grid JSON point from step times per arm (the other metrics made up but distinct per arm)."""
    res = {(a, s): {"step_seconds": t, "hit_rate": 0.5, "preemptions": 3.0, "skew": 2.0, "moved_share": 0.1 * i,
                    "evicted_lru": 0.0} for i, (a, ts) in enumerate(times.items()) for s, t in enumerate(ts)}
    return summarize_point(p, tuple(times), res, len(next(iter(times.values()))))


def _times(rule: list[float], best: str, best_times: list[float], peer: float) -> dict[str, list[float]]:
    times = {a: [100.0, 100.0, 100.0] for a in criterion.BASELINES}
    times[best] = best_times
    times.update({a: [peer] * 3 for a in PEERS})
    times[RULE] = rule
    return times


def test_criterion_excess_significance_peers_and_the_sample_split():
    inside = _point(RULE_SAMPLE[0], _times([99.0, 99.0, 102.0], "margin4", [97.0, 97.0, 97.0], peer=101.0))
    outside = _point(Point("ctx20k", "all", 768), _times([95.0, 96.0, 95.0], "margin2", [96.0, 96.0, 96.0], peer=95.5))
    g = {"seeds": 3, "points": [inside, outside]}
    ins, outs = criterion.evaluate(g)
    assert ins.in_sample and not outs.in_sample
    assert ins.best == "margin4" and ins.excess == pytest.approx(99 / 97 - 1) and ins.significant and not ins.within
    assert ins.beats_peers  # rule +0% vs sticky, peers +1%
    assert outs.best == "margin2" and outs.within and outs.excess < 0 and not outs.significant
    assert outs.beaten_by == ()
    summary = criterion.summarize(criterion.split(criterion.evaluate(g))["all"])
    assert (summary.points, summary.within, summary.significant_misses, summary.beats_peers) == (2, 1, 1, 2)
    text = gridreport.criterion_summary(g)
    assert "| in-sample (its 40 s chosen on steps 0-2 of these) | 1 | +2.06% at ctx2k x0.25 c48 (vs margin4, significant)" in text
    assert "| out-of-sample | 1 | " in text
    table = gridreport.criterion_table(g)
    assert "over 1% (+2.1%) behind margin4" in table


def test_a_peer_at_or_below_the_rule_is_named():
    p = _point(Point("ctx9k", "x1", 48), _times([98.0] * 3, "margin2", [98.0] * 3, peer=98.0))
    (v,) = criterion.evaluate({"seeds": 3, "points": [p]})
    assert v.beaten_by == PEERS and not v.beats_peers  # a tie is not a win
    assert "cache_aware -2.0% against -2.0%" in gridreport.criterion_table({"seeds": 3, "points": [p]})
