"""The verl grid: the verl presets over the quantities no source publishes, every policy on the same steps.

A point is a verl preset (``sim.verl``), simulated on ``replicas`` replicas at
the recipe's per-replica load, with the unknowns set: per-turn output median,
tool-call probability, tool latency, and the fleet (model, TP, memory
utilisation: the PR's are not published, so the recipe's and verl's defaults
are both points). Nothing here was chosen by looking at the published rows:
the axes' values are round numbers spanning what a reader could believe, and
this module was committed before the comparison was run.

The baseline is verl's sticky balancer at the PR's base (``verl_sticky``: no
margin, ties to the first registered server); every other arm is paired with
it step by step (common random numbers).
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from typing import Any

from rollout_router.policy import registry

from .engine import Arm, run_step
from .grid import PEERS, grid_arms, shipped_cost_affinity
from .stats import summarize
from .verl import VERL_PRESETS, VerlPreset, generate_verl
from .verlbalancer import VerlBalancer
from .verlsources import DEFAULT_GPU_UTIL, DEFAULT_TP, QWEN7B, QWEN32B, TOOL_SLOTS, pool

BASELINE = "verl_sticky"

# (model, TP, gpu_memory_utilization): the recipes' and verl's defaults (verlsources)
FLEETS = {"7b-tp4-0.8": ("qwen2.5-7b", 4, 0.8), "7b-tp2-0.5": ("qwen2.5-7b", DEFAULT_TP, DEFAULT_GPU_UTIL),
          "32b-tp4-0.8": ("qwen2.5-32b", 4, 0.8), "32b-tp4-0.9": ("qwen2.5-32b", 4, 0.9),
          "32b-tp4-0.5": ("qwen2.5-32b", 4, 0.5)}


MARGINS = (0, 1, 2, 3, 4, 6, 8)  # verl's margin, the study's curve


def verl_arms(entries: int) -> dict[str, Arm]:
    """verl's balancer (margins, both tie-breaks), ours (hash ties, per-router table without TTL here so the
    tables match), no affinity, ``cost_affinity`` as shipped, and the old study's peer policies with its
    options (``grid.grid_arms``), their tables the same size and without TTL."""
    ours = {"max_sessions": entries, "idle_ttl": None}
    arms = [Arm(BASELINE, "verl", {"margin": None, "tie": "first", "max_sessions": entries})]
    arms += [Arm(f"verl_margin{m}", "verl", {"margin": m, "tie": "first", "max_sessions": entries})
             for m in MARGINS]
    arms += [Arm("verl_sticky_random", "verl", {"margin": None, "tie": "random", "max_sessions": entries}),
             Arm("verl_margin2_random", "verl", {"margin": 2, "tie": "random", "max_sessions": entries}),
             Arm("ours_sticky", "affinity", {"margin": None, **ours}),
             Arm("ours_margin2", "affinity", {"margin": 2, **ours}),
             Arm("least_loaded", "least_loaded"),
             Arm("cost_affinity", "cost_affinity", {**shipped_cost_affinity(), **ours})]
    peers = grid_arms(entries)
    arms += [dataclasses.replace(peers[name], options={**peers[name].options, **ours})
             if "idle_ttl" in registry.options(peers[name].policy) else peers[name] for name in PEERS]
    return {a.label: a for a in arms}


# The seed study's candidate rules beside the absolute margin (committed before its run; docs/simulator.md, "The
# study at the seed's scale"): each keeps a pin while its replica's load is within a share of the fleet's mean load
# of the least loaded (``VerlBalancer(relative=True)``), verl's tie-break, over three load signals: requests in
# flight (the margin's own), context tokens in flight (``Arm.load="tokens"``), and the context of the sessions last
# sent to each replica, idle ones in a tool call included (``"footprint"``: a session leaves it when its trajectory
# ends, which verl's adapter tells the router by releasing the session).
CANDIDATES = {"rel0.05": (0.05, "requests"), "rel0.25": (0.25, "requests"), "tokens_rel0.1": (0.1, "tokens"),
              "footprint_rel0.1": (0.1, "footprint")}


def candidate_arms(entries: int) -> dict[str, Arm]:
    return {label: Arm(label, "verl", {"margin": share, "tie": "first", "max_sessions": entries, "relative": True},
                       load=load) for label, (share, load) in CANDIDATES.items()}


def group_arms(entries: int) -> dict[str, Arm]:
    """For grid ``group``: ours sticky and at margins 0, 2 and 4 with the GRPO group key (the prompt's index), and
    the margins 0 and 4 without it (sticky and margin 2 without it are ``ours_sticky``, ``ours_margin2``)."""
    ours = {"max_sessions": entries, "idle_ttl": None}
    margins = {"sticky": None, "margin0": 0, "margin2": 2, "margin4": 4}
    arms = [Arm(f"ours_margin{m}", "affinity", {"margin": m, **ours}) for m in (0, 4)]
    arms += [Arm(f"ours_{name}_group", "affinity", {"margin": m, **ours}, group=True) for name, m in margins.items()]
    return {a.label: a for a in arms}


def every_arm(entries: int) -> dict[str, Arm]:
    """Every arm a verl grid may name."""
    return {**verl_arms(entries), **group_arms(entries), **candidate_arms(entries)}


ARMS = tuple(verl_arms(1))  # every arm, in the tables' order
# the compare grid's arms (as committed before its run: margins 3, 6, 8 and the peers came with the study grid)
ALL = (BASELINE, "verl_margin0", "verl_margin1", "verl_margin2", "verl_margin4", "verl_sticky_random",
       "verl_margin2_random", "ours_sticky", "ours_margin2", "least_loaded", "cost_affinity")
GROUP_ARMS = tuple(group_arms(1))
ORDER = tuple(every_arm(1))  # a block's arms run in this order: the verl arms (ARMS), the group arms, the candidates
FEW = (BASELINE, "verl_margin0", "verl_margin2", "ours_margin2", "least_loaded")
GROUP = (BASELINE, "ours_sticky", "ours_margin2", "least_loaded", *GROUP_ARMS)
FEW_MARGINS = (BASELINE, "verl_margin0", "verl_margin2", "verl_margin4", "least_loaded")
# the study grid's arms at every point: sticky, every margin, no affinity, cost_affinity as shipped, the peers
STUDY = (BASELINE, *(f"verl_margin{m}" for m in MARGINS), "least_loaded", "cost_affinity", *PEERS)
# the seed study's arms: verl's sticky balancer (the baseline) and its random tie-break (verl #7613), the margins
# the advice names, no affinity, and the candidate rules
SEED = (BASELINE, "verl_sticky_random", "verl_margin0", "verl_margin2", "verl_margin8", "least_loaded",
        *CANDIDATES)


def build(arm: Arm):
    """A fresh policy for ``arm`` (verl's balancer lives in the simulator, the rest in the router's registry)."""
    return VerlBalancer(**arm.options) if arm.policy == "verl" else arm.build()


@dataclasses.dataclass(frozen=True)
class VPoint:
    preset: str  # a VERL_PRESETS key
    fleet: str  # a FLEETS key
    out: float  # per-turn output median, tokens
    tool_p: float  # chance a turn ends in a tool call
    latency: float = 0.0  # tool seconds
    replicas: int = 4
    batch: int | None = None  # prompts per step on the recipe's fleet (the PR's is not published); None: the recipe's
    sigma: float = 1.0  # the spread of a turn's output (log-normal sigma)
    tool_tokens: int | None = None  # tokens a tool result appends; None: verl's cap (``TOOL_RESULT_TOKENS``)
    max_turns: int | None = None  # max_assistant_turns; None: the preset's
    tool_slots: int | None = None  # the sandbox's concurrent calls, fleet-wide; None: no bound

    @property
    def label(self) -> str:
        extra = "".join(f" {name}={value:g}" for name, value, default in (
            ("B", self.batch, None), ("sigma", self.sigma, 1.0), ("tool", self.tool_tokens, None),
            ("turns", self.max_turns, None), ("slots", self.tool_slots, None)) if value != default)
        return (f"{self.preset} {self.fleet} out={self.out:g} p={self.tool_p:g} lat={self.latency:g} "
                f"R={self.replicas}{extra}")

    def verl_preset(self) -> VerlPreset:
        model, tp, util = FLEETS[self.fleet]
        base = VERL_PRESETS[self.preset]
        if self.batch is not None:
            base = dataclasses.replace(base, prompts=self.batch)
        cost = QWEN7B if model == "qwen2.5-7b" else QWEN32B
        p = dataclasses.replace(base, model=model, kv_tokens=pool(cost, tp, util), turn_out_median=self.out,
                                tool_call_p=self.tool_p, tool_latency=self.latency, turn_out_sigma=self.sigma,
                                tool_slots=self.tool_slots)
        if self.tool_tokens is not None:
            p = dataclasses.replace(p, tool_tokens=self.tool_tokens)
        if self.max_turns is not None:
            p = dataclasses.replace(p, max_assistant_turns=self.max_turns)
        return p.scaled(self.replicas) if self.replicas != base.replicas else p


@dataclasses.dataclass(frozen=True)
class VBlock:
    name: str
    presets: tuple[str, ...]
    fleets: tuple[str, ...]
    outs: tuple[float, ...]
    tool_ps: tuple[float, ...] = (0.75,)
    latencies: tuple[float, ...] = (0.0,)
    replicas: int = 4
    arms: tuple[str, ...] = ALL
    batches: tuple[int | None, ...] = (None,)
    listed: tuple[VPoint, ...] = ()  # points named one by one (a fractional design), instead of the product

    def points(self) -> Iterable[VPoint]:
        if self.listed:
            yield from self.listed
            return
        for pr, fl, o, p, lat, b in itertools.product(self.presets, self.fleets, self.outs, self.tool_ps,
                                                       self.latencies, self.batches):
            yield VPoint(pr, fl, o, p, lat, self.replicas, b)


TOOL = "one-step-off-dapo-7b-tool"
SEED_POINT = VPoint(TOOL, "32b-tp4-0.8", 1024, 0.9, 0.0, 16, 512)  # the seed's fleet; 512 trajectories per replica
SEED_UTILS = {"32b-tp4-0.5": 0, "32b-tp4-0.8": 1, "32b-tp4-0.9": 2}  # gpu_memory_utilization 0.5 / 0.8 / 0.9
SEED_LOADS = {256: 0, 512: 1, 1536: 2}  # trajectories per replica
SEED_LATENCIES = {0.0: 0, 1.0: 1, 5.0: 2}  # tool seconds, in the recipe's sandbox (TOOL_SLOTS at once)


def _seed(point: VPoint = SEED_POINT, **change: Any) -> VPoint:
    moved = dataclasses.replace(point, **change)
    return dataclasses.replace(moved, tool_slots=TOOL_SLOTS if moved.latency else None)


def _seed_blocks() -> tuple[VBlock, ...]:
    """The seed study's points, in the order they run (the cheapest and the headline's caveats first):

    - ``seed``: the seed's point and the points that test the advice's caveats: 256 trajectories per replica,
      5 s tools (in the recipe's sandbox), the smaller-model fleet (Qwen2.5-7B, TP 4 / 0.8: not the PR's) with and
      without 5 s tools;
    - ``one-at-a-time``: from the seed's point, one unknown changed: tool-result tokens 32 and 128 (the cap, 288,
      is the default), the turn-length spread sigma 0.5 (1.0 the default), max_assistant_turns 8 and 16 (none
      the default);
    - ``scale``: the seed's point at 4 and 32 replicas (the same load per replica);
    - ``fleet``: a fractional design of the three fleet axes, gpu_memory_utilization (0.5 / 0.8 / 0.9) x
      trajectories per replica (256 / 512 / 1,536) x tool latency (0 / 1 / 5 s): the 9 of 27 combinations whose
      level indices sum to a multiple of 3 (a Latin square: every pair of levels of two axes once), the
      1,536-per-replica points last (the dearest: ``benchmarks/sim_cost.py``).
    """
    caveats = (SEED_POINT, _seed(batch=256), _seed(latency=5.0), _seed(fleet="7b-tp4-0.8"),
               _seed(fleet="7b-tp4-0.8", latency=5.0))
    one_at_a_time = (_seed(tool_tokens=32), _seed(tool_tokens=128), _seed(sigma=0.5), _seed(max_turns=8),
                     _seed(max_turns=16))
    scale = (_seed(replicas=4), _seed(replicas=32))
    square = [_seed(fleet=f, batch=b, latency=lat) for f, b, lat in itertools.product(SEED_UTILS, SEED_LOADS,
                                                                                       SEED_LATENCIES)
              if (SEED_UTILS[f] + SEED_LOADS[b] + SEED_LATENCIES[lat]) % 3 == 0]
    square.sort(key=lambda p: p.batch or 0)
    return (VBlock("seed", (), (), (), listed=caveats, arms=SEED),
            VBlock("one-at-a-time", (), (), (), listed=one_at_a_time, arms=SEED),
            VBlock("scale", (), (), (), listed=scale, arms=SEED),
            VBlock("fleet", (), (), (), listed=tuple(square), arms=SEED))


VERL_GRIDS: dict[str, dict[str, Any]] = {
    # the comparison with the seed's four published rows (docs/simulator.md): the PR's 16-replica trainer
    # under tool_agent, 4 replicas simulated at its per-replica load
    "compare": {"seeds": 3, "blocks": (
        VBlock("pr", (TOOL,), ("7b-tp4-0.8", "32b-tp4-0.8"), (256, 1024, 4096), (0.5, 0.9), arms=FEW_MARGINS),
        VBlock("all-arms", (TOOL,), ("7b-tp4-0.8",), (1024,), (0.9,)),
        VBlock("verl-defaults", (TOOL,), ("7b-tp2-0.5",), (1024,), (0.9,), arms=FEW_MARGINS),
        VBlock("latency", (TOOL,), ("7b-tp4-0.8",), (1024,), (0.9,), (5.0,), arms=FEW_MARGINS),
        VBlock("single-turn", ("one-step-off-dapo-7b",), ("7b-tp4-0.8",), (4096,), arms=FEW),
        VBlock("single-turn-32b", ("dapo-32b",), ("32b-tp4-0.8",), (4096,), arms=FEW),
        VBlock("retool", ("retool-32b",), ("32b-tp4-0.9",), (1024,), (0.75,), arms=FEW),
    )},
    # issue 19 point 4, the study (committed before it was run): every arm of STUDY at every point. The pr block
    # as in compare; verl's defaults; 5 s tool calls; both single-turn recipes; ReTool 32B; the PR's batch as an
    # axis at one point (1,536 x 16 beside 512 x 16: the fleet-wide map then overflows). Cut once for the
    # machine's load (a load average of 8 on 2 cores; 4 points had run, no result read), by cost alone: the
    # 16-replica point, 5 s tools at 32B, the 7B 256/p=0.9 point (10 turns: the dearest of the pr block), 32B at
    # out=256 and at 1024/p=0.5; the batch axis moved from 1024/p=0.9 to 4096/p=0.5 (a third of the cost)
    "study": {"seeds": 3, "blocks": (
        VBlock("pr", (TOOL,), ("7b-tp4-0.8",), (1024, 4096), (0.5, 0.9), arms=STUDY),
        VBlock("pr-short", (TOOL,), ("7b-tp4-0.8",), (256,), (0.5,), arms=STUDY),
        VBlock("pr-32b", (TOOL,), ("32b-tp4-0.8",), (1024, 4096), (0.9,), arms=STUDY),
        VBlock("pr-32b-p0.5", (TOOL,), ("32b-tp4-0.8",), (4096,), (0.5,), arms=STUDY),
        VBlock("verl-defaults", (TOOL,), ("7b-tp2-0.5",), (1024,), (0.9,), arms=STUDY),
        VBlock("latency", (TOOL,), ("7b-tp4-0.8",), (1024,), (0.9,), (5.0,), arms=STUDY),
        VBlock("single-turn", ("one-step-off-dapo-7b",), ("7b-tp4-0.8",), (4096,), arms=STUDY),
        VBlock("single-turn-32b", ("dapo-32b",), ("32b-tp4-0.8",), (4096,), arms=STUDY),
        VBlock("retool", ("retool-32b",), ("32b-tp4-0.9",), (1024,), (0.75,), arms=STUDY),
        VBlock("batch", (TOOL,), ("7b-tp4-0.8",), (4096,), (0.5,), batches=(1536,), arms=STUDY),
    )},
    # GRPO siblings placed together (docs/simulator.md, "GRPO siblings placed together"): ours with and without
    # the group key, sticky and at margins, on the single-turn and tool_agent recipes (ReTool-32B left out: its
    # KV-thrashing steps take minutes each to simulate here)
    "group": {"seeds": 5, "blocks": (
        VBlock("group-single-turn", ("one-step-off-dapo-7b",), ("7b-tp4-0.8",), (1024, 4096), arms=GROUP),
        VBlock("group-single-turn-32b", ("dapo-32b",), ("32b-tp4-0.8",), (4096,), arms=GROUP),
        VBlock("group-tool", (TOOL,), ("7b-tp4-0.8",), (256, 1024), (0.75,), arms=GROUP),
        VBlock("group-r16", ("one-step-off-dapo-7b",), ("7b-tp4-0.8",), (4096,), replicas=16, arms=GROUP),
    )},
    # The study at the seed's scale (committed before its run; docs/simulator.md, "The study at the seed's scale"):
    # the seed's fleet (Qwen2.5-32B, TP 4, 16 replicas, out 1,024, p 0.9), ten paired steps, the SEED arms.
    "seed": {"seeds": 10, "blocks": _seed_blocks()},
    "quick": {"seeds": 3, "blocks": (
        VBlock("pr", (TOOL,), ("7b-tp4-0.8",), (256,), (0.75,), replicas=2, arms=FEW),
    )},
}


# How a candidate rule is chosen (committed with the seed grid, before its run): on the points at even positions
# of the grid's order (``seed_halves``), the candidate with the lowest mean of its per-point median changes against
# verl's sticky balancer among those whose median change is at most +1% at every one of them; it is confirmed, or
# not, on the points at odd positions, against the mark the study aims at: at least 10% faster where the seed
# measured its gains (the seed's point and its long-context variants), never more than 1% slower anywhere.
WORST_ALLOWED = 0.01


def seed_halves(points: Iterable[VPoint]) -> tuple[list[VPoint], list[VPoint]]:
    """(the points that choose, the points held out), alternating in the grid's order."""
    ordered = list(points)
    return ordered[0::2], ordered[1::2]


