"""The margin's effect over a grid: KV pool x concurrency x context x sticky-table size x routers.

A grid is a union of blocks; each block is the product of a few axis values and
names the policies compared on it. A point is one fleet and workload; at every
point each policy runs the same ``seeds`` steps (common random numbers: step s
of a point replays the same trajectories in every policy), and the paired
change against sticky is summarised with an exact order-statistic interval
(``stats.median_ci``).

Scale: a point simulates ``replicas`` replicas (8 by default) at the recipe's
per-replica concurrency, with the sticky map scaled by ``replicas / 32``; the
``scale`` block checks this against the recipe's 32 replicas.
"""
from __future__ import annotations

import dataclasses
import inspect
import itertools
import math
from collections.abc import Iterable
from typing import Any

from .cost import CostModel
from .engine import Arm, run_step
from .routers import RouterFleet
from .sources import (
    PHYSICAL_KV_TOKENS,
    RECIPE_MAX_BATCHED_TOKENS,
    RECIPE_N,
    RECIPE_PER_REPLICA,
    RECIPE_REPLICAS,
    VERL_STICKY_ENTRIES,
)
from .workload import OUT_MEDIAN, Preset, generate

BASELINE = "sticky"
RULE = "cost_affinity"
PEERS = ("cache_aware", "consistent_hash", "power_of_two", "dual_threshold")
UNBOUNDED = 10**9  # a sticky map that never evicts


def grid_arms(lru: int) -> dict[str, Arm]:
    """The policies compared: sticky (margin null), margins 0-8, no affinity; the peer policies (options as in
    ``sim.runner``); and ``cost_affinity`` as the router ships it (``shipped_cost_affinity``)."""
    s = {"max_sessions": lru}
    arms = [Arm(BASELINE, "affinity", {"margin": None, **s})]
    arms += [Arm(f"margin{m}", "affinity", {"margin": m, **s}) for m in (0, 2, 4, 8)]
    arms += [
        Arm("least_loaded", "least_loaded"),
        Arm("cache_aware", "cache_aware", {"cache_threshold": 0.3, "balance_abs_threshold": 64,
                                           "balance_rel_threshold": 1.5}),
        Arm("consistent_hash", "consistent_hash", {"load_factor": 1.25, **s}),
        Arm("power_of_two", "power_of_two", {"seed": 0}),
        Arm("dual_threshold", "dual_threshold", {"abs_threshold": 4, "rel_threshold": 1.05, **s}),
        Arm(RULE, "cost_affinity", {**shipped_cost_affinity(), **s}),
    ]
    return {a.label: a for a in arms}


def shipped_cost_affinity() -> dict[str, Any]:
    """``cost_affinity``'s options as the router ships them: ``relative`` and ``min_turn_seconds`` from the
    router's settings (``CostAffinityOptions``, the policy's own model), the margin from the policy's own default (the router's
    ``affinityBreakMargin`` defaults to null, which it refuses under ``cost_affinity``: a deployment sets it).
    Spelled out in the arm, so the result cache keys by the values, not by a name."""
    from rollout_router.policy.cost_affinity import CostAffinityOptions, CostAffinityPolicy

    shipped = CostAffinityOptions()
    margin = inspect.signature(CostAffinityPolicy).parameters["margin"].default
    return {"margin": margin, "relative": shipped.relative, "min_turn_seconds": shipped.min_turn_seconds}


ARM_LABELS = tuple(grid_arms(1))


@dataclasses.dataclass(frozen=True)
class Point:
    """One fleet and workload of the grid."""

    ctx: str  # context shape: a published row (OUT_MEDIAN key)
    kv: str  # KV pool per replica: "x<multiple>" of the physical pool, or "all" (holds every trajectory)
    conc: int  # trajectories per replica per step
    lru: int | None = VERL_STICKY_ENTRIES  # sticky-map entries at the recipe's 32 replicas; None: unbounded
    replicas: int = 8
    routers: int = 1
    exchange_s: float = 0.0  # seconds between load exchanges (routers > 1); math.inf: none

    @property
    def kv_tokens(self) -> int:
        if self.kv == "all":
            return self.conc * RECIPE_MAX_BATCHED_TOKENS
        return round(PHYSICAL_KV_TOKENS * float(self.kv.removeprefix("x")))

    @property
    def label(self) -> str:
        lru = "inf" if self.lru is None else str(self.lru)
        ex = "" if self.routers == 1 else f" ex={'none' if math.isinf(self.exchange_s) else self.exchange_s}"
        return f"{self.ctx} kv={self.kv} c={self.conc} lru={lru} R={self.replicas} routers={self.routers}{ex}"

    def preset(self) -> Preset:
        lru = UNBOUNDED if self.lru is None else max(1, round(self.lru * self.replicas / RECIPE_REPLICAS))
        return Preset(self.label, OUT_MEDIAN[self.ctx], self.kv_tokens, prompts=self.conc * self.replicas // RECIPE_N,
                      replicas=self.replicas, router_lru=lru)


