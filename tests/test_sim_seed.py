"""The study at the seed's scale: the sandbox's concurrency, the candidate rules' load signals, the committed grid."""
from __future__ import annotations

import dataclasses

from rollout_router.policy.base import Outcome, Request
from rollout_router.sim.engine import Arm, run_step
from rollout_router.sim.verl import generate_verl
from rollout_router.sim.verlbalancer import VerlBalancer
from rollout_router.sim.verlgrid import (
    CANDIDATES,
    SEED,
    SEED_LATENCIES,
    SEED_LOADS,
    SEED_POINT,
    SEED_UTILS,
    VERL_GRIDS,
    VPoint,
    build,
    candidate_arms,
    plan,
)
from rollout_router.sim.verlsources import TOOL_SLOTS

STICKY = Arm("verl_sticky", "verl", {"margin": None, "tie": "first"})


def _tools(latency: float, slots: int | None, trajectories: int = 64):
    """A small tool_agent step on 2 replicas: every turn ends in a tool call of about ``latency`` seconds."""
    point = VPoint("one-step-off-dapo-7b-tool", "7b-tp4-0.8", 64, 1.0, latency, 2, 1, tool_slots=slots)
    preset = dataclasses.replace(point.verl_preset(), max_assistant_turns=3)
    return preset, generate_verl(preset, 0, 0)[:trajectories]


def test_a_sandbox_of_few_slots_makes_tool_calls_wait_their_turn():
    """Tool calls beyond the sandbox's slots wait: the same step with one slot takes about every call's latency
    end to end; with no bound, about one call's."""
    preset, trajs = _tools(2.0, None)
    free = run_step(preset.engine_preset(), trajs, STICKY, preset.cost, policy=build(STICKY)).step_seconds
    preset, trajs = _tools(2.0, 1)
    serial = run_step(preset.engine_preset(), trajs, STICKY, preset.cost, policy=build(STICKY)).step_seconds
    calls_seconds = sum(sum(t.lats) for t in trajs)
    assert calls_seconds > 10 * 2.0
    assert serial >= calls_seconds > free  # one slot: the calls run one after another


def test_without_tool_latency_the_sandbox_changes_nothing():
    preset, trajs = _tools(0.0, None)
    a = run_step(preset.engine_preset(), trajs, STICKY, preset.cost, policy=build(STICKY))
    preset, trajs = _tools(0.0, TOOL_SLOTS)
    b = run_step(preset.engine_preset(), trajs, STICKY, preset.cost, policy=build(STICKY))
    assert a.step_seconds == b.step_seconds and a.hit_tokens == b.hit_tokens


def test_the_footprint_load_counts_every_unfinished_session_on_its_last_replica():
    """Sessions in a tool call still count on their replica; a finished one leaves: the policy sees loads that
    are the context of the sessions last sent there."""
    preset, trajs = _tools(1.0, None, 8)
    seen: list[dict[str, float]] = []

    class Recording(VerlBalancer):
        def route(self, request: Request):
            seen.append(dict(request.loads))
            return super().route(request)

    arm = Arm("footprint", "verl", {"margin": None}, load="footprint")
    run_step(preset.engine_preset(), trajs, arm, preset.cost, policy=Recording())
    for k in range(len(trajs)):  # the first turns, all at t=0: each sees the sessions placed before it
        assert sum(seen[k].values()) == sum(t.prompt for t in trajs[:k])
    later = seen[len(trajs)]  # the first second turn: every session is unfinished, the others in a tool call
    assert sum(later.values()) >= sum(t.prompt for t in trajs)
    assert all(v >= 0 for loads in seen for v in loads.values())


def test_a_relative_margin_is_a_share_of_the_mean_load():
    rule, absolute = VerlBalancer(margin=0.25, relative=True), VerlBalancer(margin=2)
    for policy in (rule, absolute):
        policy.route(Request("s", {"a": 0, "b": 0}))  # pinned to a
    assert rule.route(Request("s", {"a": 21, "b": 18})).outcome is Outcome.KEPT  # 3 <= 0.25 x 19.5
    assert absolute.route(Request("s", {"a": 21, "b": 18})).outcome is Outcome.BROKEN  # 3 > 2
    assert rule.route(Request("s", {"a": 30, "b": 10})).outcome is Outcome.BROKEN  # 20 > 0.25 x 20


def test_the_seed_grid_is_the_committed_design():
    """16 replicas of the seed's fleet, ten paired steps, every arm at every point; the fleet block is the Latin
    square of utilisation x load x tool latency; the caveats' points are in; the candidates are the committed four."""
    spec = VERL_GRIDS["seed"]
    points = plan(spec["blocks"])
    assert spec["seeds"] >= 10
    assert all(arms == tuple(a for a in arms if a in SEED) and set(arms) == set(SEED) for arms in points.values())
    assert SEED_POINT in points and SEED_POINT.replicas == 16 and SEED_POINT.fleet == "32b-tp4-0.8"
    square = [p for p in points if p.replicas == 16 and p.fleet.startswith("32b") and p.sigma == 1.0
              and p.tool_tokens is None and p.max_turns is None and p.out == 1024]
    combos = {(SEED_UTILS[p.fleet], SEED_LOADS[p.batch], SEED_LATENCIES[p.latency]) for p in square}
    latin = {(u, b, lat) for u in range(3) for b in range(3) for lat in range(3) if (u + b + lat) % 3 == 0}
    assert latin <= combos
    assert all((p.tool_slots == TOOL_SLOTS) == (p.latency > 0) for p in points)
    assert {p.replicas for p in points} == {4, 16, 32}
    assert {"7b-tp4-0.8"} <= {p.fleet for p in points}
    assert set(candidate_arms(1)) == set(CANDIDATES) <= set(SEED)


def test_a_candidate_is_chosen_on_one_half_within_the_worst_allowed():
    from rollout_router.sim.verlgrid import WORST_ALLOWED, choose, seed_halves
    points = list(plan(VERL_GRIDS["seed"]["blocks"]))
    choosing, held_out = seed_halves(points)
    assert not set(choosing) & set(held_out) and len(choosing) + len(held_out) == len(points)
    assert choose({"a": [-0.05, 0.02], "b": [-0.01, 0.0], "c": [-0.2, WORST_ALLOWED]}) == "c"
    assert choose({"a": [-0.05, 0.02]}) is None


def test_the_report_reads_a_partial_run_and_advises_only_what_won_surely(tmp_path):
    """From a cache holding one point's steps: that point's row, the margin faster in every step bolded and advised,
    one faster in only some steps not; the candidates wait for every point."""
    from rollout_router.sim.cache import ResultCache
    from rollout_router.sim.seedreport import advice, candidates_text, points_table, results
    from rollout_router.sim.verlgrid import describe

    cache = ResultCache(tmp_path / "cache.jsonl")
    times = {"verl_margin2": [90.0] * 10, "verl_margin0": [95.0, 105.0] * 5}
    for arm in SEED:
        for step in range(10):
            seconds = times.get(arm, [100.0] * 10)[step]
            cache.put(describe((SEED_POINT, arm, step, 0)), {"step_seconds": seconds, "hit_rate": 0.09})
    found, done = results(ResultCache(tmp_path / "cache.jsonl"))
    assert done == 10 * len(SEED) and list(found) == [SEED_POINT]
    table = points_table(found)
    assert "**-10.0% [-10.0%, -10.0%] (10/10, p=0.002)**" in table and "(5/10, p=1)" in table
    rows = advice(found).splitlines()
    assert len(rows) == 3 and "| `2` |" in rows[2]
    assert candidates_text(found).startswith("Not yet: 20 of 21 points")