def choose(changes: dict[str, list[float]]) -> str | None:
    """The candidate chosen from its per-point median changes on the choosing half (``seed_halves``), or None."""
    allowed = {arm: v for arm, v in changes.items() if v and max(v) <= WORST_ALLOWED}
    return min(allowed, key=lambda arm: sum(allowed[arm]) / len(allowed[arm])) if allowed else None


def plan(blocks: Iterable[VBlock]) -> dict[VPoint, tuple[str, ...]]:
    out: dict[VPoint, set[str]] = {}
    for b in blocks:
        for p in b.points():
            out.setdefault(p, {BASELINE}).update(b.arms)
    return {p: tuple(a for a in ORDER if a in arms) for p, arms in out.items()}


Task = tuple[VPoint, str, int, int]  # point, arm, step, seed


def run_task(task: Task) -> dict[str, Any]:
    """One arm on one step of one point."""
    point, label, step, seed = task
    vp = point.verl_preset()
    arm = every_arm(vp.sticky_entries)[label]
    trajs = generate_verl(vp, seed, step)
    ctx = sum(t.contexts()[-1] + t.outs[-1] for t in trajs) / len(trajs)
    turns = sum(len(t.outs) for t in trajs) / len(trajs)
    res = run_step(vp.engine_preset(), trajs, arm, vp.cost, policy=build(arm))
    return {"step_seconds": res.step_seconds, "hit_rate": res.hit_rate, "preemptions": float(res.preemptions),
            "skew": res.skew, "moved_share": res.moved / max(1, res.requests - len(trajs)),
            "evicted_lru": float(res.outcomes.get("evicted_lru", 0)), "context": ctx, "turns": turns}