@dataclasses.dataclass(frozen=True)
class Block:
    """The product of axis values, and the policies compared on it."""

    name: str
    ctx: tuple[str, ...]
    kv: tuple[str, ...]
    conc: tuple[int, ...]
    lru: tuple[int | None, ...] = (VERL_STICKY_ENTRIES,)
    replicas: tuple[int, ...] = (8,)
    routers: tuple[tuple[int, float], ...] = ((1, 0.0),)  # (routers, exchange seconds)
    arms: tuple[str, ...] = ARM_LABELS

    def points(self) -> Iterable[Point]:
        for ctx, kv, conc, lru, reps, (n, ex) in itertools.product(
                self.ctx, self.kv, self.conc, self.lru, self.replicas, self.routers):
            yield Point(ctx, kv, conc, lru, reps, n, 0.0 if n == 1 else ex)


CTX = ("ctx2k", "ctx9k", "ctx20k")
KV = ("x0.25", "x1", "x4", "all")
RECIPE = RECIPE_PER_REPLICA  # 768
FEW = ("sticky", "margin2", "least_loaded")
ROUTER_SETS = ((1, 0.0), (2, 0.25), (4, 0.25), (8, 0.25), (2, math.inf), (8, math.inf))

GRIDS: dict[str, dict[str, Any]] = {
    "full": {"seeds": 6, "blocks": (
        Block("main", CTX, KV, (RECIPE // 16, RECIPE // 4, RECIPE)),
        Block("sticky-table", CTX, ("x1", "all"), (RECIPE,), lru=(None,)),
        Block("scale", ("ctx9k",), ("x1", "all"), (RECIPE,), replicas=(8, RECIPE_REPLICAS)),
        # an unbounded sticky map, so that N routers' N tables do not also change how many pins survive
        Block("routers", ("ctx9k",), ("x1", "all"), (RECIPE,), lru=(None,), routers=ROUTER_SETS),
    )},
    "quick": {"seeds": 3, "blocks": (
        Block("main", ("ctx2k",), ("x0.02", "all"), (32,), replicas=(4,)),
        Block("routers", ("ctx2k",), ("x0.02",), (32,), replicas=(4,), routers=((1, 0.0), (2, 0.25), (2, math.inf)),
              arms=FEW),
    )},
}

# The presets as grid points (the recipe's concurrency, verl's sticky map, the physical pool or one that holds all).
PRESET_POINTS = {
    "ctx2k": Point("ctx2k", "x1", RECIPE), "ctx9k": Point("ctx9k", "x1", RECIPE),
    "ctx20k": Point("ctx20k", "x1", RECIPE), "ctx9k-bigkv": Point("ctx9k", "all", RECIPE),
}


# The points cost_affinity's constants were chosen on (benchmarks/rule_grid.py; docs/simulator.md, "A rule for every
# point"): every context at a tight and the physical pool and two concurrencies, ctx2k and ctx9k x4 at the recipe's.
# The criterion on the full grid (sim.criterion) reports them apart from the out-of-sample rest.
RULE_SAMPLE = (*(Point(c, kv, n) for c in CTX for kv in ("x0.25", "x1") for n in (RECIPE // 16, RECIPE // 4)),
               Point("ctx2k", "x1", RECIPE), Point("ctx9k", "x4", RECIPE))


def plan(blocks: Iterable[Block]) -> dict[Point, tuple[str, ...]]:
    """Every point of the blocks with the union of the policies its blocks compare (sticky always)."""
    out: dict[Point, set[str]] = {}
    for b in blocks:
        for p in b.points():
            out.setdefault(p, {BASELINE}).update(b.arms)
    return {p: tuple(a for a in ARM_LABELS if a in arms) for p, arms in out.items()}


Task = tuple[Point, str, int, int, CostModel]  # point, arm label, step, base seed, cost model


def run_task(task: Task) -> dict[str, float]:
    """One policy on one step of one point: what the grid keeps of it."""
    point, label, step, seed, cost = task
    preset = point.preset()
    arm = grid_arms(preset.router_lru)[label]
    policy = None
    if point.routers > 1:
        names = [f"r{i:02d}" for i in range(preset.replicas)]
        policy = RouterFleet([arm.build() for _ in range(point.routers)], names, point.exchange_s)
    trajs = generate(preset, seed, step)
    res = run_step(preset, trajs, arm, cost, policy=policy)
    return {"step_seconds": res.step_seconds, "hit_rate": res.hit_rate, "preemptions": float(res.preemptions),
            "skew": res.skew, "moved_share": res.moved / max(1, res.requests - len(trajs)),
            "evicted_lru": float(res.outcomes.get("evicted_lru", 0))}


def tasks_for(points: dict[Point, tuple[str, ...]], seeds: int, seed: int, cost: CostModel) -> list[Task]:
    """Every (point, policy, step); the costliest first, so workers finish together."""
    tasks = [(p, a, s, seed, cost) for p, arms in points.items() for a in arms for s in range(seeds)]
    return sorted(tasks, key=lambda t: -_weight(t[0]))


def _weight(p: Point) -> float:
    return p.replicas * p.conc * OUT_MEDIAN[p.ctx] * (2.0 if p.kv != "all" else 1.0)


def describe(task: Task) -> dict[str, Any]:
    """Everything a task's result depends on besides the model's code: what the cache keys it by."""
    point, label, step, seed, cost = task
    preset = dataclasses.asdict(point.preset())
    preset.pop("name")
    arm = grid_arms(preset["router_lru"])[label].described()
    return {"preset": preset, "arm": arm, "routers": point.routers, "exchange_s": repr(point.exchange_s),
            "step": step, "seed": seed, "cost": dataclasses.asdict(cost)}


def run_grid(name: str, seeds: int | None = None, seed: int = 0, cost: CostModel = CostModel(), jobs: int = 1,
             ray_address: str | None = None, progress: bool = True, cache: str | None = None) -> dict[str, Any]:
    """Run grid ``name`` (a GRIDS key) and return its JSON-able summary.

    With ``cache`` (a file), tasks already computed by the same model are read from it and new results are
    appended as they arrive, so an interrupted run resumes and a grid grown by a block runs only the new points.
    """
    from .cache import ResultCache
    from .parallel import run_tasks

    spec = GRIDS[name]
    n = seeds if seeds is not None else spec["seeds"]
    points = plan(spec["blocks"])
    tasks = tasks_for(points, n, seed, cost)
    store = ResultCache(cache) if cache else None
    results: list[dict[str, float] | None] = [store.get(describe(t)) if store else None for t in tasks]
    todo = [i for i, r in enumerate(results) if r is None]

    def save(j: int, result: dict[str, float]) -> None:
        results[todo[j]] = result
        if store:
            store.put(describe(tasks[todo[j]]), result)

    run_tasks(run_task, [tasks[i] for i in todo], jobs=jobs, ray_address=ray_address, progress=progress,
              desc=f"grid {name}", on_result=save)
    by_point: dict[Point, dict[tuple[str, int], dict[str, float]]] = {}
    for (point, label, step, _, _), res in zip(tasks, results):
        assert res is not None
        by_point.setdefault(point, {})[(label, step)] = res
    return {
        "grid": name, "seeds": n, "seed": seed, "cost_model": dataclasses.asdict(cost),
        "blocks": {b.name: [p.label for p in b.points()] for b in spec["blocks"]},
        "points": [summarize_point(p, arms, by_point[p], n) for p, arms in points.items()],
    }


def summarize_point(point: Point, arms: tuple[str, ...], res: dict[tuple[str, int], dict[str, float]],
                    seeds: int) -> dict[str, Any]:
    """Per policy: step times by seed, mean metrics, and the paired change against sticky."""
    from .stats import summarize

    steps = range(seeds)
    base = [res[(BASELINE, s)]["step_seconds"] for s in steps]
    policies = {}
    for label in arms:
        rows = [res[(label, s)] for s in steps]
        times = [r["step_seconds"] for r in rows]
        policies[label] = {
            "step_seconds": times,
            **{k: sum(r[k] for r in rows) / seeds for k in ("hit_rate", "preemptions", "skew", "moved_share", "evicted_lru")},
            "change": summarize(times, base),
        }
    fields = dataclasses.asdict(point)
    if math.isinf(fields["exchange_s"]):
        fields["exchange_s"] = None  # JSON has no infinity: None = no exchange
    return {**fields, "label": point.label, "kv_tokens": point.kv_tokens, "policies": policies}
