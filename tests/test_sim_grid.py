"""The grid study: sourced parameters, exact intervals, the N-router model, and local vs Ray runs."""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import math

import numpy as np
import pytest

from rollout_router import sim
from rollout_router.policy.affinity import AffinityPolicy
from rollout_router.policy.base import Request
from rollout_router.policy.registry import create
from rollout_router.sim import gridreport, verlreport
from rollout_router.sim.cost import CostModel
from rollout_router.sim.engine import Arm, run_step
from rollout_router.sim.grid import GRIDS, PRESET_POINTS, Point, plan, run_grid
from rollout_router.sim.routers import RouterFleet
from rollout_router.sim.sources import Gpu, kv_pool_tokens
from rollout_router.sim.stats import median_ci, median_ci_coverage
from rollout_router.sim.workload import PRESETS, fit_out_median, generate, mean_final_context

QUICK = PRESETS["quick"]


# -- sources ---------------------------------------------------------------------------------------------

def test_kv_pool_from_gpu_memory_model_size_and_tp():
    assert kv_pool_tokens() == 1_516_583  # H200, 0.80, Qwen2.5-32B at TP 4: the arithmetic in sources.py
    assert kv_pool_tokens(gpu=Gpu(memory_utilization=0.9)) == 1_746_615
    # an independent published pool: llm-d, Qwen-32B on 2 x H100 80 GB: 307,328 tokens
    h100 = kv_pool_tokens(CostModel(tp=2), Gpu(memory_gib=79.65, memory_utilization=0.9))
    assert h100 == pytest.approx(307_328, rel=0.03)


@pytest.mark.parametrize("name,target", [("ctx2k", 2200), ("ctx9k", 8700)])
def test_output_length_is_fitted_to_the_published_context(name, target):
    preset = PRESETS[name]
    assert mean_final_context(preset) == pytest.approx(target, rel=0.005)  # the fit's own sample
    assert mean_final_context(preset, seed=11) == pytest.approx(target, rel=0.03)  # and a fresh one


def test_ctx20k_shape_tops_out_below_the_published_context():
    small = dataclasses.replace(PRESETS["ctx20k"], prompts=64)
    assert fit_out_median(small, 19_800, iters=8) == pytest.approx(small.max_response, rel=0.03)  # the bound
    assert 18_500 < mean_final_context(small) < 19_800


def test_presets_differ_only_in_output_length_and_pool():
    shared = {f.name for f in dataclasses.fields(sim.Preset)} - {
        "name", "out_median", "kv_tokens", "steps", "published_ctx", "published_hit", "published_change", "published_note"}
    study = [PRESETS[n] for n in ("ctx2k", "ctx9k", "ctx20k", "ctx9k-bigkv")]
    for field in shared:
        assert len({getattr(p, field) for p in study}) == 1, field
    assert PRESETS["ctx9k"].tool_latency == 0


# -- exact intervals -------------------------------------------------------------------------------------

