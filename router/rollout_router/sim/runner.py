"""The study: every arm on the same steps of every preset, run in parallel, then paired.

Work items are (preset, step, arm); a worker regenerates the step's
trajectories from (seed, step), so all arms see identical work (common random
numbers) and the order or number of workers never changes a result.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from .bounds import lower_bound
from .cost import CostModel
from .engine import Arm, run_step
from .parallel import run_tasks
from .stats import summarize
from .workload import PRESETS, Preset, generate

BASELINE = "sticky"


def arms_for(preset: Preset, margins: tuple[float, ...] = ()) -> list[Arm]:
    """Every policy under test, and our rule at each of ``margins`` it does not already run (``ours_marginN``);
    affinity-style arms share verl's sticky-map size."""
    lru = {"max_sessions": preset.router_lru}
    arms = [
        Arm("round_robin", "round_robin"),
        Arm("least_loaded", "least_loaded"),
        Arm("sticky", "affinity", {"margin": None, **lru}),
        Arm("dual_threshold_abs4", "dual_threshold", {"abs_threshold": 4, "rel_threshold": 1.05, **lru}),
        Arm("dual_threshold_abs8", "dual_threshold", {"abs_threshold": 8, "rel_threshold": 1.05, **lru}),
        Arm("cache_aware", "cache_aware", {"cache_threshold": 0.3, "balance_abs_threshold": 64, "balance_rel_threshold": 1.5}),
        Arm("consistent_hash_c1.25", "consistent_hash", {"load_factor": 1.25, **lru}),
        Arm("power_of_two", "power_of_two", {"seed": 0}),
        Arm("ours_margin0", "affinity", {"margin": 0, **lru}),
        Arm("ours_margin1", "affinity", {"margin": 1, **lru}),
        Arm("ours_margin2", "affinity", {"margin": 2, **lru}),
        Arm("ours_margin4", "affinity", {"margin": 4, **lru}),
        # beyond the published rule (docs/simulator.md)
        Arm("cand_token_load", "affinity", {"margin": 32768, **lru}, load="tokens"),
        Arm("cand_context_margin", "affinity_adaptive", {"margin": 2, "context_scale": 256, **lru}),
        Arm("cand_cooldown", "affinity_adaptive", {"margin": 2, "cooldown": 30.0, **lru}),
        Arm("cost_affinity", "cost_affinity", {**lru}),  # its defaults: margin 2, relative 0.01, 40 s
    ]
    labels = {a.label for a in arms}
    return arms + [Arm(f"ours_margin{m}", "affinity", {"margin": m, **lru}) for m in margins
                   if f"ours_margin{m}" not in labels]


@dataclasses.dataclass(frozen=True)
class Config:
    presets: tuple[Preset, ...]
    steps: dict[str, int]
    seed: int = 0
    cost: CostModel = CostModel()
    arm_filter: tuple[str, ...] = ()
    margins: tuple[float, ...] = ()  # our rule's margins run beside the fixed arms (--margins)
    trace_arms: tuple[str, ...] = ("sticky", "ours_margin2")


def _task(args: tuple) -> tuple:
    preset, step, arm, seed, cost, record = args
    trajs = generate(preset, seed, step)
    res = run_step(preset, trajs, arm, cost, record=record)
    moved_share = res.moved / max(1, res.requests - len(trajs))
    summary = {
        "step_seconds": res.step_seconds, "hit_rate": res.hit_rate, "recomputed_tokens": res.recomputed_tokens,
        "prefill_tokens": res.prefill_tokens, "preemptions": res.preemptions, "skew": res.skew,
        "moved_share": moved_share, "outcomes": res.outcomes, "requests": res.requests,
    }
    return preset.name, step, arm.label, summary, res.load_trace


def _lb_task(args: tuple) -> tuple:
    preset, step, seed, cost = args
    trajs = generate(preset, seed, step)
    ctx = float(np.mean([t.contexts()[-1] + t.outs[-1] for t in trajs]))
    return preset.name, step, lower_bound(preset, trajs, cost), ctx


