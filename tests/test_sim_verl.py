"""The verl workload (issue 19): verl's agent loops, keys, arrival order, shared prefix and balancer."""
from __future__ import annotations

import dataclasses

import pytest

from rollout_router.policy.base import Outcome
from rollout_router.sim.cost import CostModel
from rollout_router.sim.engine import run_step
from rollout_router.sim.replica import Replica, Req
from rollout_router.sim.verl import SINGLE_TURN, TOOL_AGENT, VERL_PRESETS, arrival_order, generate_verl, max_tokens
from rollout_router.sim.verlbalancer import VerlBalancer
from rollout_router.sim.verlgrid import ALL, VERL_GRIDS, build, plan, verl_arms
from rollout_router.sim.verlsources import STICKY_ENTRIES, TOOL_RESULT_TOKENS

from .test_sim_core import _drive, _Traj


def _small(name: str, **kw) -> object:
    """A recipe on 2 replicas at a tenth of its per-replica load: seconds to simulate."""
    p = VERL_PRESETS[name].scaled(2)
    return dataclasses.replace(p, prompts=max(1, p.prompts // 10), **kw)


class _Recording:
    """Wraps a policy and keeps every decision it made."""

    def __init__(self, policy):
        self.policy, self.decisions = policy, []
        self.counters = policy.counters

    def route(self, request):
        d = self.policy.route(request)
        self.decisions.append((request.key, d.replica))
        return d


@pytest.mark.parametrize("name", ["one-step-off-dapo-7b", "dapo-32b"])
def test_single_turn_agent_every_margin_makes_the_same_decisions_and_step_time(name):
    p = _small(name, turn_out_median=2048.0)
    assert p.agent_loop == SINGLE_TURN
    trajs = lambda: generate_verl(p, seed=3, step=0)  # noqa: E731
    arms = [a for a in verl_arms(p.sticky_entries).values() if a.policy in ("verl", "affinity", "cost_affinity")]
    runs = []
    for arm in arms:
        rec = _Recording(build(arm))
        res = run_step(p.engine_preset(), trajs(), arm, p.cost, policy=rec)
        assert res.outcomes["kept"] == res.outcomes["broken"] == 0  # a fresh key per request: never a sticky hit
        runs.append((arm.label, arm.options.get("tie"), rec.decisions, res.step_seconds))
    # verl's tie-break (and ours: a hash of the key) is the only thing that can differ; within one tie-break
    # every margin, sticky included, routes identically and takes the same time
    by_tie: dict = {}
    for label, tie, decisions, seconds in runs:
        by_tie.setdefault((tie, "affinity" if label.startswith(("ours", "cost")) else "verl"), []).append(
            (label, decisions, seconds))
    assert len(by_tie) == 3
    for group in by_tie.values():
        assert len(group) >= 2
        assert all(d == group[0][1] and s == group[0][2] for _, d, s in group), [g[0] for g in group]


def test_tool_agent_keys_turns_and_budget_follow_verl():
    p = _small("retool-32b", turn_out_median=3000.0, tool_call_p=0.9)
    trajs = generate_verl(p, seed=1, step=2)
    assert len({t.key for t in trajs}) == len(trajs)  # one key per sample; siblings never share one
    assert max(len(t.outs) for t in trajs) == p.max_assistant_turns == 8
    assert any(len(t.outs) == 1 for t in trajs) and any(len(t.outs) > 1 for t in trajs)
    for t in trajs:
        assert t.tools == [TOOL_RESULT_TOKENS] * (len(t.outs) - 1)
        for ctx, out in zip(t.contexts(), t.outs):
            assert 1 <= out <= max(1, max_tokens(p, ctx))  # verl's per-turn max_tokens
        response = sum(t.outs) + sum(t.tools)
        # every tool result fit the budget; only the last turn's own tokens may pass it (then the loop stops)
        assert response - t.outs[-1] < p.response_length
        assert t.S == p.shared_tokens // 16 and t.P >= t.S


def test_tool_result_is_the_character_cap_at_one_token_per_character_plus_the_template():
    assert TOOL_RESULT_TOKENS == 15 + 256 + len("...(truncated)...")


def test_arrival_interleaves_eight_contiguous_worker_chunks():
    assert arrival_order(16)[:9] == [0, 2, 4, 6, 8, 10, 12, 14, 1]
    order = arrival_order(20)  # uneven: chunks of 3, 3, 3, 3, 2, 2, 2, 2
    assert order[:8] == [0, 3, 6, 9, 12, 14, 16, 18] and sorted(order) == list(range(20))
    trajs = generate_verl(_small("one-step-off-dapo-7b"), 0, 0)
    assert [t.index for t in trajs] == arrival_order(len(trajs))


def test_verl_balancer_ties_margin_and_lru_without_ttl():
    loads = {"a": 1, "b": 0, "c": 0}
    first = VerlBalancer(tie="first")
    from rollout_router.policy.base import Request
    assert first.route(Request("k1", loads)).replica == "b"  # the first registered of the least loaded
    picks = {VerlBalancer(tie="random", seed=s).route(Request("k", loads)).replica for s in range(20)}
    assert picks == {"b", "c"}
    keep = VerlBalancer(margin=2)
    keep.route(Request("s", {"a": 0, "b": 0}))
    assert keep.route(Request("s", {"a": 2, "b": 0}, now=1e9)).outcome is Outcome.KEPT  # no idle timeout
    d = keep.route(Request("s", {"a": 3, "b": 0}))
    assert (d.outcome, d.replica) == (Outcome.BROKEN, "b")
    lru = VerlBalancer(max_sessions=2)
    for k in ("x", "y"):
        lru.route(Request(k, {"a": 0}))
    lru.route(Request("x", {"a": 0}))  # a read refreshes recency: y is the oldest now
    lru.route(Request("z", {"a": 0}))
    assert list(lru.table) == ["x", "z"] and lru.counters.evicted_lru == 1
    assert STICKY_ENTRIES == 10_000


def test_shared_prefix_hits_across_groups_and_is_held_once():
    rep = Replica("r", CostModel(), num_blocks=1000)
    first = Req(_Traj(), 0, 660, 10, gid=1, tid=(1 << 40) + 1, P=40, fresh=660, S=16)
    _drive(rep, [first])
    assert first.hit == 0
    other = Req(_Traj(), 1, 660, 10, gid=2, tid=(1 << 40) + 2, P=40, fresh=660, S=16)  # another GRPO group
    _drive(rep, [other])
    assert other.hit == 16 * 16  # the shared blocks only
    sibling = Req(_Traj(), 2, 660, 10, gid=2, tid=(1 << 40) + 3, P=40, fresh=660, S=16)
    _drive(rep, [sibling])
    assert sibling.hit == 40 * 16
    both = [Req(_Traj(), 3 + i, 660, 10, gid=10 + i, tid=(1 << 40) + 10 + i, P=40, fresh=660, S=16) for i in range(2)]
    _drive(rep, both)
    rep.pool.check()
    assert rep.pool.in_use == 0


def test_every_preset_names_its_recipe_and_the_recipes_values():
    for p in VERL_PRESETS.values():
        assert p.source
    r, d, o = VERL_PRESETS["retool-32b"], VERL_PRESETS["dapo-32b"], VERL_PRESETS["one-step-off-dapo-7b"]
    assert (r.agent_loop, r.replicas, r.prompts, r.n, r.response_length, r.max_assistant_turns) == (
        TOOL_AGENT, 4, 512, 16, 16384, 8)
    assert (d.agent_loop, d.replicas, d.prompts, d.response_length, d.max_batched_tokens) == (
        SINGLE_TURN, 32, 1536, 20480, 22528)
    assert (o.replicas, o.response_length, o.model) == (16, 28672, "qwen2.5-7b")
    assert VERL_PRESETS["async-retool-7b"].max_assistant_turns == 16
    assert VERL_PRESETS["one-step-off-dapo-7b-tool"].agent_loop == TOOL_AGENT


def test_verl_grid_plans_every_arm_with_the_baseline():
    points = plan(VERL_GRIDS["compare"]["blocks"])
    assert all(arms[0] == "verl_sticky" for arms in points.values())
    assert any(set(arms) == set(ALL) for arms in points.values())


def test_verl_study_grid_runs_every_margin_and_peer_at_every_point_with_the_batch_and_replicas_axes():
    from rollout_router.sim.verlgrid import STUDY, VPoint

    points = plan(VERL_GRIDS["study"]["blocks"])
    assert all(set(arms) == set(STUDY) for arms in points.values())
    assert {"verl_margin3", "verl_margin6", "verl_margin8", "cache_aware", "consistent_hash", "power_of_two",
            "dual_threshold", "least_loaded", "cost_affinity"} <= set(STUDY)
    assert {p.batch for p in points} == {None, 1536}
    big = VPoint("one-step-off-dapo-7b-tool", "7b-tp4-0.8", 1024, 0.9, batch=1536).verl_preset()
    assert (big.prompts, big.sticky_entries) == (384, 2500)  # 6,144 trajectories: the fleet-wide map overflows
    assert VPoint("one-step-off-dapo-7b-tool", "7b-tp4-0.8", 1024, 0.9).verl_preset().prompts == 128
    arms = verl_arms(2500)
    assert arms["consistent_hash"].options["idle_ttl"] is None and arms["cache_aware"].options["idle_ttl"] is None
    # the compare grid's arms are the ones it was committed and run with
    assert set().union(*plan(VERL_GRIDS["compare"]["blocks"]).values()) == set(ALL)


def test_verl_grid_quick_from_the_command_line_pairs_against_verl_sticky(tmp_path, capsys):
    import json

    from rollout_router.sim.cli import main

    md = tmp_path / "verl.md"
    assert main(["--verl-grid", "quick", "--seeds", "2", "--jobs", "1", "--no-progress", "--json",
                 "--markdown", str(md)]) == 0
    (point,) = json.loads(capsys.readouterr().out)["points"]
    base = point["policies"]["verl_sticky"]
    assert base["change"]["median"] == 0.0 and 0.5 < base["hit_rate"] <= 1.0
    assert point["turns"] > 1
    assert set(point["policies"]) == set(VERL_GRIDS["quick"]["blocks"][0].arms)
    # a published row stands beside the nearest point only within half its context (2,944 tokens: 2.2K, not 8.7K)
    assert "### verl-compare" in md.read_text() and "| 2.2K: -3.8%, hit 8.7% |" in md.read_text()
    assert "8.7K: -8.6%" not in md.read_text()


def test_verl_grid_renders_plots_docs_and_readme_and_rerenders_from_its_json(tmp_path, capsys):
    import json

    from rollout_router.sim import verlreport
    from rollout_router.sim.cli import main

    out, img = tmp_path / "verl.json", tmp_path / "img"
    assert main(["--verl-grid", "quick", "--seeds", "2", "--jobs", "1", "--no-progress", "--json-out", str(out),
                 "--plots", str(img)]) == 0
    assert {p.name for p in img.iterdir()} == {"verl-heatmap.png", "verl-margins.png"}
    assert all((img / n).read_bytes().startswith(b"\x89PNG") for n in ("verl-heatmap.png", "verl-margins.png"))
    doc, readme = tmp_path / "doc.md", tmp_path / "README.md"
    doc.write_text("".join(f"x\n<!-- generated:{n} -->\nold\n<!-- /generated:{n} -->\n" for n in verlreport.SECTIONS))
    readme.write_text("a\n<!-- generated:verl-summary -->\nold\n<!-- /generated:verl-summary -->\nb\n")
    capsys.readouterr()
    assert main(["--from-json", str(out), "--docs", str(doc), "--readme", str(readme)]) == 0
    assert "### verl-summary" in capsys.readouterr().out
    assert "\nold\n" not in doc.read_text() and "| verl_margin0 | verl_margin2 |" in doc.read_text()
    row = "| tool_agent, KV pool holds the step (sticky hit >= 50%) | 1 | "
    assert row in readme.read_text() and readme.read_text().endswith("-->\nb\n")
    grid = json.loads(out.read_text())
    assert verlreport.regime(grid["points"][0]) in row
    from rollout_router.usage import UsageError

    with pytest.raises(UsageError, match=r"^--readme .*generated:verl-summary"):  # a file without the section
        main(["--from-json", str(out), "--readme", str(tmp_path / "verl.json")])


def test_summary_groups_points_by_loop_tools_and_pool():
    from rollout_router.sim.verlreport import regime

    pol = lambda hit: {"policies": {"verl_sticky": {"hit_rate": hit}}}  # noqa: E731
    assert regime({"preset": "dapo-32b", "latency": 0.0, **pol(0.9)}).startswith("single_turn_agent")
    assert regime({"preset": "retool-32b", "latency": 5.0, **pol(0.9)}) == "tool_agent, 5 s tool calls"
    assert "short" in regime({"preset": "retool-32b", "latency": 0.0, **pol(0.1)})
    assert "holds" in regime({"preset": "one-step-off-dapo-7b-tool", "latency": 0.0, **pol(0.9)})
