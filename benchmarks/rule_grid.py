"""Candidate rules against sticky, margins 0-8, least-loaded and the peer policies on a grid subset.

Issue 13 part 3: find a rule a router can run that is never worse than the best of
{sticky, margin 0-8, least-loaded} by more than 1% at any point and beats every peer
policy on most points. Prints, per point, every arm's median paired change of the
step time against sticky (common random numbers: step s replays the same
trajectories under every arm), then the criterion for each candidate.

    nice -n 10 .venv/bin/python benchmarks/rule_grid.py --jobs 2 --seeds 3 --json-out out/rule-grid.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

from rollout_router.sim.cost import CostModel
from rollout_router.sim.engine import Arm, run_step
from rollout_router.sim.grid import Point
from rollout_router.sim.parallel import run_tasks
from rollout_router.sim.workload import OUT_MEDIAN, generate

BASE = ("sticky", "margin0", "margin2", "margin4", "margin8", "least_loaded")
PEERS = ("cache_aware", "consistent_hash", "power_of_two", "dual_threshold")


def arms(lru: int) -> dict[str, Arm]:
    """Every arm; options as in ``sim.runner``'s preset study for the peers."""
    s = {"max_sessions": lru}
    out = [Arm("sticky", "affinity", {"margin": None, **s})]
    out += [Arm(f"margin{m}", "affinity", {"margin": m, **s}) for m in (0, 2, 4, 8)]
    out += [
        Arm("least_loaded", "least_loaded"),
        Arm("cache_aware", "cache_aware", {"cache_threshold": 0.3, "balance_abs_threshold": 64,
                                           "balance_rel_threshold": 1.5}),
        Arm("consistent_hash", "consistent_hash", {"load_factor": 1.25, **s}),
        Arm("power_of_two", "power_of_two", {"seed": 0}),
        Arm("dual_threshold", "dual_threshold", {"abs_threshold": 4, "rel_threshold": 1.05, **s}),
        # candidates
        Arm("cost_rel1", "cost_affinity", {"margin": 2, "relative": 0.01, **s}),
        Arm("cost_rel2", "cost_affinity", {"margin": 2, "relative": 0.02, **s}),
        Arm("cost_ctx", "cost_affinity", {"margin": 2, "context_scale": 2048, **s}),
        Arm("cost_ctx_kv", "cost_affinity", {"margin": 2, "context_scale": 2048, "kv_high": 0.95, **s}),
        Arm("cost_rel1_kv", "cost_affinity", {"margin": 2, "relative": 0.01, "kv_high": 0.95, **s}),
        Arm("token_load", "affinity", {"margin": 32768, **s}, load="tokens"),
    ]
    return {a.label: a for a in out}


def points() -> list[Point]:
    """A medium subset of the full grid: every context, a tight and the physical pool, two concurrencies,
    and the recipe's concurrency at ctx2k (where moving costs most)."""
    pts = [Point(c, kv, n) for c in ("ctx2k", "ctx9k", "ctx20k") for kv in ("x0.25", "x1") for n in (48, 192)]
    return pts + [Point("ctx2k", "x1", 768)]


def run(task: tuple[Point, str, int]) -> float:
    point, label, step = task
    preset = point.preset()
    return run_step(preset, generate(preset, 0, step), arms(preset.router_lru)[label], CostModel()).step_seconds


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--json-out")
    ap.add_argument("--only", nargs="*", help="arm labels (default: all)")
    args = ap.parse_args()
    labels = args.only or list(arms(1))
    labels = list(dict.fromkeys(["sticky", *labels]))
    pts = points()
    tasks = [(p, a, s) for p in pts for a in labels for s in range(args.seeds)]
    tasks.sort(key=lambda t: -t[0].conc * OUT_MEDIAN[t[0].ctx])
    secs = run_tasks(run, tasks, jobs=args.jobs, desc="rule grid")
    times = {(p.label, a, s): x for (p, a, s), x in zip(tasks, secs)}
    table = {}
    for p in pts:
        base = [times[(p.label, "sticky", s)] for s in range(args.seeds)]
        table[p.label] = {a: statistics.median(times[(p.label, a, s)] / b - 1 for s, b in enumerate(base))
                          for a in labels}
    report(table, labels)
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"seeds": args.seeds, "median_change_vs_sticky": table,
                       "step_seconds": {f"{k[0]}|{k[1]}|{k[2]}": v for k, v in times.items()}}, f, indent=1)
    return 0


def report(table: dict[str, dict[str, float]], labels: list[str]) -> None:
    print("point | " + " | ".join(labels))
    for pt, row in table.items():
        print(pt + " | " + " | ".join(f"{row[a]:+.1%}" for a in labels))
    base = [a for a in labels if a in BASE]
    peers = [a for a in labels if a in PEERS]
    for cand in (a for a in labels if a not in BASE and a not in PEERS):
        worst = max((1 + row[cand]) / (1 + min(row[b] for b in base)) - 1 for row in table.values())
        beats = sum(all(row[cand] < row[p] for p in peers) for row in table.values())
        print(f"{cand}: worst excess over best baseline {worst:+.2%}; beats every peer at {beats}/{len(table)} points")


if __name__ == "__main__":
    sys.exit(main())