@pytest.mark.parametrize("n", [3, 5, 6, 8, 10, 13])
def test_order_statistic_coverage_is_the_binomial_sum(n):
    # [x_(k), x_(n+1-k)] covers the median iff between k and n-k draws fall below it; enumerate every pattern
    for k in range(1, (n + 1) // 2 + 1):
        covered = sum(k <= sum(below) <= n - k for below in itertools.product((0, 1), repeat=n))
        assert median_ci_coverage(n, k) == pytest.approx(covered / 2**n)
    assert median_ci_coverage(6, 1) == pytest.approx(1 - 2 / 64)
    assert median_ci_coverage(8, 2) == pytest.approx(1 - 2 * 9 / 256)


def test_median_ci_takes_the_narrowest_interval_that_reaches_the_level():
    x = np.arange(10.0)
    assert median_ci(x) == (1.0, 8.0, pytest.approx(1 - 2 * 11 / 1024))  # k=2: 97.9%; k=3 would be 89.1%
    lo, hi, cov = median_ci([3.0, 1.0, 2.0, 5.0, 4.0])  # n=5 cannot reach 95%: [min, max] and its 93.75%
    assert (lo, hi, cov) == (1.0, 5.0, pytest.approx(0.9375))


def test_median_ci_coverage_holds_for_a_skewed_distribution():
    rng = np.random.default_rng(0)
    true_median = 1.0  # of a log-normal with mu = 0
    trials = 20_000
    hits = sum(lo <= true_median <= hi for lo, hi, _ in (median_ci(rng.lognormal(0, 1, 6)) for _ in range(trials)))
    assert hits / trials == pytest.approx(median_ci_coverage(6, 1), abs=0.006)


# -- N routers -----------------------------------------------------------------------------------------

def _two_routers(exchange_s: float) -> tuple[RouterFleet, list[str]]:
    fleet = RouterFleet([create("least_loaded"), create("least_loaded")], ["a", "b"], exchange_s)
    keys = [f"k{i}" for i in range(40)]
    return fleet, keys


def _route(fleet: RouterFleet, key: str, now: float) -> str:
    return fleet.route(Request(key, {"a": 0, "b": 0}, now)).replica


def test_each_router_sees_peers_only_as_of_the_last_exchange():
    fleet, keys = _two_routers(0.25)
    on_zero = [k for k in keys if fleet.owner(k) == 0][:4]
    first, second = [k for k in keys if fleet.owner(k) == 1][:2]
    for k in on_zero:
        _route(fleet, k, 0.0)
    assert sum(fleet.view(0).values()) == 4  # its own, exactly
    assert sum(fleet.view(1).values()) == 0  # router 1 has not heard yet
    _route(fleet, first, 0.1)
    assert sum(fleet.view(1).values()) == 1
    fleet.on_release(max(fleet.own[0], key=fleet.own[0].__getitem__), on_zero[0], 0.2)
    _route(fleet, second, 0.3)  # past the exchange at 0.25
    assert sum(fleet.view(1).values()) == 3 + 2  # router 0's three as of 0.25, and router 1's own two
    assert sum(fleet.view(0).values()) == 3 + 1  # router 0's own three, and router 1's one as of 0.25


def test_without_exchange_a_router_sees_only_its_own_requests():
    fleet, keys = _two_routers(math.inf)
    for t, k in enumerate(keys):
        _route(fleet, k, float(t))
    owned = [sum(1 for k in keys if fleet.owner(k) == i) for i in (0, 1)]
    assert [sum(fleet.view(i).values()) for i in (0, 1)] == owned
    assert all(abs(fleet.own[i]["a"] - fleet.own[i]["b"]) <= 1 for i in (0, 1))  # each balances its own share


def test_sessions_are_owned_by_rendezvous_and_spread_over_routers():
    fleet = RouterFleet([create("least_loaded") for _ in range(4)], ["a"], 0.25)
    owners = [fleet.owner(f"s{i}") for i in range(400)]
    assert set(owners) == {0, 1, 2, 3} and min(owners.count(i) for i in range(4)) > 60
    assert owners == [fleet.owner(f"s{i}") for i in range(400)]


def test_routers_with_a_perfect_exchange_decide_as_one_router():
    arm = Arm("m2", "affinity", {"margin": 2})
    cost = CostModel()
    one = run_step(QUICK, generate(QUICK, 0, 1), arm, cost)
    names = [f"r{i:02d}" for i in range(QUICK.replicas)]
    fleet = RouterFleet([arm.build() for _ in range(3)], names, exchange_s=0.0)
    three = run_step(QUICK, generate(QUICK, 0, 1), arm, cost, policy=fleet)
    assert three.step_seconds == one.step_seconds and three.outcomes == one.outcomes
    assert all(o == {r: 0 for r in names} for o in fleet.own)  # every turn released to its router


def test_routers_run_the_routers_own_policy_module(monkeypatch):
    calls = []
    original = AffinityPolicy.route
    monkeypatch.setattr(AffinityPolicy, "route", lambda self, req: calls.append(req.key) or original(self, req))
    arm = Arm("m2", "affinity", {"margin": 2})
    names = [f"r{i:02d}" for i in range(QUICK.replicas)]
    res = run_step(QUICK, generate(QUICK, 0, 0), arm, CostModel(),
                   policy=RouterFleet([arm.build() for _ in range(2)], names, 0.25))
    assert len(calls) == res.requests > 0


# -- the grid ------------------------------------------------------------------------------------------

def test_presets_are_points_of_the_full_grid_and_scale_the_sticky_map():
    points = plan(GRIDS["full"]["blocks"])
    assert set(PRESET_POINTS.values()) <= set(points)
    assert all(set(points[p]) >= {"sticky", "margin2", "least_loaded"} for p in PRESET_POINTS.values())
    p = PRESET_POINTS["ctx9k"].preset()
    assert (p.replicas, p.prompts * p.n // p.replicas, p.router_lru) == (8, 768, 2500)  # 10,000 x 8/32
    assert p.kv_tokens == PRESETS["ctx9k"].kv_tokens and p.out_median == PRESETS["ctx9k"].out_median
    assert Point("ctx9k", "all", 768).kv_tokens == PRESETS["ctx9k-bigkv"].kv_tokens


def test_quick_grid_local_processes_and_ray_give_identical_numbers():
    local = run_grid("quick", seeds=2, jobs=2, progress=False)
    serial = run_grid("quick", seeds=2, jobs=1, progress=False)
    ray = run_grid("quick", seeds=2, ray_address="local", progress=False)
    assert json.dumps(local, sort_keys=True) == json.dumps(serial, sort_keys=True) == json.dumps(ray, sort_keys=True)
    points = {p["label"]: p for p in local["points"]}
    assert len(points) == len(plan(GRIDS["quick"]["blocks"]))
    for p in points.values():
        assert p["policies"]["sticky"]["change"]["median"] == 0
        assert all(len(m["step_seconds"]) == 2 for m in p["policies"].values())


@pytest.mark.parametrize(("address", "first_error", "calls"), [
    ("local", "The current node timed out during startup. This could happen ...", 2),  # Ray's fixed 30 s missed
    (None, "The current node timed out during startup.", 2),
    ("10.0.0.1:6379", "The current node timed out during startup.", 1),  # a running cluster: not retried
    ("local", "Permission denied: /tmp/ray", 1),  # any other failure: not retried
])
def test_start_ray_retries_only_a_local_start_up_timeout(monkeypatch, address, first_error, calls):
    import ray

    from rollout_router.sim.parallel import start_ray

    seen: list[str] = []

    def init(**kwargs):
        seen.append("init")
        if seen.count("init") == 1:
            raise Exception(first_error)

    monkeypatch.setattr(ray, "init", init)
    monkeypatch.setattr(ray, "shutdown", lambda: seen.append("shutdown"))
    if calls == 1:
        with pytest.raises(Exception, match=first_error.split(":")[0]):
            start_ray(address=address)
        assert seen == ["init"]
    else:
        start_ray(address=address)
        assert seen == ["init", "shutdown", "init"]  # the failed start is shut down before the second


def test_grid_command_writes_json_plots_and_the_docs_sections(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("".join(f"x\n<!-- generated:{n} -->\nold\n<!-- /generated:{n} -->\n" for n in gridreport.SECTIONS))
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- generated:simulator -->\nold\n<!-- /generated:simulator -->\nb\n"
                      "<!-- generated:rule -->\nold\n<!-- /generated:rule -->\n")
    parser = argparse.ArgumentParser()
    sim.add_arguments(parser)
    out = tmp_path / "grid.json"
    args = parser.parse_args(["--grid", "quick", "--seeds", "3", "--jobs", "1", "--no-progress", "--json-out", str(out),
                              "--plots", str(tmp_path / "img"), "--docs", str(doc), "--readme", str(readme)])
    assert sim.run(args) == 0
    grid = json.loads(out.read_text())
    assert grid["seeds"] == 3 and all(m["change"]["coverage"] == 0.75 for p in grid["points"] for m in p["policies"].values())
    assert {p.name for p in (tmp_path / "img").iterdir()} == {"grid-heatmap.png", "grid-peers-heatmap.png",
                                                              "grid-routers.png"}
    text = doc.read_text()
    assert "\nold\n" not in text and "| ctx2k, kv x0.02, 32/replica | 2 | every 250 ms |" in text
    assert readme.read_text().startswith("a\n<!-- generated:simulator -->\n| preset")
    assert "\nold\n" not in readme.read_text() and "| out-of-sample | 2 | " in readme.read_text()  # the quick grid's 2
    assert "| ctx2k x0.02 c32 R=4 | out | " in text  # the criterion per point, with the rule and the peers
    with pytest.raises(ValueError, match="generated:grid"):
        gridreport.fill("no markers", {"grid": "x"})


def test_the_docs_hold_every_generated_section():
    with open("docs/simulator.md") as fh:
        text = fh.read()
    seed = ("seed-progress", "seed-points", "seed-candidates", "seed-advice")  # the seed study's (seedreport)
    gridreport.fill(text, {n: "" for n in [*gridreport.SECTIONS, *verlreport.SECTIONS, *seed]})
    with open("README.md") as fh:  # the README's advice is the seed study's summary (the older grids' are in the docs)
        gridreport.fill(fh.read(), {"seed-summary": ""})


def test_cache_resumes_a_grid_and_misses_after_a_model_change(tmp_path, monkeypatch):
    from rollout_router.sim import cache, grid

    path = tmp_path / "cache.jsonl"
    first = run_grid("quick", seeds=2, progress=False, cache=str(path))
    tasks = len(path.read_text().splitlines())
    assert tasks == sum(len(a) for a in plan(GRIDS["quick"]["blocks"]).values()) * 2

    def no_simulation(task):
        raise AssertionError("a cached task was simulated again")

    monkeypatch.setattr(grid, "run_task", no_simulation)
    assert run_grid("quick", seeds=2, progress=False, cache=str(path)) == first
    monkeypatch.setattr(cache, "model_fingerprint", lambda: "another model")
    with pytest.raises(AssertionError, match="simulated again"):
        run_grid("quick", seeds=2, progress=False, cache=str(path))