def describe(task: Task) -> dict[str, Any]:
    """What a result depends on besides the model's code (the cache key)."""
    point, label, step, seed = task
    vp = dataclasses.asdict(point.verl_preset())
    vp.pop("name")
    arm = every_arm(vp["sticky_entries"])[label].described()
    return {"verl_preset": vp, "arm": arm, "step": step, "seed": seed}


def run_verl_grid(name: str, seeds: int | None = None, seed: int = 0, jobs: int = 1, progress: bool = True,
                  cache: str | None = None) -> dict[str, Any]:
    """Run verl grid ``name``; with ``cache`` finished steps are kept and reused (``sim.cache``)."""
    from .cache import ResultCache
    from .parallel import run_tasks

    spec = VERL_GRIDS[name]
    n = seeds if seeds is not None else spec["seeds"]
    points = plan(spec["blocks"])
    tasks = [(p, a, s, seed) for p, arms in points.items() for a in arms for s in range(n)]
    store = ResultCache(cache) if cache else None
    results: list[dict | None] = [store.get(describe(t)) if store else None for t in tasks]
    todo = [i for i, r in enumerate(results) if r is None]

    def save(j: int, result: dict) -> None:
        results[todo[j]] = result
        if store:
            store.put(describe(tasks[todo[j]]), result)

    run_tasks(run_task, [tasks[i] for i in todo], jobs=jobs, progress=progress, desc=f"verl grid {name}",
              on_result=save)
    by_point: dict[VPoint, dict[tuple[str, int], dict]] = {}
    for (point, label, step, _), res in zip(tasks, results):
        assert res is not None
        by_point.setdefault(point, {})[(label, step)] = res
    return {"verl_grid": name, "seeds": n, "seed": seed,
            "blocks": {b.name: [p.label for p in b.points()] for b in spec["blocks"]},
            "points": [summarize_point(p, arms, by_point[p], n) for p, arms in points.items()]}


def summarize_point(point: VPoint, arms: tuple[str, ...], res: dict, seeds: int) -> dict[str, Any]:
    base = [res[(BASELINE, s)]["step_seconds"] for s in range(seeds)]
    policies = {}
    for label in arms:
        rows = [res[(label, s)] for s in range(seeds)]
        times = [r["step_seconds"] for r in rows]
        policies[label] = {"step_seconds": times, "change": summarize(times, base),
                           **{k: sum(r[k] for r in rows) / seeds
                              for k in ("hit_rate", "preemptions", "skew", "moved_share", "evicted_lru")}}
    first = res[(BASELINE, 0)]
    return {**dataclasses.asdict(point), "label": point.label, "kv_tokens": point.verl_preset().kv_tokens,
            "context": first["context"], "turns": first["turns"], "policies": policies}
