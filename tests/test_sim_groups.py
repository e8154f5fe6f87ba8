"""The simulator's group-key arms (verl grid ``group``): GRPO siblings sent with their prompt as the group key."""
from __future__ import annotations

import dataclasses

from rollout_router.sim.engine import Arm, run_step
from rollout_router.sim.groupreport import group_table
from rollout_router.sim.verl import VERL_PRESETS, generate_verl
from rollout_router.sim.verlgrid import ALL, GROUP, GROUP_ARMS, VERL_GRIDS, VPoint, describe, every_arm, plan
from rollout_router.sim.verlreport import sections


class _Recording:
    """Wraps a policy and keeps every request it saw with the replica chosen."""

    def __init__(self, policy):
        self.policy, self.seen = policy, []
        self.counters = policy.counters

    def route(self, request):
        decision = self.policy.route(request)
        self.seen.append((request.key, request.group, decision.replica))
        return decision


def _run(arm: Arm):
    p = dataclasses.replace(VERL_PRESETS["one-step-off-dapo-7b"].scaled(4), prompts=8)
    trajs = generate_verl(p, 0, 0)
    policy = _Recording(arm.build())
    result = run_step(p.engine_preset(), trajs, arm, p.cost, policy=policy)
    by_group: dict[str, set[str]] = {}
    for key, _, replica in policy.seen:
        by_group.setdefault(next(t.gid for t in trajs if t.key == key), set()).add(replica)
    return result, policy, by_group


def test_a_group_arm_sends_the_prompt_as_the_group_key_and_siblings_share_a_replica():
    arms = every_arm(10_000)
    grouped, g_policy, g_where = _run(arms["ours_sticky_group"])
    plain, p_policy, p_where = _run(arms["ours_sticky"])
    assert {group for _, group, _ in g_policy.seen} == {f"g{g}" for g in range(8)}
    assert {group for _, group, _ in p_policy.seen} == {None}
    assert all(len(where) == 1 for where in g_where.values())  # sticky: every group whole on one replica
    assert any(len(where) > 1 for where in p_where.values())  # without the key, siblings spread
    assert grouped.hit_rate > plain.hit_rate
    assert g_policy.counters.group_colocated == 8 * 15


def test_the_group_arms_leave_the_other_grids_and_their_cache_keys_alone():
    assert not set(GROUP_ARMS) & set(ALL)  # the compare grid's "every arm" block runs what it ran
    for block in VERL_GRIDS["compare"]["blocks"]:
        assert not set(block.arms) & set(GROUP_ARMS)
    point = VPoint("one-step-off-dapo-7b", "7b-tp4-0.8", 4096, 0.75)
    assert "group" not in describe((point, "ours_sticky", 0, 0))["arm"]  # keys cached before the field stay valid
    assert describe((point, "ours_sticky_group", 0, 0))["arm"]["group"] is True


def test_the_group_grid_pairs_each_margin_with_and_without_the_key():
    points = plan(VERL_GRIDS["group"]["blocks"])
    assert all(set(arms) == set(GROUP) and arms[0] == "verl_sticky" for arms in points.values())
    for name in ("sticky", "margin0", "margin2", "margin4"):
        assert f"ours_{name}" in GROUP and f"ours_{name}_group" in GROUP


def test_the_group_table_shows_both_arms_and_the_keys_own_change():
    def pol(times, hit):
        from rollout_router.sim.stats import summarize
        return {"step_seconds": times, "hit_rate": hit, "change": summarize(times, [100.0, 100.0, 100.0])}

    policies = {"verl_sticky": pol([100.0] * 3, 0.5), "least_loaded": pol([101.0] * 3, 0.4)}
    for name in ("sticky", "margin0", "margin2", "margin4"):
        policies[f"ours_{name}"] = pol([99.0, 98.0, 99.5], 0.6)
        policies[f"ours_{name}_group"] = pol([95.0, 94.0, 95.5], 0.9)
    grid = {"verl_grid": "group", "seeds": 3, "points": [{"label": "p", "policies": policies}]}
    table = sections(grid)["verl-group"]
    assert table == group_table(grid)
    assert "| p (verl sticky 100 s, hit 50.0%) | null (sticky) | " in table
    assert "hit 90.0%" in table and "| | least_loaded |" in table and table.count("\n| ") >= 5