def run_study(cfg: Config, jobs: int = 1, progress: bool = True, ray_address: str | None = None) -> dict[str, Any]:
    tasks, lb_tasks = [], []
    for preset in cfg.presets:
        arms = [a for a in arms_for(preset, cfg.margins) if not cfg.arm_filter or a.label in cfg.arm_filter or a.label == BASELINE]
        for step in range(cfg.steps[preset.name]):
            lb_tasks.append((preset, step, cfg.seed, cfg.cost))
            for arm in arms:
                tasks.append((preset, step, arm, cfg.seed, cfg.cost, step == 0 and arm.label in cfg.trace_arms))
    tasks.sort(key=lambda t: -t[0].kv_tokens * t[0].prompts)  # long ones first for better packing
    results: dict[str, dict[str, dict[int, dict]]] = {}
    traces: dict[str, dict[str, list]] = {}
    bounds: dict[str, dict[int, dict]] = {}
    ctxs: dict[str, list[float]] = {}
    for name, step, lb, ctx in run_tasks(_lb_task, lb_tasks, jobs, ray_address, progress, "lower bounds"):
        bounds.setdefault(name, {})[step] = lb
        ctxs.setdefault(name, []).append(ctx)
    for name, step, label, summary, trace in run_tasks(_task, tasks, jobs, ray_address, progress):
        results.setdefault(name, {}).setdefault(label, {})[step] = summary
        if trace is not None:
            traces.setdefault(name, {})[label] = trace
    return aggregate(cfg, results, bounds, ctxs, traces)


def aggregate(cfg: Config, results, bounds, ctxs, traces) -> dict[str, Any]:
    out: dict[str, Any] = {"seed": cfg.seed, "cost_model": dataclasses.asdict(cfg.cost), "presets": {}}
    for preset in cfg.presets:
        per_arm = results.get(preset.name, {})
        steps = sorted(bounds[preset.name])
        lbs = [bounds[preset.name][s]["lb"] for s in steps]
        base = [per_arm[BASELINE][s]["step_seconds"] for s in steps]
        policies = {}
        for label, by_step in per_arm.items():
            times = [by_step[s]["step_seconds"] for s in steps]
            mean = lambda k: float(np.mean([by_step[s][k] for s in steps]))  # noqa: E731
            outcomes: dict[str, int] = {}
            for s in steps:
                for k, v in by_step[s]["outcomes"].items():
                    outcomes[k] = outcomes.get(k, 0) + v
            policies[label] = {
                "median_step_seconds": float(np.median(times)),
                "step_seconds": times,
                "prefix_hit_rate": mean("hit_rate"),
                "paired_change_vs_sticky": summarize(times, base),
                "recomputed_tokens_per_step": mean("recomputed_tokens"),
                "prefill_tokens_per_step": mean("prefill_tokens"),
                "preemptions_per_step": mean("preemptions"),
                "inflight_skew": mean("skew"),
                "moved_share": mean("moved_share"),
                "outcomes": outcomes,
                "median_gap_to_lb": float(np.median([t / lb - 1 for t, lb in zip(times, lbs)])),
            }
        out["presets"][preset.name] = {
            "preset": dataclasses.asdict(preset),
            "steps": len(steps),
            "mean_final_context": float(np.mean(ctxs[preset.name])),
            "lower_bound": {k: float(np.median([bounds[preset.name][s][k] for s in steps])) for k in ("lb_work", "lb_path", "lb")},
            "policies": policies,
            "load_traces": traces.get(preset.name, {}),
        }
    first = next(iter(out["presets"].values()), None)
    out["policies"] = first["policies"] if first else {}
    return out


def resolve_presets(names: list[str]) -> tuple[Preset, ...]:
    try:
        return tuple(PRESETS[n] for n in names)
    except KeyError as e:
        raise SystemExit(f"unknown preset {e.args[0]!r}; known: {', '.join(PRESETS)}") from None
